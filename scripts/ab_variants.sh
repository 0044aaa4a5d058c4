#!/usr/bin/env bash
# Builds the extension once per FAD_WIDE_MAX_D value into /tmp/ab/<value> and runs the quick
# perf probe on each, so two tile configurations are compared in one device call:
#   scripts/ab_variants.sh 128 64
set -euo pipefail
cd "$(dirname "$0")/.."
for w in "$@"; do
    rm -rf build flash_attn_det/_C*.so
    CFLAGS="-DFAD_WIDE_MAX_D=$w" NVCC_APPEND_FLAGS="-DFAD_WIDE_MAX_D=$w" FLASH_ATTN_DET_CUDA_ARCHS=90 \
        python3 setup.py build_ext --inplace > /tmp/ab_build_$w.log 2>&1 || { tail -20 /tmp/ab_build_$w.log; exit 1; }
    mkdir -p /tmp/ab/$w && rm -rf /tmp/ab/$w/flash_attn_det && cp -r flash_attn_det /tmp/ab/$w/
    echo "== FAD_WIDE_MAX_D=$w"
    PYTHONPATH=/tmp/ab/$w python3 scripts/quick_perf.py
done
