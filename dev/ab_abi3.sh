#!/usr/bin/env bash
# One device call: the stable-ABI module (_C.abi3.so, the default) against a version-specific
# one (FLASH_ATTN_DET_ABI3=0), both sm_90, built side by side; host time per call
# (benchmarks/bench_overhead.py) in alternating turns; then the GPU suite on the abi3 build
# (unless AB_NO_TESTS=1), and a CPU-only build's error on CUDA tensors.
#   dev/ab_abi3.sh            logs under $OUT (or ./device_out)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
root=/tmp/ab_abi3
rm -rf "$root" && mkdir -p "$root"
for v in abi3 noabi3 cpuonly; do
    mkdir -p "$root/$v"
    cp -r setup.py pyproject.toml build_backend csrc flash_attn_det tests benchmarks "$root/$v"/
    rm -f "$root/$v"/flash_attn_det/_C*.so
done
(cd "$root/abi3" && FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace > build.log 2>&1; echo $? > rc) &
(cd "$root/noabi3" && FLASH_ATTN_DET_ABI3=0 FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace > build.log 2>&1; echo $? > rc) &
(cd "$root/cpuonly" && FLASH_ATTN_DET_FORCE_CPU=1 python3 setup.py build_ext --inplace > build.log 2>&1; echo $? > rc) &
wait
for v in abi3 noabi3 cpuonly; do
    echo "$v: build rc $(cat $root/$v/rc), $(ls $root/$v/flash_attn_det/ | grep '^_C')"
    grep -h "took\|CPU-only" "$root/$v/build.log"
done
for round in 1 2 3; do
    for v in abi3 noabi3; do
        echo "== $v (round $round)"
        (cd "$root/$v" && PYTHONPATH=$PWD python3 benchmarks/bench_overhead.py --rounds 3 2>&1 | tail -8)
    done
done 2>&1 | tee "$out/overhead_abi3.txt"
echo "== CPU-only build on CUDA tensors"
(cd "$root/cpuonly" && PYTHONPATH=$PWD python3 -c "
import torch, flash_attn_det as f
q = torch.randn(1, 8, 2, 64, device='cuda', dtype=torch.bfloat16)
try:
    f.flash_attn_func(q, q, q)
    print('no error?!')
except Exception as e:
    print(type(e).__name__ + ':', e)
") 2>&1 | tail -2 | tee "$out/cpuonly_error.txt"
if [ "${AB_NO_TESTS:-0}" != 1 ]; then
    (cd "$root/abi3" && PYTHONPATH=$PWD python3 -m pytest -q tests > "$out/pytest_abi3.log" 2>&1)
    tail -4 "$out/pytest_abi3.log"
fi
