"""Device time of one forward + backward of flash_attn_func (deterministic mode) captured in a
CUDA graph, so that the host's noise is out: replays timed by CUDA events.

    PYTHONPATH=$PWD python3 dev/attn_step_graph.py TAG [replays]

Shapes as dev/attn_step_time.py (the training check's attention, launch-bound, and two of the
backward harness's). Prints one line a shape: TAG, shape, us per replay (median of 5 timings)."""
import statistics
import sys

import torch

import flash_attn_det as fad

tag = sys.argv[1]
replays = int(sys.argv[2]) if len(sys.argv) > 2 else 200
fad.set_deterministic_mode(True)
SHAPES = [(8, 256, 4, 2, 64, True), (16, 2048, 16, 16, 128, True), (4, 8192, 16, 16, 128, False)]
for B, L, H, HK, D, causal in SHAPES:
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, L, H, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
    k, v = (torch.randn(B, L, HK, D, generator=g, device="cuda", dtype=torch.bfloat16).requires_grad_()
            for _ in range(2))
    dout = torch.randn(B, L, H, D, generator=g, device="cuda", dtype=torch.bfloat16)

    def step():
        for t in (q, k, v):
            t.grad = None
        fad.flash_attn_func(q, k, v, causal=causal).backward(dout)

    side = torch.cuda.Stream()  # (torch's rule: warm up on a side stream before capture)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    n = replays if L <= 256 else max(replays // 20, 5)
    for _ in range(3):
        graph.replay()
    ts = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            graph.replay()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1) / n * 1e3)
    print(f"{tag} B{B} L{L} H{H}/{HK} D{D} {'causal' if causal else 'non-causal'}: "
          f"{statistics.median(ts):.2f} us per replay ({', '.join(f'{t:.2f}' for t in ts)})", flush=True)
