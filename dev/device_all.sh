#!/usr/bin/env bash
# device_all.sh: The whole GPU check in one device call: build, tests, verify, benchmarks, training check. Verdict: runner, no verdict of its own.
# One device call that shows the product on a GPU: build for sm_90, the whole
# test suite (CPU + GPU + C API), the verify job, the forward / backward / decode benchmarks,
# the training check and the host-overhead probe. Every log and result goes under $OUT/run
# (or ./device_out/run) and into one archive $OUT/results.tgz (the device returns few files).
#   dev/device_all.sh [stage ...]   stages: build probe quick test test1 test2 ncu decode fwd bwd
#                                       train verify overhead dropout dropprof fa_kvcache fa_rest
#                                       (default: build test decode fwd bwd train verify overhead)
# test1 / test2: the suite in two parts that each fit one call beside a build (the whole suite
# takes ~560 s on an H100, the call at most 600): contract, kvcache, varlen and backward (~2 min),
# then the rest (~7.5 min).
# dropout: dev/bench_dropout.py with the wgmma kernels and again with FLASH_ATTN_DET_WGMMA=0.
# dropprof: dev/prof_dropout.py, each kernel's time at p = 0 and 0.1 (where dropout's cost goes).
# fa_kvcache / fa_rest: flash_attn's file (tests/fa_compat, carry tests/fa_compat/.cache), 50 per
# function, its kvcache test (-n 4: the file's references at seqlen_k 131072 are large) or the
# rest (-n 8), FA_SEED as set or fresh, every outcome in fa_*.outcomes as it finishes.
# FLASH_ATTN_DET_COMMIT names the commit in the results when the copy has no .git of its own.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
run="$out/run"
mkdir -p "$run"
stages=${*:-build test decode fwd bwd train verify overhead}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
has() { [[ " $stages " == *" $1 "* ]]; }
finish() { tar czf "$out/results.tgz" -C "$out" run; }
trap finish EXIT
trap "exit 124" TERM INT

if has build; then
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader > "$run/build.log"
    rm -rf build flash_attn_det/_C*.so
    ( time FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace ) >> "$run/build.log" 2>&1 \
        || { tail -30 "$run/build.log"; exit 1; }
fi
# wgmma vs mma.sync: the bit probe, then the quick forward table with the Hopper variant on and off
has probe && { nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda tests/wgmma_probe.cu \
    -o "$run/wgmma_probe" && "$run/wgmma_probe" | tee "$run/wgmma_probe.txt"; rm -f "$run/wgmma_probe"; }
has quick && { python3 dev/quick_perf.py 2>&1 | tee "$run/quick_wgmma.txt";
    FLASH_ATTN_DET_WGMMA=0 python3 dev/quick_perf.py 2>&1 | tee "$run/quick_mma_sync.txt"; }
has test && { python3 -m pytest -q tests 2>&1 | tee "$run/pytest.log" | tail -3; }
part1="tests/test_contract.py tests/test_kvcache.py tests/test_varlen.py tests/test_backward.py"
has test1 && { python3 -m pytest -q -x -p no:randomly $part1 2>&1 | tee "$run/pytest_part1.log" | tail -3; }
has test2 && { python3 -m pytest -q -x -p no:randomly tests $(printf -- '--ignore=%s ' $part1) 2>&1 \
    | tee "$run/pytest_part2.log" | tail -3; }
has ncu && { ncu --clock-control none --profile-from-start off --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --section WarpStateStats \
    --section Occupancy --section LaunchStats python3 dev/ncu_fwd.py > "$run/ncu_fwd.txt" 2>&1;
    grep -E '^==|^  [a-z_]+.*\(|Duration|Throughput|Registers Per|Achieved Occ|Stall|Warp Cycles Per Issued' \
    "$run/ncu_fwd.txt" | head -150; }
has verify && python3 -m flash_attn_det.verify --json "$run/verify.json" 2>>"$run/stderr.log" \
    | tee "$run/verify.txt" | tail -4
has fwd && { python3 benchmarks/bench_fwd.py --preset quick --out "$run" --tag fwd_quick \
    2>>"$run/stderr.log" > /dev/null; cat "$run/fwd_quick.md"; }
has bwd && { python3 benchmarks/bench_bwd.py --preset quick --out "$run" --tag bwd_quick \
    2>>"$run/stderr.log" | tail -16; }
has decode && { python3 benchmarks/bench_decode.py --quick --out "$run" 2>>"$run/stderr.log" | tail -12; }
has train && { python3 examples/train_check.py --steps 300 --json "$run/train.json" 2>&1 \
    | grep -E '"(losses_equal|weights_equal|result|tokens_per_s)"'; }
has overhead && python3 benchmarks/bench_overhead.py 2>&1 | tee "$run/overhead.txt"
has dropout && { python3 dev/bench_dropout.py --out "$run/bench_dropout.md" 2>>"$run/stderr.log" | tail -13;
    FLASH_ATTN_DET_WGMMA=0 python3 dev/bench_dropout.py --out "$run/bench_dropout_mma_sync.md" \
    2>>"$run/stderr.log" > /dev/null; }
has dropprof && { python3 dev/prof_dropout.py --out "$run/prof_dropout.md" 2>>"$run/stderr.log" \
    | grep -E '^## |kernel<|^\| all' | head -60; }
export FA_SEED=${FA_SEED:-$(python3 -c 'import random; print(random.SystemRandom().randrange(1 << 31))')}
has fa_kvcache && { FA_LOG="$(cd "$run" && pwd)/fa_kvcache.outcomes" bash tests/fa_compat/run.sh -q ${FA_XDIST_KV--n 4} \
    -p no:randomly -rf -W ignore -k kvcache > "$run/fa_kvcache.log" 2>&1; tail -25 "$run/fa_kvcache.log"; }
has fa_rest && { FA_LOG="$(cd "$run" && pwd)/fa_rest.outcomes" bash tests/fa_compat/run.sh -q ${FA_XDIST--n 8} \
    -p no:randomly -rf -W ignore -k "not kvcache" > "$run/fa_rest.log" 2>&1; tail -30 "$run/fa_rest.log"; }
exit 0
