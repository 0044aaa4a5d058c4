# grads_bits.py: Saves the backward's gradients on fixed inputs, or compares them bit for bit. Verdict: tool for changes that must keep every bit (it passed the dsum rewrite).
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
if sys.argv[2:] == ["cmp"]:
    ref = torch.load(sys.argv[1])
    bad = [key for key in ref if not all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                                         for a, b in zip(ref[key], out[key]))]
    print(f"{len(ref)} cases, {len(bad)} differ in any bit: {bad}")
else:
    torch.save(out, sys.argv[1])
    print(f"saved {len(out)} cases")
