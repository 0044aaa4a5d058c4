# bwd_workspace_probe.py: The backward's memory beyond its gradients, one varlen call. Verdict: probe, no verdict of its own.
# One causal varlen backward (H16 D128 bf16, one sequence of 16k tokens and 63 of 256), its peak CUDA
# memory above its inputs, less the three gradients: the row sums and, with FLASH_ATTN_DET_BWD_DQ=reduce,
# the fp32 dQ accumulator and its semaphores (benchmarks/results/2026-11-29_h200_dq_accum_varlen_ead532b.md).
#   FLASH_ATTN_DET_BWD_DQ=reduce python3 dev/bwd_workspace_probe.py
import torch, flash_attn_det as fad
H, Hk, D = 16, 16, 128
lens = [16384] + [256] * 63
cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
T = sum(lens)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(T, h, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_() for h in (H, Hk, Hk))
do = torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
out = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
torch.cuda.synchronize(); base = torch.cuda.memory_allocated(); torch.cuda.reset_peak_memory_stats()
dq, dk, dv = torch.autograd.grad(out, (q, k, v), do)
torch.cuda.synchronize()
peak = torch.cuda.max_memory_allocated() - base
grads = 3 * T * H * D * 2
print(f"tokens {T}, H {H}, D {D}: backward peak above its inputs {peak / 2**20:.1f} MiB, of which the gradients {grads / 2**20:.1f} MiB, the rest {(peak - grads) / 2**20:.1f} MiB ({(peak - grads) / (T * H):.0f} B per query row and head)")
