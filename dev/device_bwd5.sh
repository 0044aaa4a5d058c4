#!/usr/bin/env bash
# One device call (an H200 or H100; < 9 minutes) for the five-product backward
# (FLASH_ATTN_DET_BWD_DQ=reduce): an sm_90 build, then
#   1. tests/test_bwd_dq_reduce.py: both settings against float64 on fresh inputs with the
#      gradients poisoned, dk/dv bit-equal across the settings; run to run, B=1 vs B=4,
#      padded vs varlen and the parts bit-equal (D64/D96/D128, causal or not, GQA 4:1,
#      window, softcap, ALiBi);
#   2. benchmarks/bench_bwd.py --preset quick with each setting, cuDNN in the same run;
#   3. tests/test_backward.py's GPU tests with the switch set (less the one that compares dq
#      with the mma.sync kernels' bits, which the reduce setting changes on purpose);
#   4. compute-sanitizer racecheck and synccheck on one small reduce call (when present);
#   5. if the budget (BUDGET_S, default 520 s) allows, bench_bwd.py --preset gqa likewise.
# Every step runs under `timeout` (a deadlock must not eat the call); logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
log="$out/summary.log"
budget=${BUDGET_S:-520} # steps that would start past this many seconds are skipped
step() { # name, seconds, command...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    if ((SECONDS + 20 > budget)); then echo "== $name: skipped (budget)" | tee -a "$log"; return 0; fi
    ((secs > budget - SECONDS)) && secs=$((budget - SECONDS))
    timeout -k 10 "$secs" "$@" > "$out/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc ($((SECONDS - t0)) s; 124/137: timed out)" | tee -a "$log"
    tail -25 "$out/$name.log" >> "$log"
    return $rc
}
rm -rf build flash_attn_det/_C*.so
FLASH_ATTN_DET_CUDA_ARCHS=90 step build 260 python3 setup.py build_ext --inplace || { tail -40 "$out/build.log"; exit 1; }
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv,noheader >> "$log" 2>&1

# A short first look (40 s): one small and two multi-CTA calls with the switch set, dq against
# float64. A hang here (rc 124/137) means every later reduce step would hang too: they are
# skipped, so that the recompute benchmark still comes back from the call.
cat > "$out/smoke.py" <<'EOF'
import torch, flash_attn_det as fad
from flash_attn_det.testing import attention_ref
g = torch.Generator().manual_seed(5)
for B, L, H, Hk, D, causal in ((1, 300, 2, 1, 64, True), (4, 1100, 16, 4, 128, True), (2, 900, 8, 8, 64, False)):
    q = torch.randn(B, L, H, D, generator=g).to(torch.bfloat16).cuda().requires_grad_()
    k, v = (torch.randn(B, L, Hk, D, generator=g).to(torch.bfloat16).cuda().requires_grad_() for _ in range(2))
    dout = torch.randn(B, L, H, D, generator=g).to(torch.bfloat16).cuda()
    fad.flash_attn_func(q, k, v, causal=causal).backward(dout)
    torch.cuda.synchronize()
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    attention_ref(qd, kd, vd, causal=causal)[0].backward(dout.double())
    err = float((q.grad.double() - qd.grad).norm() / qd.grad.norm())
    print(f"B{B} L{L} H{H}/{Hk} D{D} causal={causal}: dq rel err {err:.2e}", flush=True)
    assert err < 6e-3, err
print("ok")
EOF
hung=0
FLASH_ATTN_DET_BWD_DQ=reduce step smoke_reduce 40 python3 "$out/smoke.py"
rc=$?
if ((rc == 124 || rc == 137)); then
    hung=1
    echo "== smoke_reduce timed out: a hang; the later reduce steps are skipped" | tee -a "$log"
fi
reduce_step() { # step, unless the smoke call hung
    if ((hung)); then echo "== $1: skipped (smoke_reduce hung)" | tee -a "$log"; return 0; fi
    step "$@"
}

reduce_step test_reduce 150 python3 -m pytest -q -x -s -p no:randomly tests/test_bwd_dq_reduce.py
for mode in recompute reduce; do
    s=step; [[ $mode == reduce ]] && s=reduce_step
    FLASH_ATTN_DET_BWD_DQ=$mode $s "bench_$mode" 100 python3 benchmarks/bench_bwd.py --preset quick \
        --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --rounds 2 --out "$out/bench" --tag "bwd_quick_$mode"
done
FLASH_ATTN_DET_BWD_DQ=reduce reduce_step test_backward_reduce 100 python3 -m pytest -q -p no:randomly \
    tests/test_backward.py -k "gpu or parts or writes" \
    --deselect tests/test_backward.py::test_gpu_wgmma_and_mma_sync_backward_bit_equal

if ((hung)); then
    echo "== sanitizers: skipped (smoke_reduce hung)" | tee -a "$log"
elif command -v compute-sanitizer > /dev/null; then
    cat > "$out/san_call.py" <<'EOF'
import torch, flash_attn_det as fad
g = torch.Generator().manual_seed(3)
for D, causal in ((64, True), (128, False)):
    q, k, v = (torch.randn(2, 300, 4, D, generator=g).to(torch.bfloat16).cuda().requires_grad_() for _ in range(3))
    fad.flash_attn_func(q, k, v, causal=causal).sum().backward()
torch.cuda.synchronize()
print("ok")
EOF
    for tool in racecheck synccheck; do
        FLASH_ATTN_DET_BWD_DQ=reduce FLASH_ATTN_DET_WGMMA=force step "sanitize_$tool" 60 \
            compute-sanitizer --tool "$tool" --error-exitcode 1 python3 "$out/san_call.py"
    done
else
    echo "== compute-sanitizer not found: racecheck/synccheck skipped" | tee -a "$log"
fi

# (if the budget allows) the GQA 32/8 D128 rows with each setting
for mode in recompute reduce; do
    s=step; [[ $mode == reduce ]] && s=reduce_step
    FLASH_ATTN_DET_BWD_DQ=$mode $s "bench_gqa_$mode" 90 python3 benchmarks/bench_bwd.py --preset gqa \
        --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --rounds 2 --out "$out/bench" --tag "bwd_gqa_$mode"
done
echo "done" >> "$log"
