# sim_decode_shares.py: A fluid model of batched decode schedules (a CTA per split, a CTA a row block, and one wave of CTAs each taking a balanced, contiguous share of the batch's (row block, split) items, read from the lengths in the kernel). Verdict: with the defaults, shares of one or two CTAs an SM come within 3-14% of the bytes' time in every case modelled (B1 128k, B8-B32 at 8k-32k, two mixed batches), a CTA a row block loses about 7x on mixed lengths; calibrated only on H200 figures (4.6 TB/s whole, 40 GB/s a CTA), the share schedule not measured.
"""Fluid model of one decode call's K/V streaming (GQA 32/8 D128 bf16, 512-key splits):

    python3 dev/sim_decode_shares.py [--bw 4.6] [--cta-rate 40] [--sms 132]
    python3 dev/sim_decode_shares.py --check   (dev/probe_decode_shares.patch's share arithmetic)

Every active CTA streams at min(cta_rate, bw / active) GB/s; a CTA pays `start_us` before its
first tile, `switch_us` each time it moves to another row block (Q reload, pipeline refill), and
a schedule that writes partials pays `combine_us` after its last CTA. Schedules:

  split  a CTA per split, 2 an SM, the SMs taking the next CTA as one frees (today's plan below
         1.9 CTAs an SM); its waves start in step here, so the model overstates it (B16 32k:
         573 us modelled, 500 measured): compare the shares with rowblk, which the measurement
         at B16 calibrates;
  rowblk one CTA a row block (num_splits=1), 2 an SM;
  shareN one wave of N CTAs an SM (shareR: a multiple of the row blocks where they fit in one
         CTA an SM, dev/probe_decode_shares.patch's count), CTA c taking items [c W / C, (c + 1) W / C) of the W
         (row block, split) items in row-block order; a row block inside one share needs no
         partials, a cut one does (the combine then runs).

Calibration (H200, benchmarks/results/2026-12-01_h200_decode_combine_tail.md, section 4): one CTA a
row block at B16 reads 1.00x cuDNN (about 4.6 TB/s), at B8 0.56-0.60x (64 CTAs: about 40 GB/s a
CTA). Prints each schedule's modelled time and its ratio to the bytes at `bw`.
"""
import argparse
import heapq

HKV, D, S = 8, 128, 512
ROW_BYTES = D * 2 * 2  # K and V, bf16, one kv head


def items_of(lengths):
    """(row block, splits) per (sequence, kv head), decode: one row block of 4 query heads."""
    rows = []
    for b, L in enumerate(lengths):
        for h in range(HKV):
            rows.append((b * HKV + h, (L + S - 1) // S, L))
    return rows


def fluid(ctas, bw, cta_rate, slots, start_us):
    """ctas: list of work lists [(kind, amount)], kind 'b' bytes or 't' fixed us. Dispatch in
    order onto `slots` concurrent slots; returns the end time in us."""
    t = 0.0
    pending = list(range(len(ctas)))[::-1]
    active = {}  # cta -> [remaining items, current remaining]
    ends = []

    def load(c):
        work = [("t", start_us)] + list(ctas[c])
        active[c] = work

    while pending and len(active) < slots:
        load(pending.pop())
    while active:
        n_bytes = sum(1 for w in active.values() if w and w[0][0] == "b")
        rate = min(cta_rate, bw / max(n_bytes, 1)) * 1e3  # bytes/us (GB/s = 1e3 B/us)
        # time to the next event
        dt = min((w[0][1] / rate if w[0][0] == "b" else w[0][1]) for w in active.values())
        t += dt
        done = []
        for c, w in active.items():
            kind, amt = w[0]
            amt -= dt * rate if kind == "b" else dt
            if amt <= 1e-9:
                w.pop(0)
                if not w:
                    done.append(c)
            else:
                w[0] = (kind, amt)
        for c in done:
            del active[c]
            ends.append(t)
            if pending:
                load(pending.pop())
    return t


def schedules(lengths, sms, bw, cta_rate, start_us, switch_us, combine_us):
    rows = items_of(lengths)
    total = sum(L for _, _, L in rows) * ROW_BYTES
    out = {}
    # a CTA per split
    ctas = []
    for _, n, L in rows:
        for s in range(n):
            ctas.append([("b", min(S, L - s * S) * ROW_BYTES)])
    out["split"] = fluid(ctas, bw, cta_rate, 2 * sms, start_us) + combine_us
    # a CTA a row block
    ctas = [[("b", L * ROW_BYTES)] for _, n, L in rows if n]
    out["rowblk"] = fluid(ctas, bw, cta_rate, 2 * sms, start_us)
    # one wave of balanced contiguous shares
    flat = [(r, s, min(S, L - s * S)) for r, n, L in rows for s in range(n)]
    W = len(flat)
    R = sum(1 for _, n, _ in rows if n)
    for per_sm in (1, 2, "R"):
        if per_sm == "R":  # the probe's count: a multiple of the row blocks where they fit in a wave
            C = min(R * (sms // R) if R <= sms else sms, W)
        else:
            C = min(per_sm * sms, W)
        ctas, cut = [], set()
        owner = {}
        for c in range(C):
            lo, hi = c * W // C, (c + 1) * W // C
            work, prev = [], None
            for r, s, k in flat[lo:hi]:
                if prev is not None and r != prev:
                    work.append(("t", switch_us))
                work.append(("b", k * ROW_BYTES))
                owner.setdefault(r, set()).add(c)
                prev = r
            ctas.append(work)
        cut = [r for r, cs in owner.items() if len(cs) > 1]
        t = fluid(ctas, bw, cta_rate, C, start_us) + (combine_us if cut else 0.0)
        out[f"share{per_sm}"] = t
        out[f"share{per_sm}_cut"] = len(cut)
    return total, out


def check_shares(trials=2000, seed=1):
    """The arithmetic of dev/probe_decode_shares.patch, replayed: every CTA's pieces (the kernel's
    binary search over the splits before each sequence), each (row block, split) item walked once,
    and the combine's owner test agreeing with which row blocks a share holds whole."""
    import random
    rnd = random.Random(seed)
    for _ in range(trials):
        B, hkv = rnd.randint(2, 40), rnd.choice([1, 2, 8])
        lens = [rnd.choice([0, 1, 100, 512, 513, 2048, 8192, 32768, rnd.randint(0, 40000)]) for _ in range(B)]
        if not any(lens):
            continue
        rows = B * hkv
        C = rnd.choice([1, 7, 132, 264, rows, 2 * rows])
        n = [(L + S - 1) // S for L in lens]
        pre = [0]
        for x in n:
            pre.append(pre[-1] + x)
        W = hkv * pre[B]
        seen, whole = {}, set()
        for c in range(C):
            i, hi = c * W // C, (c + 1) * W // C
            while i < hi:
                lo_b, hi_b = 0, B - 1
                while lo_b < hi_b:
                    mid = (lo_b + hi_b + 1) // 2
                    if hkv * pre[mid] <= i:
                        lo_b = mid
                    else:
                        hi_b = mid - 1
                b = lo_b
                nb = pre[b + 1] - pre[b]
                assert nb > 0
                j = i - hkv * pre[b]
                hk, s0 = j // nb, j % nb
                s1 = min(nb, s0 + (hi - i))
                for s in range(s0, s1):
                    assert (b, hk, s) not in seen
                    seen[(b, hk, s)] = c
                if s0 == 0 and s1 == nb:
                    whole.add((b, hk))
                i += s1 - s0
        assert len(seen) == W
        owner = lambda i: ((i + 1) * C - 1) // W
        for b in range(B):
            for hk in range(hkv):
                if n[b]:
                    off = hkv * pre[b] + hk * n[b]
                    assert (owner(off) == owner(off + n[b] - 1)) == ((b, hk) in whole)
                    assert seen[(b, hk, 0)] == owner(off)
    return trials


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true",
                    help="replay dev/probe_decode_shares.patch's share arithmetic on random batches")
    ap.add_argument("--bw", type=float, default=4.6, help="TB/s, the whole GPU")
    ap.add_argument("--cta-rate", type=float, default=40.0, help="GB/s, one CTA at most")
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--start-us", type=float, default=3.0)
    ap.add_argument("--switch-us", type=float, default=3.0)
    ap.add_argument("--combine-us", type=float, default=4.0)
    a = ap.parse_args()
    if a.check:
        print(f"share arithmetic: {check_shares()} random batches, every item walked once, "
              f"the combine's owner test agreeing")
        return 0
    bw = a.bw * 1e3  # GB/s
    cases = {
        "B1 128k": [131072],
        "B8 8k": [8192] * 8,
        "B16 8k": [8192] * 16,
        "B8 32k": [32768] * 8,
        "B16 32k": [32768] * 16,
        "B32 8k": [8192] * 32,
        "B16 one 32k + 15 x 2k": [32768] + [2048] * 15,
        "B8 1k..32k": [1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768],
    }
    print(f"model: {a.bw} TB/s, {a.cta_rate} GB/s a CTA, {a.sms} SMs, start {a.start_us} us, "
          f"switch {a.switch_us} us, combine {a.combine_us} us")
    print("| case | bytes at bw (us) | split | rowblk | share1 (cut rows) | share2 (cut rows) | shareR (cut rows) |")
    print("|---|---|---|---|---|---|---|")
    for name, lengths in cases.items():
        total, o = schedules(lengths, a.sms, bw, a.cta_rate, a.start_us, a.switch_us, a.combine_us)
        ideal = total / (bw * 1e3)
        print(f"| {name} | {ideal:.1f} | {o['split']:.1f} | {o['rowblk']:.1f} | "
              f"{o['share1']:.1f} ({o['share1_cut']}) | {o['share2']:.1f} ({o['share2_cut']}) | "
              f"{o['shareR']:.1f} ({o['shareR_cut']}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
