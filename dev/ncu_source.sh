#!/usr/bin/env bash
# ncu_source.sh: Nsight Compute's full set with source counters on chosen kernels, exported as CSV. Verdict: runner for the two ncu_sass_* tools.
# Where a kernel's warps stall, instruction by instruction: Nsight Compute's full set (with
# the source counters' warp-state samples) on the kernels whose names match $KERNELS of one
# `dev/ncu_fwd.py` / `dev/ncu_bwd.py` run, then the SASS table of each profiled kernel as CSV
# (per instruction: executed count and stall samples by reason) beside the details page.
#
#   KERNELS='fwd_ws_kernel|sdpa' bash dev/ncu_source.sh TAG python3 dev/ncu_fwd.py
#
# Writes $OUT/ncu_TAG.txt (details) and $OUT/ncu_TAG_sass.csv. Read the CSV with
# dev/ncu_sass_top.py, which ranks instructions by stall samples.
set -uo pipefail
cd "$(dirname "$0")/.."
tag=$1
shift
out=${OUT:-device_out}
mkdir -p "$out"
rep=/tmp/ncu_$tag
ncu --clock-control none --profile-from-start off --set full --import-source no \
    -k "regex:${KERNELS:-fwd_ws_kernel}" -f -o "$rep" "$@" > "$out/ncu_${tag}_run.log" 2>&1
ncu -i "$rep.ncu-rep" --page details > "$out/ncu_$tag.txt" 2>&1
ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$out/ncu_${tag}_sass.csv" 2>&1
gzip -f "$out/ncu_${tag}_sass.csv"
