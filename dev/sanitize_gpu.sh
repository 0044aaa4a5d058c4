#!/usr/bin/env bash
# sanitize_gpu.sh: compute-sanitizer's four tools over dev/sanitize_gpu.py. Verdict: clean, wgmma forced and mma.sync only (H100).
# compute-sanitizer over every CUDA kernel variant (dev/sanitize_gpu.py), each of the four tools,
# with FLASH_ATTN_DET_WGMMA=force (the wgmma variants wherever they exist, the backward's on these
# small grids too) and =0 (mma.sync everywhere). torch's caching
# allocator is off so that memcheck sees each buffer's real bounds. Logs under $OUT (or
# ./device_out); prints each run's ERROR SUMMARY. Needs a built module (dev/device_all.sh build).
#   bash dev/sanitize_gpu.sh [tool ...]      tools: memcheck racecheck initcheck synccheck
# SANITIZE_ARGS=bwd: the backward's calls alone (dev/sanitize_gpu.py bwd), =ws: the warp-specialized forward's; WGMMA_SETTINGS="force"
# (default "force 0"): which FLASH_ATTN_DET_WGMMA settings run.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
export PYTHONPATH=$PWD PYTORCH_NO_CUDA_MEMORY_CACHING=1
tools=${*:-memcheck racecheck initcheck synccheck}
fail=0
for tool in $tools; do
    for wg in ${WGMMA_SETTINGS:-force 0}; do
        log="$out/sanitize_${tool}_wgmma${wg}.log"
        FLASH_ATTN_DET_WGMMA=$wg timeout 900 compute-sanitizer --tool "$tool" \
            --target-processes all python3 dev/sanitize_gpu.py ${SANITIZE_ARGS:-} > "$log" 2>&1
        rc=$?
        summary=$(grep -h "ERROR SUMMARY\|RACECHECK SUMMARY" "$log" | tail -1)
        ran=$(grep -c "^ok " "$log")
        echo "$tool wgmma=$wg: rc $rc, $ran calls ok, ${summary:-no summary}"
        grep -q "all variants ran" "$log" || fail=1
        [[ "$summary" == *" 0 error"* || "$summary" == *" 0 hazard"* ]] || fail=1
    done
done
exit $fail
