# ncu_sass_mix.py: Executed instructions by opcode per unit of work, from an ncu SASS export. Verdict: tool; it counted dropout's added instructions per score element.
"""Executed instructions by opcode per unit of work, from an `ncu --page source --print-source
sass --csv` export (dev/ncu_source.sh), one table per profiled kernel:

    python3 dev/ncu_sass_mix.py device_out/ncu_TAG_sass.csv.gz [UNIT ...]

UNIT (one per table, default 1): what to divide by, e.g. the executed count of one HGMMA of the
tile loop (one per warp and tile), to read instructions per warp and tile.
"""
import collections
import gzip
import sys

from ncu_sass_top import num, tables


def main():
    path = sys.argv[1]
    units = [float(u) for u in sys.argv[2:]]
    raw = gzip.open(path, "rt").read() if path.endswith(".gz") else open(path).read()
    for i, t in enumerate(tables(raw)):
        col = {h: j for j, h in enumerate(t["head"])}
        ex, src = col["Instructions Executed"], col["Source"]
        unit = units[i] if i < len(units) else 1.0
        by = collections.Counter()
        for r in t["rows"]:
            words = r[src].split()
            op = words[1] if words[0].startswith("@") else words[0]
            by[op.split(".")[0]] += num(r[ex])
        total = sum(by.values())
        print(f"== table {i}: {total:.0f} executed warp instructions, {total / unit:.1f} per unit")
        for op, n in by.most_common(30):
            print(f"  {op:10s} {n / unit:8.1f}")


if __name__ == "__main__":
    main()
