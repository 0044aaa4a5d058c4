#!/usr/bin/env bash
# device_probe.sh: One device call of backward probes on prebuilt modules (dev/variant_so.sh). Verdict: runner, no verdict of its own.
# Modules travel as .carry/abi.tar.xz (tar of dev/abi/_C_*.abi3.so, xz); carry [".carry"].
# Stages (STAGES): test (pytest ${TEST_FILES} with FLASH_ATTN_DET_BWD_DQ=reduce on each of
# TEST_BUILDS, a timeout each: a candidate that hangs fails here), ab (dev/ab_so.sh, BUILDS,
# PRESETS, reduce), ncu (dev/ncu_source.sh on the dK/dV kernel of NCU_ARGS for each of NCU_BUILDS),
# rate (dev/wgmma_rate.cu: the tensor pipe's rate per wgmma shape, built there).
# Summary in $OUT/summary.log.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}; mkdir -p "$out"; log=$out/summary.log
mkdir -p dev/abi && tar xJf .carry/abi.tar.xz -C dev/abi
export PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> $log
t0=$(date +%s)
left() { echo $(( ${DEADLINE:-575} - ($(date +%s) - t0) )); }
stage() { echo "=== $1 ($(( $(date +%s) - t0 )) s)" >> $log; }
has() { [[ " ${STAGES:-test ab ncu} " == *" $1 "* ]]; }
use() { cp "dev/abi/_C_$1.abi3.so" flash_attn_det/_C.abi3.so; }
if has test; then for b in ${TEST_BUILDS:-}; do stage "test $b"
  use $b
  FLASH_ATTN_DET_BWD_DQ=reduce timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -p no:randomly \
    ${TEST_FILES:-tests/test_bwd_dq_reduce.py} > $out/test_$b.log 2>&1; echo "rc $?" >> $log
  tail -2 $out/test_$b.log >> $log; grep -E "^FAILED|Error" $out/test_$b.log | head -5 >> $log
done; fi
if has ab; then for preset in ${PRESETS:-dq}; do stage "ab $preset"
  FLASH_ATTN_DET_BWD_DQ=reduce BENCH=bwd PRESET=$preset BUILDS="${BUILDS:-base}" timeout $(left) bash dev/ab_so.sh ${TURNS:-2} >> $log 2>&1
  tail -3 $out/run/stderr.log >> $log 2>/dev/null; mv $out/run $out/ab_$preset
done; fi
if has ncu; then for b in ${NCU_BUILDS:-base}; do stage "ncu $b"
  use $b
  FLASH_ATTN_DET_BWD_DQ=reduce KERNELS=dkdv_wgmma timeout $(left) bash dev/ncu_source.sh $b python3 dev/ncu_bwd.py ${NCU_ARGS:-128 8192 4 16 0}
  python3 dev/ncu_sass_top.py $out/ncu_${b}_sass.csv.gz 25 > $out/ncu_${b}_top.txt 2>&1
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit|DRAM Throughput" $out/ncu_$b.txt | head -6 >> $log
done; fi
if has rate; then stage rate
  nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc dev/wgmma_rate.cu -o /tmp/wgmma_rate \
    > $out/wgmma_rate.log 2>&1 && timeout 120 /tmp/wgmma_rate >> $out/wgmma_rate.log 2>&1
  grep -E "FLOP|rror" $out/wgmma_rate.log >> $log
fi
stage end
