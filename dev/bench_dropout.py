#!/usr/bin/env python3
# bench_dropout.py: Dropout's cost against p = 0 and against SDPA flash with dropout. Verdict: p = 0.1 costs 1.11-1.26x in the forward, 1.12-1.31x in forward + backward (H100, ad673e3).
"""What dropout costs: forward and forward+backward of flash_attn_det with dropout_p 0 and 0.1
beside SDPA's flash backend (FA2's kernel, which has dropout) on the same inputs, same run,
alternating turns, median of CUDA-event times. bf16, causal and not. SDPA runs in both of its
layouts -- contiguous (B, H, L, D) and the transposed views of (B, L, H, D) tensors that models
pass -- and each SDPA column is the faster of the two.
    python3 dev/bench_dropout.py [--out FILE] [--fwd-only]"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_det as fad


def timed(fn, turns):
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(turns)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    return [a.elapsed_time(b) for a, b in ev]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--fwd-only", action="store_true", help="the forward pass alone")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    lines = [f"# {torch.cuda.get_device_name()}: ms, median of 10 alternating rounds x 5 calls",
             "| shape | causal | pass | det p=0 | det p=0.1 | sdpa-flash p=0 (faster layout) | sdpa-flash p=0.1 (faster layout) | speed-up at 0.1 (sdpa ms / det ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for B, L, H, D in ((4, 2048, 16, 64), (4, 2048, 16, 128), (2, 4096, 16, 128)):
        for causal in (False, True):
            q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            qt, kt, vt = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
            qv, kv, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
            g = torch.randn_like(q)
            gt = g.transpose(1, 2).contiguous()

            def det(p, bwd):
                o = fad.flash_attn_func(q, k, v, dropout_p=p, causal=causal)
                if bwd:
                    o.backward(g)

            def sdpa(p, bwd):  # contiguous (B, H, L, D)
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(qt, kt, vt, dropout_p=p, is_causal=causal)
                if bwd:
                    o.backward(gt)

            def sdpa_views(p, bwd):  # transposed views of (B, L, H, D), as models pass them
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    o = F.scaled_dot_product_attention(qv.transpose(1, 2), kv.transpose(1, 2),
                                                       vv.transpose(1, 2), dropout_p=p,
                                                       is_causal=causal)
                if bwd:
                    o.backward(g.transpose(1, 2))

            for bwd in (False,) if args.fwd_only else (False, True):
                fns = [lambda p=p, f=f: f(p, bwd) for f in (det, sdpa, sdpa_views) for p in (0.0, 0.1)]
                for f in fns:
                    f()
                res = [[] for _ in fns]
                for _ in range(10):
                    for i, f in enumerate(fns):
                        res[i] += [sum(timed(f, 5)) / 5]
                med = [statistics.median(r) for r in res]
                med = med[:2] + [min(med[2], med[4]), min(med[3], med[5])]  # SDPA: the faster layout
                lines.append(f"| B{B} L{L} H{H} D{D} | {causal} | {'fwd+bwd' if bwd else 'fwd'} | "
                             + " | ".join(f"{m:.3f}" for m in med) + f" | {med[3] / med[1]:.2f} |")
                print(lines[-1], flush=True)
    if args.out:
        open(args.out, "w").write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
