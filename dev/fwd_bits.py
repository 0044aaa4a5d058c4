# fwd_bits.py: Saves the forward's out and lse on fixed inputs, or compares them bit for bit. Verdict: tool for changes that must keep every bit of the forward.
"""Forward out and lse of fixed random inputs (deterministic mode), saved, or compared bit for bit
with a saved file:

    python3 dev/fwd_bits.py /tmp/fwd_ref.pt        # with the old build
    python3 dev/fwd_bits.py /tmp/fwd_ref.pt cmp    # with the new one: the cases that differ in any bit

Cases: D 64 / 128 / 256, MHA and GQA, causal or not, a window, a softcap, padded and varlen
(many sequences of mixed lengths, up to 5000 and, at D128, up to 1000 keys), grids of more row blocks
than the GPU has SMs, D64, D128 and D256 at 512-1024 keys (where the kernel or its shape changes with the length),
three query heads a kv head, GQA at D64 and D256, dropout."""
import torch

import flash_attn_det as fad
from bits_io import save_or_compare

fad.set_deterministic_mode(True)
gen = torch.Generator(device="cuda").manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


out = {}
cases = [(4, 4096, 16, 16, 128, {}), (4, 4096, 16, 4, 128, {"causal": True}),
         (2, 2000, 8, 8, 128, {"causal": True, "window_size": (300, 0)}),
         (1, 17000, 8, 2, 128, {"causal": True}), (8, 1500, 16, 16, 128, {}),
         (4, 2048, 8, 8, 128, {"softcap": 20.0}), (32, 1024, 16, 16, 128, {"causal": True}),
         (2, 3000, 8, 8, 64, {"causal": True}), (2, 3000, 4, 4, 256, {}),
         (3, 1500, 8, 8, 256, {"causal": True}), (1, 9000, 4, 2, 256, {}),
         (16, 512, 16, 16, 128, {}), (8, 768, 16, 4, 128, {"causal": True}),
         (4, 1024, 8, 8, 128, {"window_size": (200, 100)}), (8, 1024, 16, 16, 64, {"causal": True}),
         (4, 1024, 8, 8, 256, {"causal": True}),
         (3, 1000, 12, 4, 128, {"causal": True}), (2, 2048, 8, 2, 64, {"causal": True}),
         (2, 1500, 8, 2, 256, {"causal": True}), (2, 1100, 8, 2, 128, {"dropout_p": 0.1, "causal": True}),
         (2, 1100, 8, 2, 64, {"dropout_p": 0.1})]
for (B, L, H, Hk, D, kw) in cases:
    q, k, v = randn(B, L, H, D), randn(B, L, Hk, D), randn(B, L, Hk, D)
    torch.cuda.manual_seed(1234)  # (dropout's seed, the same for every build)
    o, lse = fad.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2]
    out[(B, L, H, Hk, D, str(kw))] = (o.cpu(), lse.cpu())
for D, max_len in ((64, 5000), (128, 5000), (128, 1000)):
    lens = [int(x) for x in torch.randint(1, max_len, (40,), generator=torch.Generator().manual_seed(D))]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
    T = sum(lens)
    q, k, v = randn(T, 16, D), randn(T, 4, D), randn(T, 4, D)
    for causal in (False, True):
        o, lse = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                            return_attn_probs=True)[:2]
        out[("varlen", D, max_len, causal)] = (o.cpu(), lse.cpu())


save_or_compare(out)
