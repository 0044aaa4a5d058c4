# grads_bits.py: Saves the backward's gradients on fixed inputs, or compares them bit for bit. Verdict: tool for changes that must keep every bit (it passed the dsum rewrite, and 24 cases with the persistent dK/dV grid, before it landed in 87707ff and after c16ed00's staging change).
"""Backward gradients of fixed random inputs, saved, or compared bit for bit with a saved file:

    python3 dev/grads_bits.py /tmp/ref.pt        # with the old build
    python3 dev/grads_bits.py /tmp/ref.pt cmp    # with the new one: how many cases differ in any bit

A check for changes that must leave every gradient as it was (such as a rewrite of the dsum kernel)."""
import sys
import torch
import flash_attn_det as fad

fad.set_deterministic_mode(True)
torch.manual_seed(0)
out = {}
cases = [(2, 1000, 16, 16, 64, False), (2, 777, 8, 2, 128, True), (1, 1300, 4, 4, 256, False),
         (3, 513, 6, 3, 40, True), (2, 900, 4, 4, 200, True), (2, 640, 8, 8, 96, False)]
for (B, L, H, Hk, D, causal) in cases:
    q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, L, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, L, Hk, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    fad.flash_attn_func(q, k, v, causal=causal).backward(g)
    out[(B, L, H, Hk, D, causal)] = [t.grad.clone().cpu() for t in (q, k, v)]
    # varlen, same inputs flattened, two sequences of different lengths
    cu = torch.tensor([0, L // 3, B * L], dtype=torch.int32, device="cuda")
    qv, kv, vv = (t.detach().reshape(B * L, t.shape[2], D).clone().requires_grad_() for t in (q, k, v))
    fad.flash_attn_varlen_func(qv, kv, vv, cu, cu, B * L - L // 3, B * L - L // 3, causal=causal).backward(
        g.reshape(B * L, H, D))
    out[("varlen", B, L, H, Hk, D, causal)] = [t.grad.clone().cpu() for t in (qv, kv, vv)]
# Grids of many more key blocks than SMs (the five-product kernel's items), and its variants:
# dropout, softcap, ALiBi, a window, fp16, a dK/dV-only and a dQ-only call.
big = [(8, 2048, 16, 16, 128, True, {}), (4, 4096, 16, 16, 64, False, {}), (4, 2048, 32, 8, 128, False, {}),
       (4, 2048, 32, 8, 64, True, {}), (4, 2048, 16, 16, 128, True, {"dropout_p": 0.1}),
       (4, 2048, 16, 16, 64, False, {"dropout_p": 0.1}), (4, 2048, 16, 16, 128, True, {"softcap": 30.0}),
       (4, 2048, 16, 4, 64, False, {"alibi": True}), (4, 2048, 16, 16, 128, False, {"window_size": (300, 100)}),
       (4, 2048, 16, 16, 128, True, {"dtype": torch.float16})]
for i, (B, L, H, Hk, D, causal, kw) in enumerate(big):
    kw = dict(kw)
    dtype = kw.pop("dtype", torch.bfloat16)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = torch.rand(H, device="cuda", dtype=torch.float32) * 0.3
    q, k, v = (torch.randn(B, L, h, D, device="cuda", dtype=dtype, requires_grad=True) for h in (H, Hk, Hk))
    g = torch.randn(B, L, H, D, device="cuda", dtype=dtype)
    torch.manual_seed(1)
    fad.flash_attn_func(q, k, v, causal=causal, **kw).backward(g)
    out[("big", i)] = [t.grad.clone().cpu() for t in (q, k, v)]
# parts: dK/dV only (q without grad) and dQ only (k, v without grad), one big case
q, k, v = (torch.randn(4, 2048, 16, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
g = torch.randn(4, 2048, 16, 128, device="cuda", dtype=torch.bfloat16)
for name, needs in (("dkdv", (False, True, True)), ("dq", (True, False, False))):
    qq, kk, vv = (t.clone().requires_grad_(r) for t, r in zip((q, k, v), needs))
    fad.flash_attn_func(qq, kk, vv, causal=True).backward(g)
    out[("part", name)] = [t.grad.clone().cpu() for t in (qq, kk, vv) if t.requires_grad]
if sys.argv[2:] == ["cmp"]:
    ref = torch.load(sys.argv[1])
    bad = [key for key in ref if not all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                                         for a, b in zip(ref[key], out[key]))]
    print(f"{len(ref)} cases, {len(bad)} differ in any bit: {bad}")
else:
    torch.save(out, sys.argv[1])
    print(f"saved {len(out)} cases")
