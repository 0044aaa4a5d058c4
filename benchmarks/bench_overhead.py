"""Host overhead of one Python call, beside SDPA: a tiny problem (B1 L1 H1 D64 bf16) called
back to back, so the GPU is never the bottleneck and the wall time per call is host time.

    python3 benchmarks/bench_overhead.py            # needs a GPU

Also prints the time of the same call captured in a CUDA graph and replayed (device-side
floor), so host overhead = eager per-call time - graph per-call time.
"""
import time

import torch
import torch.nn.functional as F

import flash_attn_det as fad


def per_call_us(fn, n=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def graph_us(fn, n=2000):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return per_call_us(g.replay, n)


def main():
    q = torch.randn(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    # a decode step of a serving loop: one token, a small cache, append + rotary in the call
    kc, vc = (torch.randn(1, 256, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 100, dtype=torch.int32, device="cuda")
    cos, sin = (torch.rand(512, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    rows = [("flash_attn_det det", lambda: fad.flash_attn_func(q, k, v)),
            ("fad kvcache, decode", lambda: fad.flash_attn_with_kvcache(q, kc, vc,
                                                                       cache_seqlens=lens)),
            ("fad kvcache, +append+rotary", lambda: fad.flash_attn_with_kvcache(
                q, kc, vc, k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens,
                causal=True)),
            ("sdpa (default backend)", lambda: F.scaled_dot_product_attention(qt, kt, vt))]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} flash_attn_det {fad.__version__}")
    print(f"{'call':26s} {'eager us/call':>14s} {'graph us/call':>14s} {'host overhead us':>17s}")
    for name, fn in rows:
        e, g = per_call_us(fn), graph_us(fn)
        print(f"{name:26s} {e:14.2f} {g:14.2f} {e - g:17.2f}")


if __name__ == "__main__":
    main()
