#!/usr/bin/env python3
"""Where dropout's cost goes: each CUDA kernel's time in one forward + backward of
flash_attn_det at dropout_p 0 and 0.1 (torch.profiler, summed over 10 steps after warm-up),
side by side, with the ratio. bf16, deterministic mode, the shapes of dev/bench_dropout.py.
The bench gives the totals; this names the kernel that holds the difference (the dQ pass, the
dK/dV pass, the forward), so the next change aims at it.
    python3 dev/prof_dropout.py [--out FILE]"""
import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

import flash_attn_det as fad

STEPS = 10


def kernel_times(step):
    """{kernel name: total CUDA us} over STEPS calls of step()."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            step()
        torch.cuda.synchronize()
    times = collections.Counter()
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            times[ev.name.split("(")[0][:70]] += ev.device_time
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    lines = [f"# {torch.cuda.get_device_name()}: us per fwd + bwd step (mean of {STEPS}), per kernel"]
    for B, L, H, D in ((4, 2048, 16, 64), (4, 2048, 16, 128), (2, 4096, 16, 128)):
        for causal in (False, True):
            q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16,
                                   requires_grad=True) for _ in range(3))
            g = torch.randn_like(q)

            def step(p):
                def run():
                    fad.flash_attn_func(q, k, v, dropout_p=p, causal=causal).backward(g)
                return run

            t0, t1 = kernel_times(step(0.0)), kernel_times(step(0.1))
            lines += ["", f"## B{B} L{L} H{H} D{D} causal={causal}",
                      "| kernel | p=0 | p=0.1 | ratio |", "|---|---|---|---|"]
            for name in sorted(set(t0) | set(t1), key=lambda n: -(t1[n] + t0[n])):
                a, b = t0[name] / STEPS, t1[name] / STEPS
                lines.append(f"| {name} | {a:.1f} | {b:.1f} | {b / a if a else float('nan'):.2f} |")
            a, b = sum(t0.values()) / STEPS, sum(t1.values()) / STEPS
            lines.append(f"| all | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    print("\n".join(lines))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
