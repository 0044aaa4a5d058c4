#!/usr/bin/env bash
# One device call that does everything the GPU issues ask to be shown: build for sm_90, the
# whole test suite (CPU + GPU + C API), the verify job, and the forward benchmark. Logs and
# results go under $OUT (or ./device_out):
#   scripts/device_all.sh [bench preset: quick|full|seed|none]
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
preset=${1:-quick}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
# At most 8 files come back from the device: build.log, pytest.log, verify.txt, verify.json,
# stderr.log and the benchmark's .jsonl, .md and .png.
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$out/build.log"
rm -rf build flash_attn_det/_C*.so
( time FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace ) >> "$out/build.log" 2>&1 \
    || { tail -30 "$out/build.log"; exit 1; }
python3 -m pytest -q tests 2>&1 | tee "$out/pytest.log" | tail -3
python3 -m flash_attn_det.verify --json "$out/verify.json" 2>>"$out/stderr.log" | tee "$out/verify.txt"
if [ "$preset" != none ]; then
    python3 benchmarks/bench_fwd.py --preset "$preset" --out "$out" --tag "fwd_$preset" 2>>"$out/stderr.log" | tail -40
    cat "$out/fwd_$preset.md"
fi
