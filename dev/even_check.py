# even_check.py: Batched decode where the row blocks fill the SMs, bit for bit against num_splits=1, each sequence alone and its own repeats, near fp64, on even and not quite even lengths. Verdict: tool.
"""Batched decode calls whose row blocks fill the SMs or the wave (packed_schedule's even rows):
with even lengths one CTA a row block walks and folds a whole row and the other split CTAs and
the combine stand aside; with lengths just past even (the longest more than 1/16 above the mean)
the CTA per split runs. Either way each case's output and lse must equal num_splits=1's, each
sequence decoded alone, and the call's own repeats, bit for bit, and lie near float64. Cases: GQA
32/8 D128 at batch 16 and 32, D64, MQA (16 query heads a kv head), a 4-token chunk, softcap, a
paged cache, a sequence with no key.

    python3 dev/even_check.py        # prints one line a case, then "differ: N of M"
"""
import torch

import flash_attn_det as fad
from decode_checks import fp64_row, schedule_faults

fad.set_deterministic_mode(True)
gen = torch.Generator(device="cuda").manual_seed(3)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def full(B, n):
    return torch.full((B,), n, dtype=torch.int32)


# (name, Sq, H, Hk, D, capacity, lengths, kwargs, page)
cases = [
    ("b16_8k", 1, 32, 8, 128, 8192, full(16, 8192), {}, 0),
    ("b16_near_even", 1, 32, 8, 128, 8192, torch.tensor([8192, 7700] * 8, dtype=torch.int32), {}, 0),
    ("b16_past_even", 1, 32, 8, 128, 8192, torch.tensor([8192] * 15 + [2000], dtype=torch.int32), {}, 0),
    ("b16_one_empty", 1, 32, 8, 128, 4096, torch.tensor([4096] * 15 + [0], dtype=torch.int32), {}, 0),
    ("b32_5000", 1, 32, 8, 128, 5000, full(32, 5000), {}, 0),
    ("b32_d64", 1, 16, 4, 64, 6000, full(32, 6000), {}, 0),
    ("b128_mqa", 1, 16, 1, 128, 3000, full(128, 3000), {}, 0),
    ("b16_chunk4", 4, 32, 8, 128, 4096, full(16, 4096), {}, 0),
    ("b16_softcap", 1, 32, 8, 128, 6000, full(16, 6000), {"softcap": 30.0}, 0),
    ("b16_paged", 1, 32, 8, 128, 8192, full(16, 8000), {}, 256),
]
differ = 0
for name, Sq, H, Hk, D, cap, lens, kw, page in cases:
    lens = lens.cuda()
    B = lens.numel()
    q = randn(B, Sq, H, D)
    if page:
        per = cap // page
        kc, vc = randn(B * per, page, Hk, D), randn(B * per, page, Hk, D)
        table = torch.randperm(B * per, device="cuda", generator=gen).to(torch.int32).view(B, per)
        kw = dict(kw, block_table=table)
        dense_k = kc[table.long()].reshape(B, cap, Hk, D)
        dense_v = vc[table.long()].reshape(B, cap, Hk, D)
    else:
        kc, vc = randn(B, cap, Hk, D), randn(B, cap, Hk, D)
        dense_k, dense_v = kc, vc

    def run(b=None, **extra):
        # poison: the caching allocator hands the output memory that last held NaN
        torch.empty(q.numel() * 4 + B * Sq * H * 4, device="cuda").fill_(float("nan"))
        if b is None:
            return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                               return_softmax_lse=True, **kw, **extra)
        sel = dict(kw)
        if page:
            sel["block_table"] = kw["block_table"][b:b + 1]
            return fad.flash_attn_with_kvcache(q[b:b + 1], kc, vc, cache_seqlens=lens[b:b + 1], causal=True,
                                               return_softmax_lse=True, **sel)
        return fad.flash_attn_with_kvcache(q[b:b + 1], kc[b:b + 1], vc[b:b + 1], cache_seqlens=lens[b:b + 1],
                                           causal=True, return_softmax_lse=True, **sel)

    o, lse, bad = schedule_faults(run, 3)
    for b in (0, B // 2, B - 1):
        ob, lb = run(b)
        if not (torch.equal(ob, o[b:b + 1]) and torch.equal(lb, lse[b:b + 1])):
            bad.append(f"seq {b} alone")
            break
    b = int(lens.argmax())
    n = int(lens[b])
    ref = fp64_row(q[b, -1], dense_k[b, :n], dense_v[b, :n], kw.get("softcap", 0.0))
    err = (o[b, -1].double() - ref).abs().max().item()
    if err > 2e-2:
        bad.append(f"err {err:.3g}")
    empty = lens == 0
    if empty.any() and not torch.equal(o[empty].float(), torch.zeros_like(o[empty].float())):
        bad.append("a sequence with no key is not 0")
    elif (~torch.isfinite(o[~empty].float())).any():
        bad.append("non-finite")
    differ += bool(bad)
    print(f"{name}: {'; '.join(bad) or 'same'} (fp64 err {err:.2g})")
print(f"differ: {differ} of {len(cases)}")
