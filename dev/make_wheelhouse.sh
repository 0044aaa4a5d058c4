#!/usr/bin/env bash
# wheelhouse/wheels.tar.xz for dev/device_final.sh: the CUDA compiler wheels that a build
# without a CUDA toolkit fetches (build_backend/fad_toolchain.py's requirements, for the
# release in FLASH_ATTN_DET_CUDA_WHEELS, default 13.0) and setuptools, as their unpacked
# files under xz: the wheels as they are (deflate) pass the device's 64 MiB carry, xz of
# their files does not (59 MB for 13.0). The device zips them into wheels again.
#   dev/make_wheelhouse.sh          (then: run(..., carry=["wheelhouse"]))
set -euo pipefail
cd "$(dirname "$0")/.."
reqs=$(python3 -c "import sys; sys.path.insert(0, 'build_backend'); import fad_toolchain as t; print(' '.join(t.cuda_wheel_requirements()))")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp/whl" "setuptools>=77" $reqs
for w in "$tmp"/whl/*.whl; do
    d="$tmp/src/$(basename "$w" .whl)"
    mkdir -p "$d" && (cd "$d" && unzip -q "$w")
done
mkdir -p wheelhouse
tar cf - -C "$tmp/src" . | xz -9 -T0 > wheelhouse/wheels.tar.xz
ls -la wheelhouse/wheels.tar.xz
