#!/usr/bin/env bash
# A short device call on a merged build: build for the GPU here, then the GPU tests of the
# newest parts (blocks, parity, limits, first failures) and the contract's, each file's
# summary to $OUT/smoke.log as it finishes.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
rm -rf build flash_attn_det/_C*.so
( time python3 setup.py build_ext --inplace ) > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
grep -E "flash_attn_det:|real" "$out/build.log" | tail -4 | tee "$out/smoke.log"
for t in tests/test_blocks.py tests/test_parity.py tests/test_limits.py tests/test_first_failures.py \
         tests/test_contract.py; do
    echo "== $t" >> "$out/smoke.log"
    python3 -m pytest -q -k "cuda or gpu" -p no:randomly "$t" 2>&1 | tail -4 >> "$out/smoke.log"
    tail -2 "$out/smoke.log"
done
