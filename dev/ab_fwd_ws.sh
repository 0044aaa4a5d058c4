#!/usr/bin/env bash
# ab_fwd_ws.sh: The warp-specialized forward against fwd_kernel's variants, same machine. Verdict: the warp-specialized kernel wins at D128, D256 and D64 from 2048 keys (the dispatch in fwd_launch.cu).
# Same-machine A/B of the forward's warp-specialized kernel: FLASH_ATTN_DET_FWD_WS=0 (fwd_kernel's
# wgmma variant at D64 in a build with FAD_WS_D64_CONSUMERS > 0, the mma.sync kernel at D128)
# against the default, bench_fwd's quick preset
# (or --filter $FILTER) with cuDNN in both layouts beside each, the two settings in alternating
# processes (the knob is read once a process), N turns (default 2). Tables in $OUT/run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}/run
mkdir -p "$out"
for turn in $(seq 1 "${1:-2}"); do
    for ws in 0 1; do
        FLASH_ATTN_DET_FWD_WS=$ws python3 benchmarks/bench_fwd.py --preset quick --rounds 2 --no-plot \
            ${FILTER:+--filter "$FILTER"} --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld \
            --out "$out" --tag "ab_fwd_ws${ws}_$turn" 2>>"$out/stderr.log" > /dev/null
    done
done
rm -f "$out"/ab_fwd_ws*.jsonl
for f in "$out"/ab_fwd_ws*.md; do echo "== $f"; grep -E '^\| [0-9]|^\| D' "$f"; done
