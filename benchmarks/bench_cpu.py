"""The CPU path against torch's CPU SDPA (its flash kernel), side by side in one run.

Every row times flash_attn_det and torch.nn.functional.scaled_dot_product_attention
(SDPBackend.FLASH_ATTENTION, contiguous (B, H, L, D) inputs, enable_gqa when Hkv < H) on the
same problem, same dtype and the same torch.get_num_threads(), the two taking turns call by
call so that noise from other processes falls on both; each time is the median of its turns,
ratio = flash_attn_det / torch (below 1: flash_attn_det is faster).

Rows: fwd and fwd+bwd of flash_attn_func (dense) and flash_attn_varlen_func (B equal-length
sequences, against SDPA's padded batch); the forward of flash_attn_with_kvcache (a prefill of
L rows into a cache of L, causal) on a contiguous and on a paged cache (no backward exists
for those); decode: one query row against a cache of L keys (B 1, 32 query heads on 8 kv
heads, D 128).

    python3 benchmarks/bench_cpu.py              # a few minutes: B 1, L 512 / 2048, D 64 / 128
    python3 benchmarks/bench_cpu.py --full       # the issue's grid: L 512..8k, B 1 and 8
    python3 benchmarks/bench_cpu.py --threads 1 --lengths 1024 --dims 64 --batches 1
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import flash_attn_det as fad  # noqa: E402


def _sdpa(q, k, v, causal):
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                              enable_gqa=k.shape[1] != q.shape[1])


def _timed(fn):
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def side_by_side(ours, theirs, reps, budget_s):
    """Median seconds of ours and theirs, called in alternating turns (one warm-up each)."""
    ours(), theirs()
    a, b = [], []
    start = time.perf_counter()
    for r in range(reps):
        first, second = (ours, theirs) if r % 2 == 0 else (theirs, ours)
        t1, t2 = _timed(first), _timed(second)
        a.append(t1 if r % 2 == 0 else t2)
        b.append(t2 if r % 2 == 0 else t1)
        if r >= 2 and time.perf_counter() - start > budget_s:
            break
    return statistics.median(a), statistics.median(b)


def _bhld(x):
    return x.transpose(1, 2).contiguous()


def dense_case(B, L, H, D, causal, bwd, dtype):
    q, k, v = (torch.randn(B, L, H, D, dtype=dtype) for _ in range(3))
    tq, tk, tv = (_bhld(x) for x in (q, k, v))
    if not bwd:
        return (lambda: fad.flash_attn_func(q, k, v, causal=causal),
                lambda: _sdpa(tq, tk, tv, causal))
    for x in (q, k, v, tq, tk, tv):
        x.requires_grad_(True)
    g, tg = torch.randn(B, L, H, D, dtype=dtype), None
    tg = _bhld(g)

    def ours():
        fad.flash_attn_func(q, k, v, causal=causal).backward(g)

    def theirs():
        _sdpa(tq, tk, tv, causal).backward(tg)
    return ours, theirs


def varlen_case(B, L, H, D, causal, bwd, dtype):
    q, k, v = (torch.randn(B * L, H, D, dtype=dtype) for _ in range(3))
    cu = torch.arange(0, (B + 1) * L, L, dtype=torch.int32)
    tq, tk, tv = (x.view(B, L, H, D).transpose(1, 2).contiguous() for x in (q, k, v))
    if not bwd:
        return (lambda: fad.flash_attn_varlen_func(q, k, v, cu, cu, L, L, causal=causal),
                lambda: _sdpa(tq, tk, tv, causal))
    for x in (q, k, v, tq, tk, tv):
        x.requires_grad_(True)
    g = torch.randn(B * L, H, D, dtype=dtype)
    tg = g.view(B, L, H, D).transpose(1, 2).contiguous()

    def ours():
        fad.flash_attn_varlen_func(q, k, v, cu, cu, L, L, causal=causal).backward(g)

    def theirs():
        _sdpa(tq, tk, tv, causal).backward(tg)
    return ours, theirs


def kvcache_case(B, L, H, D, causal, paged, dtype, Hkv=None, Lq=None):
    Hkv = Hkv or H
    Lq = L if Lq is None else Lq
    q = torch.randn(B, Lq, H, D, dtype=dtype)
    k, v = (torch.randn(B, L, Hkv, D, dtype=dtype) for _ in range(2))
    seqlens = torch.full((B,), L, dtype=torch.int32)
    tq, tk, tv = (_bhld(x) for x in (q, k, v))
    if paged:
        page = 256
        nblk = L // page
        perm = torch.randperm(B * nblk)
        kc = torch.empty(B * nblk, page, Hkv, D, dtype=dtype)
        vc = torch.empty_like(kc)
        kc[perm] = k.reshape(B * nblk, page, Hkv, D)
        vc[perm] = v.reshape(B * nblk, page, Hkv, D)
        table = perm.view(B, nblk).to(torch.int32)

        def ours():
            fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, block_table=table,
                                        causal=causal)
    else:
        def ours():
            fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=causal)
    return ours, lambda: _sdpa(tq, tk, tv, causal and Lq > 1)


def rows(args):
    dtype = torch.bfloat16
    H = args.heads
    for B in args.batches:
        for L in args.lengths:
            for D in args.dims:
                for causal in (True, False):
                    for bwd in (False, True):
                        yield (f"dense {'fwd+bwd' if bwd else 'fwd'}", B, L, D, causal,
                               lambda B=B, L=L, D=D, c=causal, b=bwd: dense_case(B, L, H, D, c, b, dtype))
    # the other entry points at one shape per length (they share the kernels)
    D = args.dims[-1]
    for L in args.lengths:
        B = args.batches[-1]
        for bwd in (False, True):
            yield (f"varlen {'fwd+bwd' if bwd else 'fwd'}", B, L, D, True,
                   lambda B=B, L=L, b=bwd: varlen_case(B, L, H, D, True, b, dtype))
        yield ("kvcache fwd", B, L, D, True,
               lambda B=B, L=L: kvcache_case(B, L, H, D, True, False, dtype))
        if L % 256 == 0:
            yield ("paged fwd", B, L, D, True,
                   lambda B=B, L=L: kvcache_case(B, L, H, D, True, True, dtype))
    for L in args.decode_lengths:
        for paged in (False, True):
            yield (f"decode{' paged' if paged else ''} 32/8", 1, L, 128, True,
                   lambda L=L, p=paged: kvcache_case(1, L, 32, 128, True, p, dtype, Hkv=8, Lq=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--full", action="store_true",
                    help="the whole grid: L 512, 1k, 2k, 4k, 8k; B 1 and 8; decode 8k, 16k, 32k")
    ap.add_argument("--lengths", type=int, nargs="+", default=None)
    ap.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--batches", type=int, nargs="+", default=None)
    ap.add_argument("--decode-lengths", type=int, nargs="+", default=None)
    ap.add_argument("--heads", type=int, default=8, help="query (= kv) heads of the prefill rows")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads first")
    ap.add_argument("--reps", type=int, default=7, help="turns per implementation and row")
    ap.add_argument("--budget", type=float, default=6.0,
                    help="seconds per row after which no new turn starts (at least 3 turns)")
    ap.add_argument("--filter", default="", help="only rows whose name contains this")
    args = ap.parse_args()
    if args.lengths is None:
        args.lengths = [512, 1024, 2048, 4096, 8192] if args.full else [512, 2048]
    if args.batches is None:
        args.batches = [1, 8] if args.full else [1]
    if args.decode_lengths is None:
        args.decode_lengths = [8192, 16384, 32768] if args.full else [8192, 32768]
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"# torch {torch.__version__}, {torch.get_num_threads()} threads, bf16, "
          f"H {args.heads} (decode 32/8), CPU capability "
          f"{torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} CPUs")
    print("| row | B | L | D | causal | flash_attn_det ms | torch SDPA ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    worst = 0.0
    for name, B, L, D, causal, make in rows(args):
        if args.filter not in name:
            continue
        ours, theirs = make()
        a, b = side_by_side(ours, theirs, args.reps, args.budget)
        ratio = a / b
        worst = max(worst, ratio)
        print(f"| {name} | {B} | {L} | {D} | {int(causal)} | {a * 1e3:.2f} | {b * 1e3:.2f} | "
              f"{ratio:.2f} |", flush=True)
    print(f"# worst ratio {worst:.2f}")


if __name__ == "__main__":
    main()
