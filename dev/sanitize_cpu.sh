#!/usr/bin/env bash
# sanitize_cpu.sh: The C module under AddressSanitizer + UBSan with the C-heavy tests. Verdict: clean; CI runs it.
# The C glue and the CPU path built with AddressSanitizer + UndefinedBehaviorSanitizer (gcc), and
# the tests that drive the C code hardest run under them: the C API, every argument check, the
# fuzzer (FAD_FUZZ_EXAMPLES per entry, default 300), KV cache, append, varlen, inference entries,
# head-dim padding, forward and backward, the limits. CPU only, in a copy of the package (the checkout's own
# module is untouched); .ci/run calls it after the README's test command. Any ASan report or UB
# aborts the run (abort_on_error, halt_on_error) and fails the job. Leak checks are off: the
# interpreter itself keeps memory at exit. The CUDA path: dev/sanitize_gpu.sh (compute-sanitizer).
#   bash dev/sanitize_cpu.sh [extra pytest args]
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/fad_sanitize.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp -r "$repo"/setup.py "$repo"/pyproject.toml "$repo"/build_backend "$repo"/csrc \
    "$repo"/flash_attn_det "$repo"/tests "$work"/
rm -f "$work"/flash_attn_det/_C*.so
san="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
(cd "$work" && FLASH_ATTN_DET_FORCE_CPU=1 CFLAGS="$san" LDFLAGS="-fsanitize=address,undefined" \
    python3 setup.py -q build_ext --inplace --build-temp "$work/build" > "$work/build.log" 2>&1) \
    || { tail -20 "$work/build.log"; exit 1; }
so=$(ls "$work"/flash_attn_det/_C*.so)
nm "$so" > "$work/symbols"  # (not piped into grep -q: with pipefail, nm's SIGPIPE would fail it)
grep -q __asan_report "$work/symbols" || { echo "sanitize_cpu: $so is not instrumented"; exit 1; }
grep -q __ubsan_handle "$work/symbols" || { echo "sanitize_cpu: $so has no UBSan checks"; exit 1; }
echo "sanitize_cpu: $(basename "$so") built with ASan + UBSan"
cd "$work"
# the interpreter is not instrumented, so the runtimes are preloaded; the C API test that
# compiles CUDA sources with nvcc is left out (nvcc must not run with them preloaded)
LD_PRELOAD="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libubsan.so)" \
ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:strict_string_checks=1 \
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
FAD_FUZZ_EXAMPLES=${FAD_FUZZ_EXAMPLES:-300} PYTHONPATH="$work" \
    python3 -m pytest -q -p no:cacheprovider -k "not cuda_demo" "$@" \
    tests/test_capi.py tests/test_argument_errors.py tests/test_api.py tests/test_fuzz.py \
    tests/test_kvcache.py tests/test_kvcache_refusals.py tests/test_append.py tests/test_varlen.py \
    tests/test_infer.py tests/test_head_dim_pad.py tests/test_forward.py tests/test_backward.py \
    tests/test_limits.py
