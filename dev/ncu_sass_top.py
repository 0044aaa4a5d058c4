# ncu_sass_top.py: The SASS instructions with the most warp-stall samples, from an ncu SASS export. Verdict: tool; it showed the consumers stall on their own chains.
"""Ranks the SASS instructions of an `ncu --page source --print-source sass --csv` export
(dev/ncu_source.sh) by warp-stall samples, and sums samples by stall reason:

    python3 dev/ncu_sass_top.py device_out/ncu_TAG_sass.csv.gz [N]

ncu writes one table per profiled kernel, each opened by its own header row; every table is
reported separately.
"""
import csv
import gzip
import io
import sys


def tables(text):
    """The CSV tables of the export: a header row starts each (its first cell is 'Address')."""
    cur = None
    for row in csv.reader(io.StringIO(text)):
        if row and row[0].strip('"') in ("Address", "# Address"):
            if cur:
                yield cur
            cur = {"head": row, "rows": []}
        elif cur is not None and len(row) == len(cur["head"]):
            cur["rows"].append(row)
        elif row and cur is None:
            print("  ", ",".join(row)[:160])
    if cur:
        yield cur


def num(x):
    try:
        return float(x.replace(",", ""))
    except ValueError:
        return 0.0


def report(t, n):
    head = t["head"]
    col = {h: i for i, h in enumerate(head)}
    src = col.get("Source", 1)
    samp = next((h for h in head if h.startswith("Warp Stall Sampling (All")), None)
    reasons = [h for h in head if h.startswith("stall_") or h.startswith("Stall ")]
    execd = next((h for h in head if h.startswith("Instructions Executed")), None)
    print(f"columns: {len(head)}; samples column: {samp}; executed column: {execd}")
    rows = t["rows"]
    total = sum(num(r[col[samp]]) for r in rows) if samp else 0
    print(f"instructions: {len(rows)}, stall samples: {total:.0f}")
    by_reason = sorted(((sum(num(r[col[h]]) for r in rows), h) for h in reasons), reverse=True)
    for v, h in by_reason[:14]:
        if v:
            print(f"  {h:40s} {v:10.0f} {100 * v / max(total, 1):5.1f}%")
    if samp:
        top = sorted(rows, key=lambda r: -num(r[col[samp]]))[:n]
        for r in top:
            why = sorted(((num(r[col[h]]), h) for h in reasons), reverse=True)[:3]
            whys = ", ".join(f"{h.replace('stall_', '')} {v:.0f}" for v, h in why if v)
            ex = r[col[execd]] if execd else ""
            print(f"{r[0]:>8} {num(r[col[samp]]):7.0f} {100 * num(r[col[samp]]) / max(total, 1):5.1f}% "
                  f"x{ex:>10}  {r[src][:60]:60s} {whys}")


def main():
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    raw = gzip.open(path, "rt").read() if path.endswith(".gz") else open(path).read()
    for i, t in enumerate(tables(raw)):
        print(f"== table {i}")
        report(t, n)


if __name__ == "__main__":
    main()
