#!/usr/bin/env bash
# device_bwd_check.sh: One device call that checks a backward candidate module. Verdict: runner, no verdict of its own.
# The candidate is dev/abi/_C_cand.abi3.so, carried as .carry/abi.tar.xz (xz-compressed tar of
# dev/abi/_C_*.abi3.so: a module is ~32 MB, ~8 MB compressed, under the device's carry limit) with
# the builds it is compared to. Stages (STAGES, default all): ab (dev/ab_so.sh, AB_BUILDS against
# the candidate, the dq preset, FLASH_ATTN_DET_BWD_DQ=reduce), bench (bench_bwd.py quick and gqa with
# reduce, cuDNN in both layouts), test_red (the backward's GPU tests with reduce), test_def (with the
# default setting), bits (dev/grads_bits.py: _C_base's gradients against BITS_BUILDS', default
# cand, bit for bit; each module under a timeout of BITS_TIMEOUT s, default 120, so that a kernel
# that hangs costs that, not the call), san (compute-sanitizer racecheck + synccheck on
# dev/sanitize_gpu.py bwd), train
# (examples/train_check.py with reduce, its JSON). Summary in $OUT/summary.log; the logs end in
# $OUT/logs.tar.gz (the device returns at most 8 files). Modules come from dev/variant_so.sh or a
# full build.
#   tar cf - -C dev/abi _C_base.abi3.so _C_cand.abi3.so | xz -T2 > .carry/abi.tar.xz
#   (device) AB_BUILDS="base cand" bash dev/device_bwd_check.sh     (carry [".carry"])
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}; mkdir -p "$out"; log=$out/summary.log
mkdir -p dev/abi && tar xJf .carry/abi.tar.xz -C dev/abi
export PYTHONPATH=$PWD
cp dev/abi/_C_cand.abi3.so flash_attn_det/_C.abi3.so
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv >> $log
python3 -c "import flash_attn_det._C as c; print(c.BUILD)" >> $log 2>&1
t0=$(date +%s)
left() { echo $(( ${DEADLINE:-575} - ($(date +%s) - t0) )); }
stage() { echo "=== $1 ($(( $(date +%s) - t0 )) s)" >> $log; }
has() { [[ " ${STAGES:-bits ab bench test_red test_def san train} " == *" $1 "* ]]; }
if has bits; then stage bits  # every gradient of dev/grads_bits.py's cases against _C_base's, bit for bit
  cp dev/abi/_C_base.abi3.so flash_attn_det/_C.abi3.so
  timeout ${BITS_TIMEOUT:-120} python3 dev/grads_bits.py $out/ref.pt >> $log 2>&1 || echo "base: rc $?" >> $log
  for b in ${BITS_BUILDS:-cand}; do cp dev/abi/_C_$b.abi3.so flash_attn_det/_C.abi3.so
    echo -n "$b: " >> $log
    timeout ${BITS_TIMEOUT:-120} python3 dev/grads_bits.py $out/ref.pt cmp >> $log 2>&1
    case $? in 0) ;; 124) echo "hung: no result in ${BITS_TIMEOUT:-120} s" >> $log ;; *) echo "rc $?" >> $log ;; esac
  done
  cp dev/abi/_C_cand.abi3.so flash_attn_det/_C.abi3.so; rm -f $out/ref.pt
fi
if has ab; then stage ab
  FLASH_ATTN_DET_BWD_DQ=reduce BENCH=bwd PRESET=dq BUILDS="${AB_BUILDS:-base cand}" bash dev/ab_so.sh 2 >> $log 2>&1
  rm -rf $out/run; cp dev/abi/_C_cand.abi3.so flash_attn_det/_C.abi3.so
fi
if has bench; then for preset in ${PRESETS:-quick gqa}; do stage "bench $preset"
  FLASH_ATTN_DET_BWD_DQ=reduce python3 benchmarks/bench_bwd.py --preset $preset --rounds 2 \
    --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --out $out --tag bwd_reduce_$preset 2>>$out/stderr.log > /dev/null
  grep -E '^\| [0-9]' $out/bwd_reduce_$preset.md | cut -c1-100 >> $log
done; fi
if has test_red; then stage test_red
  FLASH_ATTN_DET_BWD_DQ=reduce timeout $(left) python3 -m pytest -q -p no:randomly tests/test_bwd_dq_reduce.py \
     tests/test_backward.py tests/test_contract.py tests/test_varlen.py \
     -k "not test_gpu_wgmma_and_mma_sync_backward_bit_equal" > $out/test_red.log 2>&1
  tail -3 $out/test_red.log >> $log; grep -E "^FAILED|Error|assert" $out/test_red.log | head -20 >> $log
fi
if has test_def; then stage test_def
  timeout $(left) python3 -m pytest -q -p no:randomly tests/test_backward.py tests/test_dropout.py \
     tests/test_head_dim_pad.py tests/test_mask_forms.py > $out/test_def.log 2>&1
  tail -3 $out/test_def.log >> $log; grep -E "^FAILED" $out/test_def.log | head -20 >> $log
fi
if has san; then stage san
  FLASH_ATTN_DET_BWD_DQ=reduce SANITIZE_ARGS=bwd WGMMA_SETTINGS=force timeout $(left) bash dev/sanitize_gpu.sh racecheck synccheck >> $log 2>&1
  mv $out/sanitize_racecheck_wgmmaforce.log $out/sanitize_racecheck_reduce.log
  SANITIZE_ARGS=bwd WGMMA_SETTINGS=force timeout $(left) bash dev/sanitize_gpu.sh racecheck >> $log 2>&1
fi
if has train; then stage train
  FLASH_ATTN_DET_BWD_DQ=reduce timeout $(left) python3 examples/train_check.py --json $out/train_reduce.json \
    > $out/train_check.log 2>&1; echo "train_check rc $?" >> $log
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print(d['result'], {k: v['tokens_per_s'] for k, v in d['speed'].items()})" \
    $out/train_reduce.json >> $log 2>&1
fi
rm -f $out/*.jsonl
(cd $out && tar czf logs.tar.gz --remove-files $(ls *.log 2>/dev/null | grep -v '^summary.log$') 2>/dev/null)
stage end
