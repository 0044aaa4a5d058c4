"""Lab probe: where a training step's GPU time goes, stock torch beside the model on
batch-invariant blocks (the train step of benchmarks/bench_model.py), kernel by kernel.

    python3 dev/profile_train.py --shape qwen2-0.5b [--batch 8 --len 1024 --top 30]

Prints, for each of the two models, the step's total kernel time, a share by kind
(matrix product, attention, row reductions, elementwise/other) and the top kernels with
their call counts. torch.profiler, two profiled steps after two warm-up steps.
"""
import argparse
import os
import sys
import time
from collections import defaultdict

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_model import train_fn  # noqa: E402

from flash_attn_det.integrations.transformers import make_invariant  # noqa: E402
from flash_attn_det.parity import build_model  # noqa: E402


def kind(name):
    n = name.lower()
    if any(s in n for s in ("gemm", "cutlass", "sm90_xmma", "nvjet", "splitk", "cublas")):
        return "matrix product"
    if any(s in n for s in ("flash", "fmha", "attention", "dkdv", "dq_", "dsum", "fwd_", "combine",
                            "cudnn")):
        return "attention"
    if any(s in n for s in ("reduce", "rms", "row_", "xent", "softmax", "norm")):
        return "row reductions"
    return "elementwise/other"


def profile(fn, steps):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0.0, 0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            t = getattr(e, "device_time", None)
            if t is None:
                t = e.cuda_time
            per[e.name][0] += t / steps
            per[e.name][1] += 1
    return per


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="qwen2-0.5b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--only", choices=("stock", "invariant"), default=None)
    args = ap.parse_args()
    for label in [args.only] if args.only else ["stock", "invariant"]:
        model = build_model(args.shape, "cuda")
        if label == "stock":
            model.set_attn_implementation("sdpa")
        else:
            model = make_invariant(model)
        model.train()
        fn = train_fn(model, args.batch, args.len, label == "invariant")
        per = profile(fn, 2)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 3 * 1e6
        total = sum(t for t, _ in per.values())
        by_kind = defaultdict(float)
        for name, (t, _) in per.items():
            by_kind[kind(name)] += t
        print(f"\n## {args.shape} {label}: {total / 1e3:.2f} ms of kernels a step, "
              f"{wall / 1e3:.2f} ms wall ({args.batch}x{args.len} tokens)")
        for k, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
            print(f"  {k:18s} {t / 1e3:8.2f} ms")
        print(f"| us/step | calls/step | kernel |\n|---|---|---|")
        for name, (t, n) in sorted(per.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"| {t:.0f} | {n // 2} | {name[:150]} |")
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
