#!/usr/bin/env bash
# Runs flash_attn v2.8.3's tests/test_flash_attn.py, unmodified, with `import flash_attn`
# resolving to flash_attn_det (the shim in dev/fa_compat/shim): the check that "swap the import"
# holds (issue 22). Needs a CUDA GPU (the file's module level queries the device), einops, and
# the CUDA build of flash_attn_det in the repository root.
#   dev/fa_compat/run.sh [pytest args]        e.g. FA_SAMPLE=1500 dev/fa_compat/run.sh -x -q
# The test file comes from the flash-attention repository at tag v2.8.3 (BSD-3-Clause), checked
# by its sha256; put it at dev/fa_compat/work/test_flash_attn.py (ignored by git), e.g. with
#   git -C <flash-attention checkout> show v2.8.3:tests/test_flash_attn.py > dev/fa_compat/work/test_flash_attn.py
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
file="$here/work/test_flash_attn.py"
want=81b462f864efa01bdd31e826339b881754f03822f65d39ad9a1351da6abd2ba0
[[ -f "$file" ]] || { echo "missing $file (see the header of $0)"; exit 2; }
got=$(sha256sum "$file" | cut -d' ' -f1)
[[ "$got" == "$want" ]] || { echo "$file: sha256 $got, want $want (v2.8.3)"; exit 2; }
cd "$here/work"
# (-c /dev/null: not the repository's pytest settings; the plugin deselects and samples)
PYTHONPATH="$here/shim:$here:$root${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m pytest -c /dev/null \
    --rootdir "$here/work" -p no:cacheprovider -p fa_compat_plugin test_flash_attn.py "$@"
