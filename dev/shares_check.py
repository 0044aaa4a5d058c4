# shares_check.py: Decode over several sequences, bit for bit against num_splits=1, each sequence alone and fp64, on batches that cut row blocks between CTAs. Verdict: tool; 0 of 11 on base and on every shares variant (benchmarks/results/2026-12-01_h200_decode_shares_transposed.md, section 1).
"""Decode over several sequences: the default schedule against the one-CTA walk (num_splits=1)
and against each sequence decoded alone, bit for bit, on batches whose lengths cut row blocks
between CTAs' shares (mixed lengths, a sequence with no key, odd batches, the share limit).

    python3 dev/shares_check.py        # prints one line a case, then "differ: N of M"
"""
import torch

import flash_attn_det as fad
from decode_checks import fp64_row

fad.set_deterministic_mode(True)
gen = torch.Generator(device="cuda").manual_seed(1)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def lens_of(B, lo, hi):
    return torch.randint(lo, hi + 1, (B,), device="cuda", dtype=torch.int32, generator=gen)


# (name, H, Hk, D, capacity, lengths)
cases = [
    ("b16_mix", 32, 8, 128, 32768, lens_of(16, 1024, 32768)),
    ("b8_mix", 32, 8, 128, 32768, lens_of(8, 1024, 32768)),
    ("b4_one_long", 32, 8, 128, 65536, torch.tensor([65536, 1000, 700, 3000], dtype=torch.int32)),
    ("b16_one_long", 32, 8, 128, 32768, torch.tensor([32768] + [2048] * 15, dtype=torch.int32)),
    ("b5_zero", 32, 8, 128, 9000, torch.tensor([9000, 0, 513, 1, 4097], dtype=torch.int32)),
    ("b3_d64", 16, 4, 64, 20000, lens_of(3, 1, 20000)),
    ("b6_d256", 8, 2, 256, 12000, lens_of(6, 1, 12000)),
    ("b7_mqa", 16, 1, 128, 40000, lens_of(7, 100, 40000)),
    ("b64_mix", 32, 8, 128, 8192, lens_of(64, 1, 8192)),
    ("b256_short", 32, 8, 128, 2048, lens_of(256, 1, 2048)),
    ("b2_long", 32, 8, 128, 131072, torch.tensor([131072, 70000], dtype=torch.int32)),
]
differ = 0
for name, H, Hk, D, cap, lens in cases:
    lens = lens.cuda()
    B = lens.numel()
    q = randn(B, 1, H, D)
    kc, vc = randn(B, cap, Hk, D), randn(B, cap, Hk, D)

    def run(**kw):
        # poison: the caching allocator hands the output memory that last held NaN
        torch.empty(q.numel() * 4 + B * H * 4, device="cuda").fill_(float("nan"))
        o, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                             return_softmax_lse=True, **kw)
        return o, lse

    o, lse = run()
    o1, lse1 = run(num_splits=1)
    bad = []
    if not (torch.equal(o, o1) and torch.equal(lse, lse1)):
        bad.append("vs num_splits=1")
    for b in range(B) if B <= 16 else (0, B // 2, B - 1):
        ob, lb = fad.flash_attn_with_kvcache(q[b:b + 1], kc[b:b + 1], vc[b:b + 1],
                                             cache_seqlens=lens[b:b + 1], causal=True,
                                             return_softmax_lse=True)
        if not (torch.equal(ob, o[b:b + 1]) and torch.equal(lb, lse[b:b + 1])):
            bad.append(f"seq {b} alone")
            break
    nonfinite = int((~torch.isfinite(o.float())).sum())
    if nonfinite:
        bad.append(f"{nonfinite} non-finite")
    # the float64 reference on one long and one short sequence
    for b in (int(lens.argmax()), int(lens.argmin())):
        n = int(lens[b])
        if n == 0:
            continue
        ref = fp64_row(q[b, 0], kc[b, :n], vc[b, :n])
        err = (o[b, 0].double() - ref).abs().max().item()
        if err > 2e-2:
            bad.append(f"seq {b} err {err:.3g}")
    differ += bool(bad)
    print(f"{name}: B {B} lens {lens.min().item()}-{lens.max().item()}: {'; '.join(bad) or 'same'}")
print(f"differ: {differ} of {len(cases)}")
