#!/usr/bin/env bash
# One device call for a final build, as a user without a CUDA toolkit gets it: nvcc hidden,
# `pip install .` into a folder of its own takes its compiler from the CUDA compiler wheels (the
# machine cannot download: they come as their files in wheelhouse/wheels.tar.xz, made by
# dev/make_wheelhouse.sh, and are zipped into wheels again there); then the model benchmark
# on a quiet GPU; then the whole GPU suite against that install in concurrent shards, with
# the parity tool beside them, in the rest of 570 s. Logs under $OUT (or ./device_out), at
# most 8 files.
#   dev/device_final.sh [install|build|suite|bench ...]     (default: install bench suite, in that order)
#   build: the kernels built in place by the machine's nvcc instead (PYTHONPATH=checkout);
#   SUITE: shards of comma-separated test files or ids (default: the whole suite, in 11 shards)
# Local dry run of the install (no GPU): FLASH_ATTN_DET_CUDA=1 FLASH_ATTN_DET_CUDA_ARCHS=90
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-device_out}
mkdir -p "$out"
stages=${*:-install suite bench}
has() { [[ " $stages " == *" $1 "* ]]; }
site=${FAD_SITE:-/tmp/fad_site}
export PYTHONUNBUFFERED=1
if has build; then
    export PYTHONPATH="$PWD"
    py="python3"
    { rm -rf build flash_attn_det/_C*.so; time FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace; } \
        > "$out/install.log" 2>&1 || { tail -30 "$out/install.log"; exit 1; }
    tail -4 "$out/install.log"
else
    export PYTHONPATH="$site"
    py="python3 -P"  # -P: the installed package, not the checkout's flash_attn_det/
fi

# no nvcc on PATH, no toolkit named: the wheels are the only compiler
if has install; then
    keep=""
    IFS=: read -ra dirs <<< "$PATH"
    for d in "${dirs[@]}"; do [ -x "$d/nvcc" ] || keep="${keep:+$keep:}$d"; done
    export PATH="$keep"
    unset CUDA_HOME CUDA_PATH
fi

if has install; then
    {
        command -v nvcc && { echo "nvcc still visible"; exit 1; }
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
        wh=/tmp/fad_wheels
        rm -rf "$wh" "$site" && mkdir -p "$wh/src"
        tar xJf wheelhouse/wheels.tar.xz -C "$wh/src" || exit 1
        python3 - "$wh" <<'EOF'
import os, sys, zipfile
wh = sys.argv[1]
for name in sorted(os.listdir(f"{wh}/src")):
    root = f"{wh}/src/{name}"
    with zipfile.ZipFile(f"{wh}/{name}.whl", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        for d, _, files in os.walk(root):
            for f in files:
                z.write(os.path.join(d, f), os.path.relpath(os.path.join(d, f), root))
    print("wheel", name)
EOF
        # into a folder of its own on the system python (where torch is, wherever that is)
        start=$SECONDS
        python3 -m pip install --no-deps --no-index --find-links "$wh" --target "$site" . || exit 1
        echo "pip install: $((SECONDS - start)) s"
        (cd / && python3 -c "import flash_attn_det, flash_attn_det._C as C; print(flash_attn_det.__file__); print(C.BUILD)")
        $py -c "import flash_attn_det; print('from the checkout root:', flash_attn_det.__file__)"
    } > "$out/install.log" 2>&1
    rc=$?
    grep -E "flash_attn_det:|CUDA kernels|pip install:|BUILD|site-packages|from the checkout|nvcc still|ERROR|rror:" \
        "$out/install.log" | head -20
    [ $rc -eq 0 ] || { tail -30 "$out/install.log"; exit 1; }
fi

if has bench; then  # first, on a quiet GPU
    timeout ${BENCH_TIMEOUT:-240} $py benchmarks/bench_model.py ${BENCH_ARGS:---batches 1} \
        --out "$out/bench_model.md" 2>&1 | tail -8
fi

if has suite; then
    # one shard a group of files, side by side (16 cores; the slow ones alone); logs in one file
    logs=/tmp/fad_logs && rm -rf $logs && mkdir -p $logs
    common="-q -p no:randomly -rfE --tb=short"
    default="tests/test_contract.py,tests/test_kvcache.py tests/test_varlen.py,tests/test_backward.py
        tests/test_fa_compat.py,tests/test_fa_compat_plugin.py
        tests/test_blocks.py,tests/test_parity.py tests/test_transformers.py,tests/test_limits.py
        tests/test_distributed.py tests/test_compile.py"
    named=" $(echo $default | tr ',' ' ') "
    # the other files in four shards, dealt in turn (in two, one shard outlasted 365 s)
    rest=$(ls tests/test_*.py | while read f; do [[ "$named" == *" $f "* ]] || echo "$f"; done |
           awk '{ s[NR % 4] = s[NR % 4] (s[NR % 4] ? "," : "") $0 } END { print s[0], s[1], s[2], s[3] }')
    i=0
    for part in ${SUITE:-$default $rest}; do
        timeout ${SUITE_TIMEOUT:-$((570 - SECONDS))} $py -m pytest $common ${part//,/ } > "$logs/suite_$i.log" 2>&1 &
        i=$((i + 1))
    done
    P="--sequences 64 --new-tokens 32 --prompt-lengths 20,300"
    for s in llama-0.5b qwen2-0.5b; do
        timeout ${PARITY_TIMEOUT:-150} $py -m flash_attn_det.parity --shape $s $P --grads 8 2>&1 | tail -1 \
            > "$logs/parity_$s.log" &
        [ -n "${PARITY_QUICK:-}" ] || timeout ${PARITY_TIMEOUT:-150} $py -m flash_attn_det.parity --shape $s $P \
            --batch-size 16 --prefill-chunk-size 64 2>&1 | tail -1 > "$logs/parity_${s}_b16_chunk64.log" &
    done
    wait
    for f in $logs/suite_*.log; do echo "== $(basename $f): $(tail -1 $f)"; cat $f; done > "$out/suite.log"
    cat $logs/parity_*.log > "$out/parity.log"
    grep "^== " "$out/suite.log"
    grep -h "^FAILED\|^ERROR" $logs/suite_*.log | head -30
    cat "$out/parity.log"
fi

exit 0
