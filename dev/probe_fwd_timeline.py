# probe_fwd_timeline.py: Where the warp-specialized forward's time goes outside its tile loop, from globaltimer stamps a probe patch writes. Verdict: a three-consumer CTA spends 6.2-6.5 us outside its loop (15% at 2k keys, 8% at 4k); the persistent two-consumer probe's items 4.5 us (benchmarks/results/2026-11-30_h200_fwd_item_costs_a309f7a.md).
"""Needs a module built with dev/probe_fwd_cta_timeline.patch (main's kernel: a row a CTA) or, with
--items, dev/probe_fwd_persistent_two.patch (the persistent probe: a row an item); each patch's
fad_probe_copy and fad_probe_clear are read through ctypes:

    git apply dev/probe_fwd_cta_timeline.patch && dev/variant_so.sh tlb fwd_prefill_ws.cu
    cp dev/abi/_C_tlb.abi3.so flash_attn_det/_C.abi3.so
    PYTHONPATH=. python3 dev/probe_fwd_timeline.py [--items]

For each config (bf16, deterministic mode, 3 warm-up calls, then one call stamped) the mean time of
each phase a CTA (or item) spends: set-up, waiting for Q, for the first tile, the tile loop (and a
tile), the last fold, the output's stores; and between consecutive CTAs on one SM (or items of one CTA).
"""
import argparse
import ctypes

import numpy as np
import torch

import flash_attn_det as fad
import flash_attn_det._C as _C

ROWS = 16384
CTA_CONFIGS = [(32, 1024, 16, 128, 64, False), (16, 2048, 16, 128, 192, False), (8, 4096, 16, 128, 192, False),
               (8, 4096, 16, 128, 192, True), (32, 1024, 32, 64, 256, False)]
ITEM_CONFIGS = [(32, 1024, 16, 128, 128, False), (16, 2048, 16, 128, 128, False), (8, 4096, 16, 128, 128, False),
                (2, 16384, 16, 128, 128, False), (32, 1024, 16, 128, 128, True)]


def stamped_call(lib, slots, B, L, H, D, causal):
    q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    for _ in range(3):
        fad.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    assert lib.fad_probe_clear() == 0
    fad.flash_attn_func(q, k, v, causal=causal)
    torch.cuda.synchronize()
    buf = np.zeros(ROWS * slots, dtype=np.uint64)
    assert lib.fad_probe_copy(buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(buf.nbytes)) == 0
    return buf.reshape(ROWS, slots).astype(np.int64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", action="store_true", help="a build with dev/probe_fwd_persistent_two.patch")
    ap.add_argument("--grid", type=int, default=132, help="(--items) the persistent grid: the GPU's SMs")
    args = ap.parse_args()
    lib = ctypes.CDLL(_C.__file__)
    fad.set_deterministic_mode(True)
    for (B, L, H, D, rows, causal) in (ITEM_CONFIGS if args.items else CTA_CONFIGS):
        t = stamped_call(lib, 12 if args.items else 13, B, L, H, D, causal)
        n = B * H * ((L + rows - 1) // rows)
        t = t[:min(n, ROWS)]
        d = lambda a, b: ((t[:, b] - t[:, a]) / 1000.0).mean()  # noqa: E731
        tiles = L // 64
        print(f"D{D} B{B} L{L} H{H} causal={causal}: {'items' if args.items else 'CTAs'} {n}")
        if args.items:
            idx = np.arange(len(t) - args.grid)
            gap = ((t[idx + args.grid, 1] - t[idx, 5]) / 1000.0).mean()
            print(f"  q wait {d(1, 2):.2f}  to first tile {d(2, 3):.2f}  first tile S+softmax {d(3, 10):.2f}  "
                  f"loop {d(10, 4):.2f} ({d(10, 4) / max(tiles - 1, 1):.3f}/tile)  epilogue {d(4, 5):.2f} "
                  f"(fold {d(4, 11):.2f}, store {d(11, 5):.2f})  c1-c0 loop end {d(4, 9):.2f}  gap to next item {gap:.2f}")
            print(f"  producer: Q issued {d(1, 6):.2f} after consumer start; first K/V issued {d(1, 7):.2f}; "
                  f"last K/V issued {d(1, 8):.2f}; (item total {d(1, 5):.2f})")
            continue
        t = t[t[:, 1] > 0]
        print(f"  entry->consumer {d(6, 1):.2f}  q wait {d(1, 2):.2f}  to first tile {d(2, 3):.2f}  loop {d(3, 4):.2f} "
              f"({d(3, 4) / max(tiles, 1):.3f}/tile incl first)  fold {d(4, 11):.2f}  store {d(11, 5):.2f}  "
              f"CTA total {d(6, 5):.2f}")
        print(f"  set-up: consumer 0's first instruction {d(6, 10):.2f} after the producer's, its walks "
              f"{d(10, 7):.2f}, to the barrier {d(7, 9):.2f}, the barrier {d(9, 8):.2f}, setmaxnreg {d(8, 12):.2f}, "
              f"the rest {d(12, 1):.2f}")
        gaps = []
        for sm in np.unique(t[:, 0]):
            x = t[t[:, 0] == sm]
            x = x[np.argsort(x[:, 6])]
            gaps.append((x[1:, 6] - x[:-1, 5]) / 1000.0)
        g = np.concatenate(gaps)
        print(f"  next CTA entry - this CTA store end on the same SM: median {np.median(g):.2f} us, "
              f"mean {g.mean():.2f} (CTAs per SM {len(t) / len(np.unique(t[:, 0])):.1f})")


if __name__ == "__main__":
    main()
