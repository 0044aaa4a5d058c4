# bench_bwd_mod.py: The backward's softcap / ALiBi / D256 calls against the plain call. Verdict: measuring tool; it rejected the shared score-to-P element function (1.07-1.14x slower).
"""What the backward costs where it leaves the wgmma kernels (docs/performance.md): softcap and ALiBi
(the score-mod kernels) and head dim 256 run on mma.sync. Times the gradient call of
flash_attn_func (deterministic mode, bf16, causal) for each variant beside the plain call on the
same shape, in alternating turns, and prints ms and the ratio to plain:

    python3 dev/bench_bwd_mod.py [--out FILE.md]

Run it once as is and once with FLASH_ATTN_DET_WGMMA=0 (every call on mma.sync) to see what
the wgmma kernels bring the plain call.
"""
import argparse
import os
import statistics

import torch

import flash_attn_det as fad

SHAPES = [(4, 4096, 16, 64), (4, 4096, 16, 128), (2, 4096, 16, 256)]  # B, L, H, D
VARIANTS = {
    "plain": {},
    "softcap 30": {"softcap": 30.0},
    "alibi": {"alibi": True},
}


def grad_fn(B, L, H, D, kw):
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, L, H, D, generator=g, device="cuda").to(torch.bfloat16)
                     for _ in range(4))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    extra = dict(kw)
    if extra.pop("alibi", False):
        extra["alibi_slopes"] = torch.rand(H, device="cuda", dtype=torch.float32) * 0.1
    out = fad.flash_attn_func(q, k, v, causal=True, **extra)
    return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)


def timed(fn, iters=5):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(iters):
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    wg = os.environ.get("FLASH_ATTN_DET_WGMMA", "default")
    lines = [f"# {torch.cuda.get_device_name()}, FLASH_ATTN_DET_WGMMA={wg}: backward (gradient call) "
             f"ms, median of {args.rounds} alternating rounds x 5 calls, bf16, causal, deterministic",
             "| B | L | H | D | variant | ms | / plain |", "|---|---|---|---|---|---|---|"]
    for B, L, H, D in SHAPES:
        fns = {name: grad_fn(B, L, H, D, kw) for name, kw in VARIANTS.items()}
        for f in fns.values():
            f()
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, f in fns.items():
                times[name] += timed(f)
        med = {name: statistics.median(t) for name, t in times.items()}
        for name in fns:
            lines.append(f"| {B} | {L} | {H} | {D} | {name} | {med[name]:.3f} | {med[name] / med['plain']:.2f} |")
        del fns
        torch.cuda.empty_cache()
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
