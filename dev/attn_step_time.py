"""Wall time of one forward + backward of flash_attn_func (deterministic mode), eager, per call:
the host's launches and allocations included, as a small training step sees them.

    PYTHONPATH=$PWD python3 dev/attn_step_time.py TAG [iters]

Shapes: the training check's attention (B8 L256 Hq4/Hkv2 D64 causal, launch-bound), and two of
the backward harness's (B16 L2k H16 D128 causal, B4 L8k H16 D128). Prints one line a shape:
TAG, shape, us per call (median of 5 timings of `iters` calls each)."""
import statistics
import sys
import time

import torch

import flash_attn_det as fad

tag = sys.argv[1]
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 200
fad.set_deterministic_mode(True)
SHAPES = [(8, 256, 4, 2, 64, True), (16, 2048, 16, 16, 128, True), (4, 8192, 16, 16, 128, False)]
for B, L, H, HK, D, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, L, H, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn(B, L, HK, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(2))
    dout = torch.randn(B, L, H, D, generator=g, device="cuda", dtype=torch.bfloat16)
    n = iters if L <= 256 else max(iters // 20, 5)

    def step():
        out = fad.flash_attn_func(q, k, v, causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) / n * 1e6)
    print(f"{tag} B{B} L{L} H{H}/{HK} D{D} {'causal' if causal else 'non-causal'}: "
          f"{statistics.median(ts):.1f} us per call ({', '.join(f'{t:.1f}' for t in ts)})", flush=True)
