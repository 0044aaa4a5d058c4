# ab_paged_prefill.py: Chunked prefill against a paged KV cache, builds in alternating turns in one process (dev/ab_inproc.py's loading), beside the same call on a contiguous cache. Verdict: tool.
"""A chunk of new query rows (flash_attn_with_kvcache, causal) over a KV cache of `cache` rows,
the cache paged (pages of --pages rows, blocks shuffled) or contiguous; GQA 32/8 D128 bf16, as a
serving engine's prefill step. Each build takes `rounds` turns of `iters` calls (CUDA events) on the
same tensors, the order reversed every other round; medians in us and TFLOP/s (the causal chunk's
flops), each build's paged call against the first build's, and against its own contiguous call.
Bits: every build's paged output equals the first build's contiguous output.

    PYTHONPATH=$PWD python3 dev/ab_paged_prefill.py head new [--chunks 512,2048] [--caches 4096,16384]
        [--pages 16,256] [--batch 4] [--rounds 6] [--iters 8]
"""
import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import flash_attn_det as fad  # noqa: E402
from ab_inproc import load_build, use_build  # noqa: E402


def to_pages(gen, k, v, page):
    """k, v (B, S, Hk, D) into a paged cache, the blocks in a random order, and its block table."""
    B, S = k.shape[:2]
    per = (S + page - 1) // page
    order = torch.randperm(B * per, generator=gen).reshape(B, per)
    kc = torch.empty((B * per, page, *k.shape[2:]), dtype=k.dtype, device=k.device)
    vc = torch.empty_like(kc)
    kp = torch.nn.functional.pad(k, (0, 0, 0, 0, 0, per * page - S)).reshape(B, per, page, *k.shape[2:])
    vp = torch.nn.functional.pad(v, (0, 0, 0, 0, 0, per * page - S)).reshape(B, per, page, *k.shape[2:])
    kc[order.reshape(-1).cuda()] = kp.reshape(B * per, page, *k.shape[2:])
    vc[order.reshape(-1).cuda()] = vp.reshape(B * per, page, *k.shape[2:])
    return kc, vc, order.to(torch.int32).cuda()


def timed(fn, iters):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e3 / iters  # us a call


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--chunks", default="512,2048")
    ap.add_argument("--caches", default="4096,16384")
    ap.add_argument("--pages", default="16,256")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    fad.set_deterministic_mode(True)  # (before the loads: each build takes the mode then)
    mods = {b: load_build(b) for b in args.builds}
    gen = torch.Generator().manual_seed(0)
    B, H, Hk, D = args.batch, 32, 8, 128
    base = args.builds[0]
    cols = [*args.builds, *(f"{b} contig" for b in args.builds), *(f"{b} / {base}" for b in args.builds[1:]),
            *(f"{b} paged / contig" for b in args.builds), "bits = contig"]
    print("| row | " + " | ".join(cols) + " |")
    print("|" + "---|" * (len(cols) + 1))
    for cache in (int(x) for x in args.caches.split(",")):
        for chunk in (int(x) for x in args.chunks.split(",")):
            if chunk > cache:
                continue
            k = torch.randn(B, cache, Hk, D, generator=gen).to("cuda", torch.bfloat16)
            v = torch.randn(B, cache, Hk, D, generator=gen).to("cuda", torch.bfloat16)
            q = torch.randn(B, chunk, H, D, generator=gen).to("cuda", torch.bfloat16)
            lens = torch.full((B,), cache, dtype=torch.int32, device="cuda")
            # the chunk's rows are the cache's last `chunk` rows: causal, bottom-right aligned
            flops = 4 * B * H * D * sum(cache - chunk + i + 1 for i in range(chunk))
            for page in (int(x) for x in args.pages.split(",")):
                kc, vc, bt = to_pages(gen, k, v, page)
                calls = {}
                for b in args.builds:
                    calls[b] = lambda: fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt,
                                                                   causal=True)
                    calls[b + " contig"] = lambda: fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens,
                                                                               causal=True)
                t = {c: [] for c in calls}
                order = list(calls)
                for r in range(args.rounds):
                    for c in (order if r % 2 == 0 else order[::-1]):
                        use_build(mods[c.split()[0]])
                        calls[c]()
                        t[c].append(timed(calls[c], args.iters))
                use_build(mods[base])
                ref = calls[base + " contig"]()
                same = []
                for b in args.builds:
                    use_build(mods[b])
                    same.append(torch.equal(calls[b](), ref))
                med = {c: statistics.median(x) for c, x in t.items()}
                cells = [f"{med[b]:.0f} us ({flops / med[b] / 1e6:.0f})" for b in args.builds]
                cells += [f"{med[b + ' contig']:.0f}" for b in args.builds]
                cells += [f"{med[base] / med[b]:.3f}" for b in args.builds[1:]]
                cells += [f"{med[b + ' contig'] / med[b]:.3f}" for b in args.builds]
                cells.append(" ".join("yes" if s else "NO" for s in same))
                print(f"| B{B} cache {cache} chunk {chunk} page {page} | " + " | ".join(cells) + " |", flush=True)
    use_build(mods[base])


if __name__ == "__main__":
    main()
