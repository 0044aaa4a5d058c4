# ncu_bwd.py: One backward under Nsight Compute. Verdict: it showed the backward issues 7 products a tile pair to cuDNN's 5 and keeps the tensor pipe as busy.
"""One backward under the profiler (ncu --profile-from-start off), warm-up first, then the
profiled call:

    python3 dev/ncu_bwd.py D L B H causal(0/1) [impl] [hkv]

impl: fad (flash_attn_func in deterministic mode, the default) or cudnn (SDPA's cuDNN backend
on contiguous (B, H, L, D) tensors, its faster layout), so that both backwards can be read side
by side from one Nsight Compute report. hkv: kv heads (GQA; default H)."""
import sys

import torch
import torch.nn.functional as F

import flash_attn_det as fad

D, L, B, H, causal = (int(x) for x in sys.argv[1:6])
impl = sys.argv[6] if len(sys.argv) > 6 else "fad"
HK = int(sys.argv[7]) if len(sys.argv) > 7 else H
g = torch.Generator(device="cuda").manual_seed(0)
q, dout = (torch.randn(B, L, H, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
k, v = (torch.randn(B, L, HK, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
if impl == "fad":
    fad.set_deterministic_mode(True)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fad.flash_attn_func(q, k, v, causal=bool(causal))
elif impl == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v, dout = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), enable_gqa=HK != H)
else:
    raise SystemExit(f"impl: fad or cudnn, not {impl!r}")
for _ in range(2):
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
