"""Host overhead of one Python call, beside SDPA: a tiny problem (B1 L1 H1 D64 bf16) called
back to back, so the GPU is never the bottleneck and the wall time per call is host time.

    python3 benchmarks/bench_overhead.py            # needs a GPU

Also prints the time of the same call captured in a CUDA graph and replayed (device-side
floor), so host overhead = eager per-call time - graph per-call time. The host's own load
varies from second to second, so the rows take turns (--rounds, default 5) and each
figure is the fastest of its rounds: the load only ever adds time. The "general path"
rows switch off the C inference entries (_C.infer, infer_varlen, infer_kvcache) for the
same call.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import flash_attn_det as fad
from flash_attn_det import interface


def per_call_us(fn, n=2000):
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def capture(fn):
    """fn captured in a CUDA graph (after one warm-up call on a side stream)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def main(argv=None):
    ap = argparse.ArgumentParser(description="Host overhead of one call, beside SDPA.")
    ap.add_argument("--rounds", type=int, default=5, help="turns the rows take (default 5)")
    args = ap.parse_args(argv)
    q = torch.randn(1, 1, 1, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    # a decode step of a serving loop: one token, a small cache, append + rotary in the call
    kc, vc = (torch.randn(1, 256, 1, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((1,), 100, dtype=torch.int32, device="cuda")
    cos, sin = (torch.rand(512, 32, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    func = lambda: fad.flash_attn_func(q, k, v)  # noqa: E731
    decode = lambda: fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens)  # noqa: E731
    cu = torch.tensor([0, 1], dtype=torch.int32, device="cuda")
    varlen = lambda: fad.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 1, 1)  # noqa: E731
    append = lambda: fad.flash_attn_with_kvcache(  # noqa: E731
        q, kc, vc, k=k, v=v, rotary_cos=cos, rotary_sin=sin, cache_seqlens=lens, causal=True)
    # (name, call, general): general rows run with the C inference entries switched off,
    # the Python path every call took before them (interface._infer*)
    rows = [("flash_attn_det det", func, False),
            ("  general path", func, True),
            ("  with lse", lambda: fad.flash_attn_func(q, k, v, return_attn_probs=True), False),
            ("fad varlen", varlen, False),
            ("  general path", varlen, True),
            ("fad kvcache, decode", decode, False),
            ("  general path", decode, True),
            ("  with lse", lambda: fad.flash_attn_with_kvcache(
                q, kc, vc, cache_seqlens=lens, return_softmax_lse=True), False),
            ("fad kvcache, +append+rotary", append, False),
            ("  general path", append, True),
            ("sdpa (default backend)", lambda: F.scaled_dot_product_attention(qt, kt, vt), False)]
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__} flash_attn_det {fad.__version__}")
    names = ("_infer", "_infer_varlen", "_infer_kvcache")
    entries = [getattr(interface, n) for n in names]

    def entries_on(on):
        for n, e in zip(names, entries):
            setattr(interface, n, e if on else None)

    graphs = []
    for _, fn, general in rows:
        entries_on(not general)
        graphs.append(capture(fn))
    eager, graph = [float("inf")] * len(rows), [float("inf")] * len(rows)
    for _ in range(args.rounds):
        for n, ((_, fn, general), g) in enumerate(zip(rows, graphs)):
            entries_on(not general)
            eager[n] = min(eager[n], per_call_us(fn))
            graph[n] = min(graph[n], per_call_us(g.replay))
    entries_on(True)
    print(f"fastest of {args.rounds} rounds per figure")
    print(f"{'call':28s} {'eager us/call':>14s} {'graph us/call':>14s} {'host overhead us':>17s}")
    for (name, _, _), e, g in zip(rows, eager, graph):
        print(f"{name:28s} {e:14.2f} {g:14.2f} {e - g:17.2f}")


if __name__ == "__main__":
    main()
