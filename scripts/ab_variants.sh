#!/usr/bin/env bash
# Builds the extension once per variant into /tmp/ab/<n> and runs the quick perf probe on each,
# so tile configurations are compared in one device call. A variant is a comma-separated list of
# preprocessor defines for both the C and the CUDA compiler:
#   scripts/ab_variants.sh FAD_D128_WARPS=8 FAD_D128_WARPS=4 FAD_D64_WARPS=4,FAD_D64_MIN_BLOCKS=4
# (the knobs are in csrc/fad_internal.h)
set -euo pipefail
cd "$(dirname "$0")/.."
n=0
for v in "$@"; do
    n=$((n + 1))
    defs=$(echo "$v" | tr ',' '\n' | sed 's/^/-D/' | tr '\n' ' ')
    rm -rf build flash_attn_det/_C*.so
    CFLAGS="$defs" NVCC_APPEND_FLAGS="$defs" FLASH_ATTN_DET_CUDA_ARCHS=90 \
        python3 setup.py build_ext --inplace > /tmp/ab_build_$n.log 2>&1 || { tail -20 /tmp/ab_build_$n.log; exit 1; }
    mkdir -p /tmp/ab/$n && rm -rf /tmp/ab/$n/flash_attn_det && cp -r flash_attn_det /tmp/ab/$n/
    echo "== variant $n: $v"
    PYTHONPATH=/tmp/ab/$n python3 scripts/quick_perf.py
done
