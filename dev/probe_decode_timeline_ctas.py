# probe_decode_timeline_ctas.py: Per-CTA globaltimer timeline of one decode call (packed kernel and combine), from a build with dev/probe_decode_cta_timeline.patch. Verdict: see the results file that cites it.
"""Where one decode call's time goes, CTA by CTA:

    PYTHONPATH=$PWD python3 dev/probe_decode_timeline_ctas.py [--batch 1] [--len 131072]

flash_attn_det/_C.abi3.so must be a build with dev/probe_decode_cta_timeline.patch (its
fad_probe_* symbols, through ctypes). Inputs as benchmarks/bench_decode.py (GQA 32/8 D128 bf16,
one query token), deterministic mode. Prints, in us from the first packed CTA's entry: the
packed CTAs' entries, first tiles and ends (min / median / max), splits a CTA, the median time
a split takes inside a run, and the combine CTAs' entries, the start of their last chunk and
their ends, so that the combine's tail after the last packed CTA shows.
"""
import argparse
import ctypes
import sys

import numpy as np
import torch

import flash_attn_det as fad
import flash_attn_det._C as _C

PS, PN, CS, CN = 24, 8192, 16, 4096


def q3(x):
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return "   -      -      -  "
    return f"{x.min():7.2f} {np.median(x):7.2f} {x.max():7.2f}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--len", type=int, default=131072)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    lib = ctypes.CDLL(_C.__file__)
    fad.set_deterministic_mode(True)
    B, L = a.batch, a.len
    q = torch.randn(B, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(B, L, 8, 128, device="cuda", dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    sl = torch.full((B,), L, dtype=torch.int32, device="cuda")
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(3):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)
    torch.cuda.synchronize()
    for rep in range(a.reps):
        flush.zero_()  # K/V out of L2, as in the bench's rotated sets
        torch.cuda.synchronize()
        assert lib.fad_probe_dclear() == 0 and lib.fad_probe_cclear() == 0
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)
        torch.cuda.synchronize()
        pb = np.zeros(PN * PS, dtype=np.uint64)
        cb = np.zeros(CN * CS, dtype=np.uint64)
        assert lib.fad_probe_dcopy(pb.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(pb.nbytes)) == 0
        assert lib.fad_probe_ccopy(cb.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(cb.nbytes)) == 0
        p = pb.reshape(PN, PS).astype(np.int64)
        c = cb.reshape(CN, CS).astype(np.int64)
        p = p[p[:, 1] > 0]
        c = c[c[:, 0] > 0]
        t0 = p[:, 1].min()
        us = lambda x: (x - t0) / 1000.0
        ends = us(p[:, PS - 1])
        nsplit = (p[:, 4:PS - 1] > 0).sum(axis=1)
        sdur = []
        for row in p:
            st = row[4:PS - 1]
            st = st[st > 0]
            if len(st) > 1:
                sdur += list(np.diff(st) / 1000.0)
        print(f"B{B} L{L} rep {rep}: {len(p)} packed CTAs on {len(set(p[:, 0]))} SMs, splits a CTA "
              f"{dict(zip(*np.unique(nsplit, return_counts=True)))}")
        print(f"  packed entry      {q3(us(p[:, 1]))}   after pdl wait {q3(us(p[:, 2]))}")
        print(f"  first tile        {q3(us(p[:, 3]))}   first partial  {q3(us(p[:, 4]))}")
        print(f"  split in a run    {q3(sdur)}")
        print(f"  packed end        {q3(ends)}")
        if len(c):
            lastch = [us(r[2:CS][r[2:CS] > 0].max()) if (r[2:CS] > 0).any() else np.nan for r in c]
            print(f"  combine entry     {q3(us(c[:, 0]))}   ({len(c)} CTAs)")
            print(f"  combine last chunk{q3(lastch)}")
            print(f"  combine row out   {q3(us(c[:, 1]))}")
            print(f"  tail: last combine row out - last packed end = {us(c[:, 1]).max() - ends.max():.2f} us; "
                  f"call span {us(c[:, 1]).max():.2f} us")
        else:
            print(f"  (no combine CTA) call span {ends.max():.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
