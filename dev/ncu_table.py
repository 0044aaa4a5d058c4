#!/usr/bin/env python3
# ncu_table.py: An Nsight Compute text report as one Markdown table. Verdict: tool, no verdict of its own.
"""Nsight Compute's text report (`ncu --section SpeedOfLight --section ComputeWorkloadAnalysis
--section WarpStateStats --section LaunchStats ...`, as dev/ncu_fwd.py runs it) as one Markdown
table: per profiled kernel its case (the `== tag` line dev/ncu_fwd.py prints before the
`==PROF== Profiling` line of that kernel; ncu prints the reports after the process ends), name,
grid x block, duration, the highest-utilized pipeline and its share, the tensor-busy time
(duration x that share, where the pipeline is the tensor one: "Tensor" or "Shared", which ncu
names when the tensor pipe shares it with fp64), issue slots busy, warp cycles per issued
instruction, L2 and DRAM throughput, and the top stall ncu's rule names.

    python3 dev/ncu_table.py REPORT.txt [> table.md]
"""
import re
import sys


def short(name):
    name = re.sub(r"\(\w*_args\)", "", name)  # (the kernels' one argument struct)
    name = name.replace("void ", "").replace("__nv_bfloat16", "bf16")
    m = re.search(r"sm90_flash_fprop_wgmma_f16_(knob_\d+_\w+?)_\d+x\d+x\d+_cga", name)
    if m:
        return "cuDNN sm90 flash_fprop (" + m.group(1) + ")"
    return name.strip()


def parse(lines):
    rows, case, cur, pending = [], None, None, []
    for i, line in enumerate(lines):
        if line.startswith("== "):
            case = line[3:].strip()
            continue
        if line.startswith("==PROF== Profiling"):
            pending.append(case)  # the kernels' reports come later, in this order
            continue
        m = re.match(r"^  (\S.*?) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\), Context", line)
        if m:
            g = [int(x) for x in m.groups()[1:]]
            cur = {"case": pending.pop(0) if pending else case, "kernel": short(m.group(1)),
                   "grid": g[0] * g[1] * g[2], "block": g[3] * g[4] * g[5]}
            rows.append(cur)
            continue
        if cur is None:
            continue
        m = re.match(r"^\s+Duration\s+(us|ms|ns)\s+([\d,.]+)", line)
        if m:
            v = float(m.group(2).replace(",", ""))
            cur["us"] = v * {"us": 1, "ms": 1e3, "ns": 1e-3}[m.group(1)]
        for key, pat in (("issue", r"Issue Slots Busy\s+%\s+([\d.]+)"),
                         ("cpi", r"Warp Cycles Per Issued Instruction\s+cycle\s+([\d.]+)"),
                         ("l2", r"L2 Cache Throughput\s+%\s+([\d.]+)"),
                         ("dram", r"DRAM Throughput\s+%\s+([\d.]+)")):
            m = re.search(pat, line)
            if m:
                cur[key] = float(m.group(1))
        m = re.search(r"(\w+) is the highest-utilized pipeline \(([\d.]+)%\)", line)
        if m:
            cur["pipe"], cur["pipe_pct"] = m.group(1), float(m.group(2))
        m = re.search(r"stalled waiting for (.*)", line)
        if m and "stall" not in cur:
            text = m.group(1).strip()
            j = i + 1
            while j < len(lines) and not text.rstrip().endswith(".") and lines[j].startswith(" " * 10):
                text += " " + lines[j].strip()
                j += 1
            cur["stall"] = text.split(". ")[0].rstrip(".")[:70]
        m = re.search(r"each warp of this workload spends ([\d.]+) cycles being stalled", line)
        if m and "stall_cycles" not in cur:
            cur["stall_cycles"] = float(m.group(1))
    return rows


def main():
    rows = parse(open(sys.argv[1]).read().splitlines())
    print("| case | kernel | grid x block | duration (us) | top pipe | tensor-busy (us) | issue busy | "
          "cycles / issue | L2 | DRAM | top stall (cycles of the issue gap) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        tensor = r.get("pipe") in ("Tensor", "Shared")
        busy = f"{r['us'] * r['pipe_pct'] / 100:.1f}" if tensor and "us" in r else "-"
        pipe = f"{r.get('pipe', '-')} {r.get('pipe_pct', 0):.1f}%" if "pipe" in r else "-"
        stall = f"{r['stall']} ({r['stall_cycles']:.1f})" if "stall" in r and "stall_cycles" in r else "-"
        print(f"| {r['case']} | {r['kernel']} | {r['grid']:,} x {r['block']} | {r.get('us', 0):.1f} | {pipe} | "
              f"{busy} | {r.get('issue', 0):.1f}% | {r.get('cpi', 0):.2f} | {r.get('l2', 0):.1f}% | "
              f"{r.get('dram', 0):.1f}% | {stall} |")


if __name__ == "__main__":
    main()
