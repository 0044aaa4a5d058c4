#!/usr/bin/env python3
# probe_decode_schedule.py: Decode's automatic schedule against each forced one. Verdict: one CTA per (sequence, kv head) wins 1.03-1.08x only for 10-16 same-length sequences and is 0.1x at batch 1, so the plan keeps splits.
"""Decode's schedule, timed: deterministic mode's automatic choice against each forced schedule
(`flash_attn_det.testing.force_schedule`: "one_cta", every 512-key split of a (sequence, kv head)
in one CTA, folded in registers; "cta_per_split", one CTA per split plus the combine; the same
bits either way, checked here), beside SDPA cuDNN on contiguous (B, Hkv, L, D) copies of the
cache. bf16, Hq 32 / Hkv 8, D 128, one query token; CUDA graphs of 16 calls, the impls in
alternating rounds, median us per call.

    python3 dev/probe_decode_schedule.py [--batches 8,12,16] [--lens 8192,32768,131072]
        [--schedules one_cta,cta_per_split] [--out F]
"""
import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_det as fad
from flash_attn_det.testing import force_schedule

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
from bench_decode import capture_graph, replay_times  # noqa: E402 (the decode harness's graph timing)

H, HKV, D = 32, 8, 128


def graph_of(fn):
    """(graph, calls) of fn() (no arguments) for replay_times."""
    return capture_graph(fn, [()])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="8,12,16")
    ap.add_argument("--lens", default="8192,32768,131072")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--schedules", default="one_cta,cta_per_split")
    ap.add_argument("--out")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    dev = "cuda"
    scheds = [x for x in args.schedules.split(",") if x]
    lines = [f"# {torch.cuda.get_device_name()}: decode, the automatic schedule against forced ones",
             "", "| config | CTAs (B x Hkv) | auto us | " + " | ".join(f"{x} us" for x in scheds) +
             " | cuDNN (B, Hkv, L, D) us | " + " | ".join(f"det / cuDNN, {x} (speed)" for x in ["auto"] + scheds) +
             " | bits equal |",
             "|---|---|---|" + "---|" * (2 * len(scheds) + 3)]
    for L in (int(x) for x in args.lens.split(",")):
        for B in (int(x) for x in args.batches.split(",")):
            g0 = torch.Generator(device=dev).manual_seed(B * 7 + L)
            q = torch.randn(B, 1, H, D, device=dev, dtype=torch.bfloat16, generator=g0)
            kc = torch.randn(B, L, HKV, D, device=dev, dtype=torch.bfloat16, generator=g0)
            vc = torch.randn(B, L, HKV, D, device=dev, dtype=torch.bfloat16, generator=g0)
            sl = torch.full((B,), L, dtype=torch.int32, device=dev)
            kt, vt = kc.transpose(1, 2).contiguous(), vc.transpose(1, 2).contiguous()
            qt = q.transpose(1, 2)

            def call():
                return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)
            o_auto = call()
            graphs, eq = {"auto": graph_of(call)}, True
            for x in scheds:
                with force_schedule(x):
                    eq = eq and torch.equal(o_auto, call())
                    graphs[x] = graph_of(call)
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                graphs["cudnn"] = graph_of(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True))
            ts = {k: [] for k in graphs}
            for _ in range(args.rounds):
                for name, (g, n) in graphs.items():
                    ts[name] += replay_times(g, n, 5)
            m = {k: statistics.median(v) for k, v in ts.items()}
            lines.append(f"| L{L} B{B} | {B * HKV} | {m['auto']:.1f} | " +
                         " | ".join(f"{m[x]:.1f}" for x in scheds) + f" | {m['cudnn']:.1f} | " +
                         " | ".join(f"{m['cudnn'] / m[x]:.2f}" for x in ["auto"] + scheds) + f" | {eq} |")
            print(lines[-1], flush=True)
            del graphs, q, kc, vc, kt, vt
            torch.cuda.empty_cache()
    text = "\n".join(lines) + "\n"
    if args.out:
        open(args.out, "w").write(text)
    print(text)


if __name__ == "__main__":
    main()
