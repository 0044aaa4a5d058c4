# probe_bwd_cta_timeline.py: Where a five-product dK/dV CTA's (or persistent work item's) time goes, from globaltimer stamps a probe patch writes. Verdict: a CTA an item spends 10.8% of SM time outside its step loop at D128 L2k full, 3.3% at L8k (benchmarks/results/2026-11-30_h200_bwd_persistent_d6ffc98.md, section 2).
"""Needs a module built with dev/probe_bwd_cta_timeline.patch (its fad_probe_copy and
fad_probe_clear, read through ctypes; the one-CTA-an-item grid, before the persistent one
landed), or with --items one built with dev/probe_bwd_item_timeline.patch (the persistent grid):

    git apply dev/probe_bwd_cta_timeline.patch && dev/variant_so.sh tl bwd_dkdv_wgmma.cu
    cp dev/abi/_C_tl.abi3.so flash_attn_det/_C.abi3.so
    PYTHONPATH=. python3 dev/probe_bwd_cta_timeline.py [--preset dq] [--items]

For each config (bench_bwd's inputs, fad_det's backward, after 3 warm-up calls) one call's
dK/dV CTAs: the kernel's span; per CTA, averaged, the time from entry to K/V landed and to
step 0's tiles landed (the prologue), the loop and its time a step, the loop's share of
waiting on the ring (math thread 0), the epilogue (dK/dV stored) and the dQ warps' tail past
the loop; per SM, the gap from one CTA's end to the next CTA's entry; and the SMs' busy share
of the span. The first wave (the first CTA of each SM) is shown apart.
"""
import argparse
import ctypes
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_bwd  # noqa: E402
import common  # noqa: E402

import flash_attn_det._C as _C  # noqa: E402

CTAS = 16384


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="dq")
    ap.add_argument("--items", action="store_true",
                    help="a build with dev/probe_bwd_item_timeline.patch (the persistent kernel): per item")
    args = ap.parse_args()
    lib = ctypes.CDLL(_C.__file__)
    dev = torch.device("cuda")
    impl = common.make_impls(names=["fad_det"])[0]
    slots = 14 if args.items else 12
    for cfg in bench_bwd.preset_configs(args.preset):
        rec, fn = bench_bwd.prepare_bwd(impl, cfg, dev)
        with impl.context():
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            assert lib.fad_probe_clear() == 0
            fn()
            torch.cuda.synchronize()
        buf = np.zeros(CTAS * slots, dtype=np.uint64)
        assert lib.fad_probe_copy(buf.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(buf.nbytes)) == 0
        t = buf.reshape(CTAS, slots).astype(np.int64)
        t = t[t[:, 1] > 0]
        if args.items:
            items_report(cfg, t)
            del fn
            torch.cuda.empty_cache()
            continue
        n = len(t)
        t0 = t[:, 1].min()
        ent, kv, first, loop_end, prod_end, epi, dq_end = (t[:, i] - t0 for i in (1, 2, 3, 4, 5, 6, 7))
        steps, wait_cyc, loop_cyc = t[:, 9], t[:, 8], t[:, 10]
        end = np.maximum(epi, dq_end)
        span = end.max()
        us = lambda x: float(np.mean(x)) / 1e3  # noqa: E731
        per_step = (loop_end - first) / np.maximum(steps, 1)
        gaps, first_wave = [], np.zeros(n, bool)
        busy = 0
        sm = t[:, 0]
        for s in np.unique(sm):
            idx = np.where(sm == s)[0]
            idx = idx[np.argsort(ent[idx])]
            first_wave[idx[0]] = True
            busy += int(np.sum(end[idx] - ent[idx]))
            gaps += list(ent[idx[1:]] - end[idx[:-1]])
        sms = len(np.unique(sm))
        print(f"\n{cfg.label()}: {n} CTAs on {sms} SMs, span {span / 1e3:.1f} us, SMs busy {busy / (sms * span):.1%}")
        print(f"  loop cycles a step (math thread 0): {np.sum(loop_cyc) / max(1, np.sum(steps)):.0f}")
        for name, sel in (("all", np.ones(n, bool)), ("first wave", first_wave), ("later", ~first_wave)):
            if not sel.any():
                continue
            print(f"  {name:10s} n={sel.sum():5d} steps {np.mean(steps[sel]):.0f}: life {us((end - ent)[sel]):.1f} us"
                  f" | K/V landed +{us((kv - ent)[sel]):.2f} step0 tiles +{us((first - ent)[sel]):.2f}"
                  f" | loop {us((loop_end - first)[sel]):.1f} ({us(per_step[sel]):.3f} a step,"
                  f" ring wait {np.sum(wait_cyc[sel]) / max(1, np.sum(loop_cyc[sel])):.1%})"
                  f" | epilogue +{us((epi - loop_end)[sel]):.2f} dQ tail +{us((dq_end - loop_end)[sel]):.2f}"
                  f" producer done {us((prod_end - ent)[sel]):.1f}")
        g = np.array(gaps) / 1e3
        if len(g):
            print(f"  SM gap end->next entry: median {np.median(g):.2f} us, mean {g.mean():.2f}, "
                  f"p90 {np.percentile(g, 90):.2f}")
        # overhead a CTA against its loop: (life - loop) / life
        life = (end - ent).astype(float)
        print(f"  outside the loop: {np.sum(life - (loop_end - first)) / np.sum(life):.1%} of CTA time;"
              f" with SM gaps {(np.sum(life - (loop_end - first)) + np.sum(np.maximum(g * 1e3, 0))) / (sms * span):.1%} of SM time")
        del fn
        torch.cuda.empty_cache()


def items_report(cfg, t):
    """The persistent kernel: per CTA, its items in order; where the math warps' time goes."""
    t0 = t[:, 1].min()
    take, kv, first, loop_end, prod_kv, epi, dq_end, fetched, taken = (
        t[:, i] - t0 for i in (1, 2, 3, 4, 5, 6, 7, 12, 13))
    steps, cta = t[:, 9], t[:, 11]
    span = max(epi.max(), dq_end.max())
    us = lambda x: float(np.mean(x)) / 1e3 if len(x) else float("nan")  # noqa: E731
    gap, kv_wait, kv_after_loop, kv_load, first_item = [], [], [], [], []
    fetch_rel, taken_rel = [], []
    loop_sum = 0
    for c in np.unique(cta):
        idx = np.where(cta == c)[0]
        idx = idx[np.argsort(take[idx])]
        first_item.append(idx[0])
        loop_sum += int(np.sum(loop_end[idx] - first[idx]))
        for a_, b_ in zip(idx[:-1], idx[1:]):
            gap.append(take[b_] - epi[a_])                 # math: stored the last item -> took the next
            kv_after_loop.append(prod_kv[b_] - loop_end[a_])  # the producer's K/V issue after the last loop's end
            kv_load.append(kv[b_] - prod_kv[b_])           # issue -> landed (math view)
            kv_wait.append(kv[b_] - take[b_])              # math: took the item -> K/V landed
            fetch_rel.append(fetched[b_] - loop_end[a_])   # the ticket fetched, after the last loop's end
            taken_rel.append(taken[b_] - epi[a_])          # math took it (before set_item), after its stores
    n_cta = len(np.unique(cta))
    per_step = (loop_end - first) / np.maximum(steps, 1)
    print(f"\n{cfg.label()}: {len(t)} items on {n_cta} CTAs, span {span / 1e3:.1f} us, "
          f"math in its loops {loop_sum / (n_cta * span):.1%} of CTA time")
    print(f"  loop cycles a step (math thread 0): {np.sum(t[:, 10]) / max(1, np.sum(steps)):.0f}")
    print(f"  items: steps {np.mean(steps):.0f}, loop {us(loop_end - first):.1f} us ({us(per_step):.3f} a step); "
          f"finish+epilogue (loop end -> dK/dV stored) {us(epi - loop_end):.2f}; dQ warp done +{us(dq_end - loop_end):.2f}"
          f" after the loop")
    print(f"  between items (math): stored -> next taken {us(np.array(gap)):.2f}; taken -> K/V landed "
          f"{us(np.array(kv_wait)):.2f}; K/V landed -> step 0 tiles {us((first - kv)):.2f}")
    print(f"  producer: K/V issued {us(np.array(kv_after_loop)):.2f} us after the last loop's end; issue -> landed "
          f"{us(np.array(kv_load)):.2f}")
    print(f"  ticket fetched {us(np.array(fetch_rel)):+.2f} us from the last loop's end; math took it "
          f"{us(np.array(taken_rel)):+.2f} after its stores, set_item +{us(take - taken):.2f}")
    fi = np.array(first_item)
    print(f"  first items: taken at {us(take[fi]):.2f}, K/V landed +{us(kv[fi] - take[fi]):.2f}, "
          f"loop {us(per_step[fi]):.3f} a step")


if __name__ == "__main__":
    main()
