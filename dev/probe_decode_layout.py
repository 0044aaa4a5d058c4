# probe_decode_layout.py: Decode time with the KV cache row-major (B, L, Hkv, D) against head-major (B, Hkv, L, D) viewed as (B, L, Hkv, D), for flash_attn_det and SDPA cuDNN. Verdict: probe (does a kv head's 256-byte row slices, 2 KB apart, cost the packed kernel its bandwidth?).
"""python3 dev/probe_decode_layout.py [--lens 8192,32768] [--batches 1,8,16]

GQA 32/8 D128, one query token, full caches; device time per call in CUDA graphs (the bench's
method: benchmarks/bench_decode.py), impls in alternating turns, median over turns."""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_decode as bd  # noqa: E402

import flash_attn_det as fad  # noqa: E402

H, HKV, D = 32, 8, 128


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lens", default="8192,32768")
    ap.add_argument("--batches", default="1,8,16")
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    print("| B | L | det row-major | det head-major | det ns1 row / head | cuDNN row / head (us, graph) |")
    print("|---|---|---|---|---|---|")
    for L in (int(x) for x in args.lens.split(",")):
        for B in (int(x) for x in args.batches.split(",")):
            g = torch.Generator(device="cuda").manual_seed(B * L)
            q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
            kh = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
            vh = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
            kr, vr = kh.transpose(1, 2).contiguous(), vh.transpose(1, 2).contiguous()  # row-major
            kv = {"row": (kr, vr), "head": (kh.transpose(1, 2), vh.transpose(1, 2))}  # both (B, L, Hkv, D)
            lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
            o_row = fad.flash_attn_with_kvcache(q, kr, vr, cache_seqlens=lens, causal=True)
            o_head = fad.flash_attn_with_kvcache(q, *kv["head"], cache_seqlens=lens, causal=True)
            same = torch.equal(o_row.view(torch.int16), o_head.view(torch.int16))

            def det(layout, ns=0):
                k, v = kv[layout]
                return lambda: fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True,
                                                           num_splits=ns)

            def cudnn(layout):
                k, v = kv[layout]
                def f():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                              v.transpose(1, 2),
                                                              enable_gqa=True).transpose(1, 2)
                return f
            impls = {"det_row": det("row"), "det_head": det("head"), "ns1_row": det("row", 1),
                     "ns1_head": det("head", 1), "cudnn_row": cudnn("row"), "cudnn_head": cudnn("head")}
            graphs = {n: bd.capture_graph(lambda *_: f(), [()], 16) for n, f in impls.items()}
            t = {n: [] for n in impls}
            for turn in range(args.turns):
                names = list(impls) if turn % 2 == 0 else list(impls)[::-1]
                for n in names:
                    t[n] += bd.replay_times(*graphs[n], 10)
            m = {n: statistics.median(x) for n, x in t.items()}
            print(f"| {B} | {L} | {m['det_row']:.1f} | {m['det_head']:.1f} ({m['det_row'] / m['det_head']:.2f}x)"
                  f"{'' if same else ' BITS DIFFER'} | {m['ns1_row']:.1f} / {m['ns1_head']:.1f} | "
                  f"{m['cudnn_row']:.1f} / {m['cudnn_head']:.1f} |", flush=True)
            del graphs


if __name__ == "__main__":
    main()
