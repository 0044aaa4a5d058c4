"""One backward of flash_attn_func under the profiler (ncu --profile-from-start off):
python3 dev/ncu_bwd.py D L B H causal(0/1). Warm-up first, then the profiled call."""
import sys

import torch

import flash_attn_det as fad

D, L, B, H, causal = (int(x) for x in sys.argv[1:6])
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, dout = (torch.randn(B, L, H, D, generator=g, device="cuda").to(torch.bfloat16)
                 for _ in range(4))
q, k, v = (t.requires_grad_() for t in (q, k, v))
out = fad.flash_attn_func(q, k, v, causal=bool(causal))
for _ in range(2):
    torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
