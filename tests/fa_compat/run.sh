#!/usr/bin/env bash
# Runs flash_attn v2.8.3's tests/test_flash_attn.py, unmodified, with `import flash_attn`
# resolving to flash_attn_det (the shim in tests/fa_compat/shim): the check that "swap the
# import" holds. The file is fetched from the flash-attn 2.8.3 sdist into
# tests/fa_compat/.cache/ and checked by sha256 (fetch.py); carry that folder to a machine
# without network. Needs a CUDA GPU (the file's module level queries the device), einops, and
# the CUDA build of flash_attn_det in the repository root. The plugin keeps FA_PER_FUNCTION
# (default 50) random parametrizations per test function, seed FA_SEED (printed).
#   tests/fa_compat/run.sh [pytest args]        e.g. FA_SEED=7 tests/fa_compat/run.sh -q -n 8
# FA_LOG=file names every outcome as it finishes. On one H100, 50 per function with -n 8 did
# not finish in 470 s: split a device call's share with -k (same FA_SEED), e.g.
# -k kvcache and -k "not kvcache", and keep -n low enough for the kvcache 131072 references.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
file=$(python3 "$here/fetch.py") || { echo "fa_compat: skipped (see above)"; exit 0; }
cd "$(dirname "$file")"
# (-c /dev/null: not the repository's pytest settings; the plugin samples)
PYTHONPATH="$here/shim:$here:$root${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m pytest -c /dev/null \
    --rootdir "$(dirname "$file")" -p no:cacheprovider -p fa_compat_plugin "$(basename "$file")" "$@"
