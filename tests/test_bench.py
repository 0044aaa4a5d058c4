"""The benchmark harness's protocol, on the CPU path (the timings themselves are
meaningless here; what is checked is what the harness records and how)."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import bench_fwd  # noqa: E402
import common  # noqa: E402


def test_measure_rounds_interleaves_and_pools_every_call():
    """Each impl gets rounds turns of warm-up + iters calls, in turn order, and its
    median is over all rounds * iters calls; an impl that fails is recorded once and
    left out of later turns."""
    order = []

    def impl(name, fail=False):
        def call(q, k, v, causal):
            order.append(name)
            if fail:
                raise RuntimeError(f"{name} refuses")
            return q
        return common.Impl(name, call)

    cfg = common.Config("fp16", 1, 16, 16, 1, 1, 64, False)
    sets = common.make_input_sets(cfg, torch.device("cpu"), n=1)
    impls = [impl("a"), impl("b"), impl("broken", fail=True)]
    recs = common.measure_rounds(impls, cfg, sets, torch.device("cpu"), iters=3, warmup=2,
                                 rounds=4)
    a, b, broken = recs
    for rec in (a, b):
        assert rec["rounds"] == 4 and rec["iters"] == 12 and len(rec["_times"]) == 12
        assert rec["ms_min"] <= rec["ms"] and rec["tflops"] > 0
    assert "error" in broken and "refuses" in broken["error"]
    # the first turn also runs the probe call; each later turn is warm-up + iters, impl by
    # impl, in reversed order every other round (common.turn_order)
    first = ["a"] * (1 + 2 + 3) + ["b"] * (1 + 2 + 3) + ["broken"]
    a5, b5 = ["a"] * 5, ["b"] * 5
    assert order == first + b5 + a5 + a5 + b5 + b5 + a5


def test_bench_fwd_cpu_smoke_writes_records_and_table(tmp_path):
    assert bench_fwd.main(["--cpu-smoke", "--out", str(tmp_path), "--tag", "t",
                           "--no-plot", "--rounds", "2", "--iters", "2", "--warmup", "1"]) == 0
    recs = [json.loads(line) for line in open(tmp_path / "t.jsonl")]
    fad = [r for r in recs if r["impl"] in ("fad_det", "fad_fast")]
    assert fad and all(r["iters"] == 4 and r["rounds"] == 2 and r["tflops"] > 0 for r in fad)
    assert not any(k.startswith("_") for r in recs for k in r)  # raw times stay out of the JSONL
    assert all(r["max_abs_diff"] == 0 for r in recs if r["impl"] == "fad_fast")  # det = fast here
    table = open(tmp_path / "t.md").read()
    assert "det vs fast" in table and "(2 rounds)" in table
