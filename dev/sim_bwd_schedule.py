# sim_bwd_schedule.py: A model of the five-product dK/dV grid's dispatch under a causal mask: how much the last CTAs' lengths cost, and what other orders would do. Verdict: at the product's G the safe order (turns from the last key block down, that block first in blockIdx) keeps 96.4-97.0% of the SM time busy at L 2k-16k (D128, 32k tokens), longest-first 98.5-99.0% but it can hang, turns from the first block up 56-91%: the order costs the product 1.5-2.5% at most.
"""Greedy dispatch of the dK/dV kernel's CTAs (one an SM, in blockIdx order, each to the SM
that frees first) for one causal (sequence, kv head) pair shape repeated over `pairs` pairs,
with the dQ adds' turns: key block n walks row tiles from its diagonal up, one step each, and
its add to a tile waits for the add of the block before it in turn order (plus `lat` steps).
Times are in steps; every CTA also pays `over` steps of prologue and epilogue.

    python3 dev/sim_bwd_schedule.py

Orders (bwd_block.cuh, dkdv_work_of_cta; bwd_dq_accum.cuh's header):
  desc  the product: turns from the last key block down, blocks in blockIdx from the last
        (the shortest first), G pairs dealt in turn (FAD_BWD_DQ_SPAN / key blocks);
  flip  the same turns, blocks in blockIdx from the first (the longest first): a block then
        waits for blocks dispatched after it, so a pair's blocks must all be resident at once
        (64 CTAs at L8k, 128 at 16k). On a MIG slice, or beside kernels holding SMs, they are
        not, and the grid hangs: not an option for the product;
  asc   turns from the first key block up, blocks from the first: safe and longest first,
        but block n idles until block 0 has reached its diagonal.
(desc and asc in one pass, every wait being on a CTA dispatched before; flip by iterating
dispatch times and walks to a fixed point, at most 40 times.)
Prints, per shape and G, the share of SM time doing steps or overhead (1.0: no idle SM)."""
import heapq


def simulate(pairs, n_blocks, tiles_per_block, G, order, over=3.0, lat=0.3, sms=132):
    seq = []  # (pair, key block) in blockIdx order
    for first in range(0, pairs, G):
        group = list(range(first, min(first + G, pairs)))
        for r in range(n_blocks * len(group)):
            k = r // len(group)
            seq.append((group[r % len(group)], n_blocks - 1 - k if order == "desc" else k))
    n_tiles = n_blocks * tiles_per_block
    steps_of = {n: n_tiles - n * tiles_per_block for n in range(n_blocks)}
    work = sum(steps_of[n] + over for _, n in seq)

    def walk_one(job, t, added):  # a CTA's steps from t, its adds in turn order; returns its end
        p, n = job
        t += over
        for s in range(steps_of[n]):
            m = n * tiles_per_block + s
            t += 1.0
            before = added.get((p, m, n + 1 if order != "asc" else n - 1))
            if before is not None:
                t = max(t, before + lat)
            added[(p, m, n)] = t
        return t

    def dispatch(end_of):  # greedy: each CTA to the SM that frees first; end_of(job, start)
        free = [(0.0, i) for i in range(sms)]
        heapq.heapify(free)
        start, end = {}, {}
        for job in seq:
            t, i = heapq.heappop(free)
            start[job], end[job] = t, end_of(job, t)
            heapq.heappush(free, (end[job], i))
        return start, end

    if order != "flip":  # every wait is on a CTA dispatched before: one pass
        added = {}
        _, end = dispatch(lambda job, t: walk_one(job, t, added))
    else:  # waits on later CTAs: iterate dispatch and walks to a fixed point
        end = {}
        for _ in range(40):
            start, _ = dispatch(lambda job, t: end.get(job, t + over + steps_of[job[1]]))
            added, new = {}, {}
            for p in range(pairs):
                for n in range(n_blocks - 1, -1, -1):
                    new[(p, n)] = walk_one((p, n), start[(p, n)], added)
            if new == end:
                break
            end = new
    return work / sms / max(end.values())


if __name__ == "__main__":
    # (pairs, key blocks of 128, row tiles of 64 a block): the bench's D128 shapes, 32k tokens x 16 heads
    for shape, label in (((256, 16, 2), "L2k B16 H16"), ((64, 64, 2), "L8k B4 H16"), ((32, 128, 2), "L16k B2 H16")):
        for G in (1, 2, 4, 8):
            print(f"{label:12s} G {G}: " + "  ".join(
                f"{order} {simulate(*shape, G, order):.3f}" for order in ("desc", "flip", "asc")), flush=True)
