"""Backward benchmark: flash_attn_det's deterministic backward beside torch SDPA's.

Exact command (repository root, after `FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py
build_ext --inplace`):

    python3 benchmarks/bench_bwd.py --preset quick   # bf16, D64/128, L 2k/8k/16k (~2-3 min)
    python3 benchmarks/bench_bwd.py --preset gqa     # bf16, GQA 32/8 D128, L 2k/8k/16k
    python3 benchmarks/bench_bwd.py --preset d256    # bf16, D256 H8, L 1k/4k/8k

Protocol as bench_fwd.py (benchmarks/METHOD.md): fresh random inputs, the same
for every impl (SDPA also on contiguous (B, H, L, D) copies, its dout too; the ratios
are against a backend's faster layout); one forward per impl builds the autograd graph, then the impls take
--rounds turns (in reversed order every other round) of --warmup + --iters backward calls
(torch.autograd.grad with retain_graph, the same dout), timed one by one with CUDA events; the median of an
impl's calls is reported. TFLOP/s = 2.5 x the forward's 4*B*H*L^2*D (halved
for causal), FA2's convention for the backward's 5 matmuls, whatever an impl computes.
Writes <tag>.jsonl and <tag>.md under --out.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Config, log  # noqa: E402

IMPLS = ["fad_det", "fad_fast", "sdpa_flash", "sdpa_flash_bhld", "sdpa_cudnn", "sdpa_cudnn_bhld",
         "sdpa_efficient"]
BWD_FLOP_FACTOR = 2.5


def preset_configs(name):
    if name == "quick":
        out = []
        for D, H in ((64, 32), (128, 16)):
            for L in (2048, 8192, 16384):
                for causal in (False, True):
                    out.append(Config("bf16", max(1, 32768 // L), L, L, H, H, D, causal))
        return out
    if name == "gqa":  # GQA rows: 32 query heads on 8 kv heads, D128, quick's lengths
        return [Config("bf16", max(1, 32768 // L), L, L, 32, 8, 128, causal)
                for L in (2048, 8192, 16384) for causal in (False, True)]
    if name == "d256":  # head dim 256 (the wgmma kernels' column-split variants), H8, 32k tokens
        return [Config("bf16", max(1, 32768 // L), L, L, 8, 8, 256, causal)
                for L in (1024, 4096, 8192) for causal in (False, True)]
    if name == "dq":  # four rows of quick and one of gqa, for quick probes
        return [Config("bf16", 16, 2048, 2048, 32, 32, 64, False),
                Config("bf16", 4, 8192, 8192, 32, 32, 64, True),
                Config("bf16", 4, 8192, 8192, 16, 16, 128, False),
                Config("bf16", 4, 8192, 8192, 16, 16, 128, True),
                Config("bf16", 2, 16384, 16384, 32, 8, 128, True)]
    if name == "long":  # one long causal row: B2 L16k H16 D128
        return [Config("bf16", 2, 16384, 16384, 16, 16, 128, True)]
    if name == "cpu-smoke":
        return [Config("bf16", 1, 64, 64, 2, 2, 64, True)]
    raise ValueError(f"unknown preset {name!r}")


def prepare_bwd(impl, cfg, device, seed=0):
    """(record, fn): fn() runs impl's backward once (torch.autograd.grad with
    retain_graph, the same dout) after one forward that built the graph; fn is
    None when the impl failed (the record says why)."""
    rec = dict(impl=impl.name, **cfg.fields(), flops=BWD_FLOP_FACTOR * common.attn_flops(cfg))
    try:
        q, k, v = common.make_input_sets(cfg, device, n=1, seed=seed)[0]
        gen = torch.Generator(device=device)
        gen.manual_seed(seed + 1)
        dout = torch.randn(q.shape, generator=gen, device=device).to(q.dtype)
        if impl.prepare is not None:  # its own layout: inputs, output and dout contiguous
            q, k, v = impl.prepare(q, k, v)
            dout = dout.transpose(1, 2).contiguous()
        q, k, v = (t.requires_grad_(True) for t in (q, k, v))
        with impl.context():
            out = impl.call(q, k, v, cfg.causal)
            out = out if impl.prepare is not None else impl.to_bshd(out)
        return rec, lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
    except Exception as exc:
        rec["error"] = common.short_error(exc)
        return rec, None


def measure_bwd_rounds(impls, cfg, device, iters, warmup, rounds):
    """Records for every impl of cfg: the impls take `rounds` turns of `warmup`
    + `iters` timed backward calls each, one after the other, in common.turn_order
    (reversed every other round), and the median is over all of an impl's calls
    (bench_fwd's protocol: a drift of clocks during the config falls on every impl
    alike)."""
    preps = [prepare_bwd(impl, cfg, device) for impl in impls]
    times = [[] for _ in impls]
    for r in range(rounds):
        for n, impl, (rec, fn) in common.turn_order(zip(range(len(impls)), impls, preps), r):
            if fn is None or "error" in rec:
                continue
            try:
                with impl.context():
                    times[n] += common.time_ms(fn, [()], iters, warmup, device)
            except Exception as exc:
                rec["error"] = common.short_error(exc)
    records = []
    for (rec, _), ts in zip(preps, times):
        if "error" not in rec:
            rec.update(common.summarize_ms(ts), rounds=rounds)
            rec["tflops"] = rec["flops"] / (rec["ms"] * 1e-3) / 1e12
        records.append(rec)
    return records


def markdown(records, env):
    by_cfg = {}
    for r in records:
        by_cfg.setdefault((r["D"], r["L"], r["B"], r["H"], r["Hkv"], r["causal"]), {})[r["impl"]] = r
    impls = [i for i in IMPLS if any(i in v for v in by_cfg.values())]
    headers = ["D", "L", "B", "H", "Hkv", "causal"] + [f"{i} TFLOP/s" for i in impls] + \
        ["det / sdpa_flash", "det / cudnn", "det vs fast"]  # (a peer's faster layout: best_of)
    rows = []
    for (D, L, B, H, Hkv, causal), rs in sorted(by_cfg.items()):
        tf = {i: rs[i].get("tflops") for i in impls if i in rs}
        for peer in common.PEER_LAYOUTS:
            best = common.best_of(rs, peer)
            tf["best " + peer] = best["tflops"] if best else None
        ratio = lambda a, b: (f"{tf[a] / tf['best ' + b]:.2f}x"  # noqa: E731
                              if tf.get(a) and tf.get("best " + b) else "-")
        det_fast = (f"{rs['fad_det']['ms'] / rs['fad_fast']['ms'] - 1:+.1%}"
                    if tf.get("fad_det") and tf.get("fad_fast") else "-")
        rows.append([D, L, B, H, Hkv, causal] + [tf.get(i) if tf.get(i) else
                                            rs.get(i, {}).get("error", "-")[:40] for i in impls] +
                    [ratio("fad_det", "sdpa_flash"), ratio("fad_det", "sdpa_cudnn"), det_fast])
    return (f"# Backward, {env.get('device', '?')}, torch {env.get('torch', '?')}, "
            f"commit {env.get('git_commit', '?')}\n\n" + common.markdown_table(headers, rows) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="quick", choices=["quick", "gqa", "d256", "dq", "long", "cpu-smoke"])
    # (METHOD.md's 50 calls an impl, as bench_fwd.py: with 20, the H200's clock swinging at its
    # power limit moved one build's ratios by 3-6% between runs, more than the margins measured)
    ap.add_argument("--iters", type=int, default=10, help="timed calls per impl and round")
    ap.add_argument("--warmup", type=int, default=5, help="warm-up calls per impl and round")
    ap.add_argument("--rounds", type=int, default=5,
                    help="turns the impls of a config take, one after the other (default 5)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    ap.add_argument("--tag", default=None)
    ap.add_argument("--impls", default=",".join(IMPLS),
                    help="comma-separated subset of the impls (default: all)")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if args.preset != "cpu-smoke" else "cpu")
    env = common.env_info(device)
    tag = args.tag or f"bwd_{args.preset}_{common.timestamp()}"
    os.makedirs(args.out, exist_ok=True)
    writer = common.JsonlWriter(os.path.join(args.out, tag + ".jsonl"), {"env": env})
    impls = common.make_impls(names=[i for i in IMPLS if i in args.impls.split(",")])
    records = []
    configs = preset_configs(args.preset)
    for n, cfg in enumerate(configs):
        log(f"[{n + 1}/{len(configs)}] {cfg.label()}")
        for rec in measure_bwd_rounds(impls, cfg, device, args.iters, args.warmup, args.rounds):
            writer.write(rec)
            records.append(rec)
        torch.cuda.empty_cache() if device.type == "cuda" else None
    writer.close()
    md = markdown(records, env)
    with open(os.path.join(args.out, tag + ".md"), "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
