# decode_bits.py: Saves flash_attn_with_kvcache's out and lse on fixed inputs, or compares them bit for bit. Verdict: tool for changes that must keep every bit of decode.
"""Decode / chunked-prefill out and lse of fixed random inputs (deterministic mode), saved, or
compared bit for bit with a saved file:

    python3 dev/decode_bits.py /tmp/dec_ref.pt        # with the old build
    python3 dev/decode_bits.py /tmp/dec_ref.pt cmp    # with the new one: the cases that differ

Cases: GQA 32/8 D128 at B1 8k (whole tiles only), B1 40k (runs of splits a CTA) and B8 with ragged cache lengths (a cut tile at
every sequence's end), one-CTA and CTA-per-split schedules (num_splits), D 64 / 256, MQA, a
window, a softcap, a 4-token chunk, new keys appended, a cache entry map, and a paged cache."""
import torch

import flash_attn_det as fad
from bits_io import save_or_compare

fad.set_deterministic_mode(True)
gen = torch.Generator(device="cuda").manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


def ragged(B, hi):
    return torch.randint(1, hi, (B,), device="cuda", dtype=torch.int32, generator=gen)


out = {}
# (name, B, Sq, H, Hk, D, capacity, lengths or None (full), kwargs)
cases = [("b1_8k", 1, 1, 32, 8, 128, 8192, None, {}),
         ("b1_40k", 1, 1, 32, 8, 128, 40000, None, {}),  # split CTAs in runs, a polling combine
         ("b1_8k_one_cta", 1, 1, 32, 8, 128, 8192, None, {"num_splits": 1}),
         ("b8_ragged", 8, 1, 32, 8, 128, 8192, 8000, {}),
         ("b8_ragged_split", 8, 1, 32, 8, 128, 8192, 8000, {"num_splits": 64}),
         ("b16_d64", 16, 1, 16, 4, 64, 3000, 3000, {}),
         ("b4_d256", 4, 1, 8, 2, 256, 5000, 5000, {}),
         ("b4_mqa", 4, 1, 16, 1, 128, 4096, 4096, {}),
         ("b4_window", 4, 1, 32, 8, 128, 6000, 6000, {"window_size": (700, 0)}),
         ("b4_softcap", 4, 1, 32, 8, 128, 6000, 6000, {"softcap": 30.0}),
         ("b2_chunk4", 2, 4, 32, 8, 128, 5000, 5000, {})]
for name, B, Sq, H, Hk, D, cap, hi, kw in cases:
    q = randn(B, Sq, H, D)
    kc, vc = randn(B, cap, Hk, D), randn(B, cap, Hk, D)
    lens = ragged(B, hi) if hi else torch.full((B,), cap, device="cuda", dtype=torch.int32)
    o, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                         return_softmax_lse=True, **kw)
    out[name] = (o.cpu(), lse.cpu())
# new keys appended, a cache entry map
B, H, Hk, D, cap = 4, 32, 8, 128, 4096
q, k, v = randn(B, 1, H, D), randn(B, 1, Hk, D), randn(B, 1, Hk, D)
kc, vc = randn(B + 2, cap, Hk, D), randn(B + 2, cap, Hk, D)
idx = torch.tensor([5, 0, 3, 1], device="cuda", dtype=torch.int32)
o, lse = fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, cache_seqlens=ragged(B, cap - 1),
                                     cache_batch_idx=idx, causal=True, return_softmax_lse=True)
out["append_idx"] = (o.cpu(), lse.cpu(), kc.cpu(), vc.cpu())
# a paged cache (page 256)
pages, page = 64, 256
kp, vp = randn(pages, page, Hk, D), randn(pages, page, Hk, D)
table = torch.randperm(pages, device="cuda", generator=gen).to(torch.int32).view(B, pages // B)
o, lse = fad.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=ragged(B, pages // B * page),
                                     block_table=table, causal=True, return_softmax_lse=True)
out["paged"] = (o.cpu(), lse.cpu())


save_or_compare(out)
