# bwd_kernel_times.py: Per-kernel device time of the backward (torch.profiler). Verdict: measuring tool; it showed a fused dQ cannot beat the separate dQ pass on this kernel.
"""Per-kernel mean device time (torch.profiler) of flash_attn_func's backward, bf16, at the
harness's 32k-token shapes (D128 H16 and D64 H32, L 2k and 8k, causal and not):

    PYTHONPATH=$PWD python3 dev/bwd_kernel_times.py TAG OUT.json [d256]

(d256: bench_bwd.py's d256 preset's shapes instead, D256 H8 at 32k tokens, L 1k/4k/8k; gqa: its
gqa preset's, 32 query heads on 8 kv heads, D128, L 2k/8k/16k.)

Prints one line per config (TAG, config, {kernel: us}) and writes the dict to OUT.json.
(Used to time a fused-dQ probe's dK/dV kernel beside the dQ pass it would replace:
docs/performance.md.)"""
import json
import os
import sys

import torch

import flash_attn_det as fad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from probe_kernels import kernel_times  # noqa: E402  (torch.profiler, mean per launch)

CFGS = [(128, 2048, 16, 16, 0), (128, 2048, 16, 16, 1), (128, 8192, 4, 16, 0), (128, 8192, 4, 16, 1),
        (64, 2048, 16, 32, 0), (64, 2048, 16, 32, 1), (64, 8192, 4, 32, 0), (64, 8192, 4, 32, 1)]
CFGS = [c + (c[3],) for c in CFGS]  # (D, L, B, H, causal, kv heads)
if sys.argv[3:4] == ["d256"]:
    CFGS = [(256, L, 32768 // L, 8, c, 8) for L in (1024, 4096, 8192) for c in (0, 1)]
if sys.argv[3:4] == ["gqa"]:
    CFGS = [(128, L, 32768 // L, 32, c, 8) for L in (2048, 8192, 16384) for c in (0, 1)]
res = {}
for D, L, B, H, causal, HK in CFGS:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, do = (torch.randn(B, L, H, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    k, v = (torch.randn(B, L, HK, D, generator=g, device="cuda").to(torch.bfloat16) for _ in range(2))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = fad.flash_attn_func(q, k, v, causal=bool(causal))
    times = kernel_times(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True), 10)
    key = f"D{D} L{L} B{B} H{H}/{HK} {'causal' if causal else 'full'}"
    # kernels by their base name ("void dkdv_wgmma_kernel"): one launch of each per call
    res[key] = {n.split("<")[0].split("(")[0]: round(t, 1) for n, t in times.items() if t > 5}
    print(sys.argv[1], key, res[key], flush=True)
json.dump(res, open(sys.argv[2], "w"))
