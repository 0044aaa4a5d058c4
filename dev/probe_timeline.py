# probe_timeline.py: Kernel start and end times of back-to-back decode calls in a CUDA graph. Verdict: it found the launch gap that the programmatic-dependent launch now hides (15.6 -> 15.0 us, H200).
"""Where the time of a decode call goes inside a CUDA graph: kernel start/end times from
torch.profiler (CUPTI) over replays of a graph of back-to-back calls, split into each kernel's
duration and the gaps between kernels.

    PYTHONPATH=. python3 dev/probe_timeline.py [--batch 1] [--len 8192] [--calls 16]

Per implementation it prints, averaged over every call in the replays: the span of one call
(first kernel start to the next call's first kernel start), each kernel's duration, and the
gap before each kernel (start minus the previous kernel's end; negative = overlap, as with a
programmatic dependent launch). Same inputs as benchmarks/bench_decode.py (bf16, Hq 32 /
Hkv 8, D 128, one query token, K/V sets rotated so that no call finds its cache in L2).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flash_attn_det as fad

H, HKV, D = 32, 8, 128


def kernel_events(run):
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    path = os.path.join(tempfile.mkdtemp(), "trace.json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    ks = [(e["ts"], e["ts"] + e["dur"], e["name"]) for e in ev if e.get("cat") == "kernel"]
    return sorted(ks)


def short(name):
    name = name.replace("void ", "")
    return name.split("<")[0].split("(")[0][:40]


def analyse(tag, ks):
    """ks: kernels of several replays in time order; a call starts at its first kernel."""
    first = short(ks[0][2])
    starts = [i for i, k in enumerate(ks) if short(k[2]) == first]
    dur, gap = defaultdict(list), defaultdict(list)
    spans = []
    for n, i in enumerate(starts[:-1]):
        j = starts[n + 1]
        if j - i > 8:  # a replay boundary or something odd: skip
            continue
        spans.append(ks[j][0] - ks[i][0])
        for x in range(i, j):
            name = short(ks[x][2])
            dur[name].append(ks[x][1] - ks[x][0])
            prev_end = ks[x - 1][1] if x > 0 else None
            if prev_end is not None:
                gap[name].append(ks[x][0] - prev_end)
    print(f"{tag}: {len(spans)} calls, span per call median {statistics.median(spans):.2f} us "
          f"(min {min(spans):.2f})")
    for name in dur:
        g = gap.get(name) or [float("nan")]
        print(f"    {name:40s} dur {statistics.median(dur[name]):7.2f} us   "
              f"gap before {statistics.median(g):6.2f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--len", type=int, default=8192)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--replays", type=int, default=5)
    args = ap.parse_args()
    B, L, dev, bf = args.batch, args.len, "cuda", torch.bfloat16
    sets = []
    for _ in range(4):
        sets.append((torch.randn(B, 1, H, D, device=dev, dtype=bf),
                     torch.randn(B, L, HKV, D, device=dev, dtype=bf),
                     torch.randn(B, L, HKV, D, device=dev, dtype=bf),
                     torch.full((B,), L, dtype=torch.int32, device=dev)))

    def fad_call(q, kc, vc, sl):
        return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)

    def sdpa_call(q, kc, vc, sl):
        return F.scaled_dot_product_attention(q.transpose(1, 2), kc.transpose(1, 2),
                                              vc.transpose(1, 2), enable_gqa=True).transpose(1, 2)

    impls = [("fad_det", fad_call, lambda: fad.set_deterministic_mode(True)),
             ("fad_fast", fad_call, lambda: fad.set_deterministic_mode(False)),
             ("sdpa_cudnn", sdpa_call, lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
             ("sdpa_flash", sdpa_call, lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION))]
    print(f"{torch.cuda.get_device_name()}: decode B{B} L{L} Hq{H}/Hkv{HKV} D{D} bf16, "
          f"graphs of {args.calls} calls, {args.replays} replays")
    for tag, fn, ctx in impls:
        c = ctx()
        if hasattr(c, "__enter__"):
            c.__enter__()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for s in sets:
                    fn(*s)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(args.calls):
                    fn(*sets[i % len(sets)])
            for _ in range(3):
                g.replay()
            torch.cuda.synchronize()

            def replays():
                for _ in range(args.replays):
                    g.replay()
            analyse(tag + " graph", kernel_events(replays))

            def eager():
                for i in range(args.calls * args.replays):
                    fn(*sets[i % len(sets)])
            analyse(tag + " eager", kernel_events(eager))
            del g
        except Exception as e:  # a peer missing on this build
            print(f"{tag}: {type(e).__name__}: {str(e)[:200]}")
        finally:
            if hasattr(c, "__exit__"):
                c.__exit__(None, None, None)
    fad.set_deterministic_mode(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
