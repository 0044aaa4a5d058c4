#!/usr/bin/env bash
# ab_decode.sh: A/B of the packed decode kernel's compile-time knobs in one device call. Verdict: chose the decode defaults in csrc/fad_config.h.
# A/B of the packed decode kernel's knobs in ONE device call. Each variant is a comma-separated
# list of preprocessor defines (csrc/fad_config.h), "-" for none, e.g.
#   dev/ab_decode.sh FAD_PACKED_COL_WARPS=1 FAD_PACKED_COL_WARPS=2 -
# A variant that starts with @DIR builds the sources in DIR (another commit's setup.py, csrc,
# flash_attn_det, tests, benchmarks, e.g. carried in .carry/) instead of this tree's:
#   dev/ab_decode.sh @.carry/base -
# With no argument: 1, 2 and 4 column warps. Variants are built in parallel (one source copy
# each, sm_90 only), then, one after the other, each runs the bit tests of the packed kernel and
# of paged KV (tests/test_kvcache.py -k "packed or paged") and bench_decode on L8192/L32768 x B1/B8
# (fad_det, plus sdpa_cudnn for the first variant), printing one table per variant.
# The knobs never change a bit: the tests compare against the prefill kernel on every variant.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
if [ $# -eq 0 ]; then
    set -- FAD_PACKED_COL_WARPS=1 FAD_PACKED_COL_WARPS=2 FAD_PACKED_COL_WARPS=4
fi
root=/tmp/ab_decode
commit="${FLASH_ATTN_DET_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}+ab"
rm -rf "$root" && mkdir -p "$root"
n=0
for v in "$@"; do
    n=$((n + 1))
    d=$root/$n
    mkdir -p "$d"
    # a whole source copy: python -m pytest and benchmarks/common.py put the cwd / the copy's
    # root first on sys.path, so each variant runs from its own directory
    src=.
    if [[ "$v" == @* ]]; then src=${v%%,*}; src=${src#@}; v=${v#"@$src"}; v=${v#,}; fi
    (cd "$src" && cp -r setup.py pyproject.toml csrc flash_attn_det tests benchmarks "$d"/)
    rm -rf "$d"/flash_attn_det/_C*.so "$d"/build "$d"/benchmarks/results
    defs=$(echo "$v" | tr ',' '\n' | grep -v '^-\?$' | sed 's/^/-D/' | tr '\n' ' ' || true)
    (cd "$d" && CFLAGS="$defs" NVCC_APPEND_FLAGS="$defs" FLASH_ATTN_DET_CUDA_ARCHS=90 \
        python3 setup.py build_ext --inplace > "$d/build.log" 2>&1; echo $? > "$d/build.rc") &
done
t0=$(date +%s)
wait
echo "built $n variants in $(( $(date +%s) - t0 )) s"
# AB_LENS / AB_BATCHES: bench_decode's --lens / --batches (default 8192,32768 and 1,8);
# AB_ROUNDS: how many times the variants' benchmarks run, in turn (default 1; the tests run once)
lens=${AB_LENS:-8192,32768}
batches=${AB_BATCHES:-1,8}
for round in $(seq "${AB_ROUNDS:-1}"); do
n=0
for v in "$@"; do
    n=$((n + 1))
    d=$root/$n
    echo
    echo "== variant $n: $v (round $round)"
    if [ "$(cat "$d/build.rc")" != 0 ]; then
        echo "build failed:"; tail -20 "$d/build.log"; continue
    fi
    impls=fad_det
    [ $n -eq 1 ] && impls=fad_det,sdpa_cudnn
    if [ "$round" = 1 ]; then
        grep -h "took" "$d/build.log" | head -3
        (cd "$d" && timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests/test_kvcache.py \
            -k "packed or paged" 2>&1 | tail -3)
    fi
    (cd "$d" && FLASH_ATTN_DET_COMMIT="$commit" timeout 200 python3 benchmarks/bench_decode.py \
        --lens "$lens" --batches "$batches" --impls "$impls" --iters 20 --warmup 5 \
        --out "$root/results" --tag "ab$n" 2>&1 | grep -E "^\||TB/s|rror" | head -30)
done
done
