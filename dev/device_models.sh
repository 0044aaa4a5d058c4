#!/usr/bin/env bash
# One device call for batch-invariant models: build for sm_90, the GEMM probe, the blocks'
# and parity GPU tests, the parity tool on two 0.5B models (and their stock baseline), the
# end-to-end speed beside stock torch. Logs under $OUT (or ./device_out).
#   dev/device_models.sh [stage ...]   stages: build gemm test parity stock bench profile limits
#                                      suite1 suite2
# (BENCH_ARGS: extra arguments for bench_model.py; PROFILE_SHAPES: the profile's models)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
stages=${*:-build gemm test parity stock bench}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
has() { [[ " $stages " == *" $1 "* ]]; }
if has build; then
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/build.log"
    rm -rf build flash_attn_det/_C*.so
    ( time FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace ) >> "$out/build.log" 2>&1 \
        || { tail -30 "$out/build.log"; exit 1; }
    tail -3 "$out/build.log"
fi
has gemm && FLASH_ATTN_DET_GEMM_DEBUG=1 timeout 240 python3 dev/probe_gemm.py 2>"$out/gemm_plans.txt" | tee "$out/probe_gemm.md"
has test && timeout 300 python3 -m pytest -q -m gpu tests/test_blocks.py tests/test_parity.py 2>&1 \
    | tee "$out/pytest_blocks.log" | tail -4
P="--sequences 64 --new-tokens 32 --prompt-lengths 20,300"
if has parity; then
    for s in llama-0.5b qwen2-0.5b; do
        timeout 200 python3 -m flash_attn_det.parity --shape $s $P --grads 8 --json "$out/parity_$s.json" 2>&1 | tail -1
        timeout 200 python3 -m flash_attn_det.parity --shape $s $P --batch-size 16 --prefill-chunk-size 64 \
            --json "$out/parity_${s}_b16_chunk64.json" 2>&1 | tail -1
    done
fi
if has stock; then
    for s in llama-0.5b qwen2-0.5b; do
        timeout 200 python3 -m flash_attn_det.parity --shape $s $P --stock --json "$out/parity_${s}_stock.json" 2>&1 | tail -1
    done
fi
has bench && timeout 400 python3 benchmarks/bench_model.py ${BENCH_ARGS:-} --out "$out/bench_model.md" 2>&1 | tail -14
if has profile; then
    for s in ${PROFILE_SHAPES:-qwen2-0.5b llama-0.5b}; do
        FLASH_ATTN_DET_GEMM_DEBUG=1 timeout 200 python3 dev/profile_train.py --shape $s \
            > "$out/profile_$s.md" 2> "$out/profile_${s}_plans.txt"; grep "ms of kernels" "$out/profile_$s.md"
    done
    # the backward's sm_90a kernels also on grids below one CTA an SM (device.cu)
    FLASH_ATTN_DET_WGMMA=force timeout 200 python3 dev/profile_train.py --shape qwen2-0.5b --only invariant \
        > "$out/profile_qwen2-0.5b_wgmma_force.md" 2>&1; grep "ms of kernels" "$out/profile_qwen2-0.5b_wgmma_force.md"
fi
has limits && timeout 300 python3 -m pytest -q -p no:randomly tests/test_limits.py -k "cuda or gpu" -rfE \
    --tb=short 2>&1 | tee "$out/pytest_limits.log" | tail -20
has suite1 && timeout 580 python3 -m pytest -q -x -p no:randomly tests/test_contract.py tests/test_kvcache.py \
    tests/test_varlen.py tests/test_backward.py 2>&1 | tee "$out/pytest_part1.log" | tail -3
has suite2 && timeout 580 python3 -m pytest -q -x -p no:randomly tests --ignore=tests/test_contract.py \
    --ignore=tests/test_kvcache.py --ignore=tests/test_varlen.py --ignore=tests/test_backward.py 2>&1 \
    | tee "$out/pytest_part2.log" | tail -3
exit 0
