#!/usr/bin/env bash
# ab_variants.sh: One build per set of defines, the quick perf probe on each. Verdict: chose the forward's tile defaults (csrc/fad_config.h).
# Builds the extension once per variant (side by side, each in its own copy under /tmp/ab/<n>)
# and runs the quick perf probe on each, so tile configurations are compared in one device
# call. A variant is a comma-separated list of preprocessor defines for both the C and the CUDA
# compiler ("-" for none), optionally followed by ":ENV=VALUE" run-time settings:
#   dev/ab_variants.sh - FAD_D128_WARPS=8 -:FLASH_ATTN_DET_WGMMA=0
# (the knobs are in csrc/fad_config.h). AB_PYTEST="tests/test_forward.py::test_head_dims" also runs
# that pytest selection (words without spaces) on each variant, so a fast variant that is wrong
# shows as such. AB_PERF="python3 benchmarks/bench_decode.py --quick" replaces the perf probe.
# A variant that starts with @DIR builds the sources in DIR (another commit's tree, e.g. from
# `git archive <rev> setup.py pyproject.toml csrc flash_attn_det dev tests benchmarks` into
# .carry/base) with the defines after it: dev/ab_variants.sh @.carry/base -
set -euo pipefail
cd "$(dirname "$0")/.."
n=0
for v in "$@"; do
    n=$((n + 1))
    from=.
    if [[ "$v" == @* ]]; then from=${v%%,*}; from=${from#@}; v=${v#"@$from"}; v=${v#,}; fi
    defs=$(echo "${v%%:*}" | tr ',' '\n' | grep -v '^-\?$' | sed 's/^/-D/' | tr '\n' ' ' || true)
    src=/tmp/ab/$n
    rm -rf "$src" && mkdir -p "$src" && (cd "$from" && cp -r setup.py pyproject.toml csrc flash_attn_det dev tests benchmarks "$src"/)
    rm -rf "$src"/flash_attn_det/_C*.so "$src"/build
    ( cd "$src" && CFLAGS="$defs" NVCC_APPEND_FLAGS="$defs" FLASH_ATTN_DET_CUDA_ARCHS=90 \
        python3 setup.py build_ext --inplace > build.log 2>&1 || { tail -20 build.log; exit 1; } ) &
done
wait
n=0
for v in "$@"; do
    n=$((n + 1))
    envs=""
    [[ "$v" == *:* ]] && envs=${v#*:}
    echo "== variant $n: $v"
    ( cd /tmp/ab/$n && env $envs PYTHONPATH=/tmp/ab/$n ${AB_PERF:-python3 dev/quick_perf.py} )
    if [[ -n "${AB_PYTEST:-}" ]]; then
        ( cd /tmp/ab/$n && env $envs PYTHONPATH=/tmp/ab/$n python3 -m pytest -q $AB_PYTEST 2>&1 | tail -2 ) || true
    fi
done
