# ncu_decode.py: One decode call under Nsight Compute, ours or cuDNN's. Verdict: tool; for reading the packed decode kernel's memory rates beside cuDNN's.
"""One decode step (GQA 32/8, D128, bf16, every sequence at L keys) under the profiler
(ncu --profile-from-start off), warm-up first, then the profiled call:

    python3 dev/ncu_decode.py B L [impl]

impl: fad (flash_attn_with_kvcache in deterministic mode, causal, the default) or cudnn (SDPA's
cuDNN backend on the cache's (B, Hkv, L, D) transposed views, as benchmarks/bench_decode.py calls
it). Both read the same bytes: the K and V rows of every sequence, once."""
import sys

import torch
import torch.nn.functional as F

import flash_attn_det as fad

B, L = int(sys.argv[1]), int(sys.argv[2])
impl = sys.argv[3] if len(sys.argv) > 3 else "fad"
H, HKV, D = 32, 8, 128
g = torch.Generator(device="cuda").manual_seed(0)
q = torch.randn(B, 1, H, D, generator=g, device="cuda").to(torch.bfloat16)
kc, vc = (torch.randn(B, L, HKV, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
seqlens = torch.full((B,), L, dtype=torch.int32, device="cuda")
if impl == "fad":
    fad.set_deterministic_mode(True)

    def call():
        return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True)
elif impl == "cudnn":
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def call():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2),
                                                  enable_gqa=True)
else:
    raise SystemExit(f"impl: fad or cudnn, not {impl!r}")
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
call()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
print(f"{impl} B{B} L{L}: {B * L * HKV * D * 2 * 2 / 2**20:.0f} MiB of K and V")
