#!/usr/bin/env python3
# prof_dropout.py: Each kernel's time at p = 0 and 0.1 in one forward + backward. Verdict: dropout's cost falls on every kernel, most on dK/dV.
"""Where dropout's cost goes: each CUDA kernel's time in one forward + backward of
flash_attn_det at dropout_p 0 and 0.1 (torch.profiler, mean per launch over 10 steps),
side by side, with the ratio. bf16, deterministic mode, the shapes of dev/bench_dropout.py.
The bench gives the totals; this names the kernel that holds the difference (the dQ pass, the
dK/dV pass, the forward), so the next change aims at it.
    python3 dev/prof_dropout.py [--out FILE]"""
import argparse
import os
import sys

import torch

import flash_attn_det as fad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_kernels import kernel_times  # noqa: E402 (dev/'s profiler helper: mean us per launch)

STEPS = 10


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    lines = [f"# {torch.cuda.get_device_name()}: us per launch (mean of {STEPS} fwd + bwd steps), per kernel"]
    for B, L, H, D in ((4, 2048, 16, 64), (4, 2048, 16, 128), (2, 4096, 16, 128)):
        for causal in (False, True):
            q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            g = torch.randn_like(q)

            def step(p):
                def run():
                    fad.flash_attn_func(q, k, v, dropout_p=p, causal=causal).backward(g)
                return run

            t0, t1 = (kernel_times(step(p), STEPS) for p in (0.0, 0.1))
            t0, t1 = ({n.split("(")[0]: t for n, t in d.items()} for d in (t0, t1))
            lines += ["", f"## B{B} L{L} H{H} D{D} causal={causal}",
                      "| kernel | p=0 | p=0.1 | ratio |", "|---|---|---|---|"]
            for name in sorted(set(t0) | set(t1), key=lambda n: -(t1.get(n, 0) + t0.get(n, 0))):
                a, b = t0.get(name, 0.0), t1.get(name, 0.0)
                lines.append(f"| {name} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f} |")
            a, b = sum(t0.values()), sum(t1.values())
            lines.append(f"| all | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
