#!/usr/bin/env bash
# variant_so.sh: A module with one kernel file rebuilt from a patched copy of csrc, for same-run A/B probes (dev/ab_so.sh). Verdict: tool, no verdict of its own.
# Copies csrc to /tmp, applies sed expressions to the named files there, compiles CU (files of
# csrc/cuda, comma-separated) for sm_90a, and links them with every other object of the last CUDA
# build in build/
# (FLASH_ATTN_DET_CUDA=1 FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace) into
# dev/abi/_C_NAME.abi3.so. Patches stay out of the product: a probe ("what if the dQ adds did not
# wait for their turn") is a sed expression here, not a macro in the kernel.
#
#   dev/variant_so.sh NAME CU[,CU...] [FILE=SED ...]      (no SED: the working tree's csrc)
#   dev/variant_so.sh unord bwd_dkdv_wgmma.cu 'cuda/bwd_dq_accum.cuh=s/while (v != turn)/while (0)/'
#
# Fails if a sed expression changed nothing (a probe that silently measures the base).
# Host code is compiled with -fno-gnu-unique: the launchers' function-local statics (the
# smem_set flags) are then each module's own, so that modules loaded side by side
# (dev/ab_inproc.py) each set their kernels' shared-memory limits; as GNU-unique symbols one
# module's flag stood for all, and the second's launches failed (invalid argument).
set -euo pipefail
cd "$(dirname "$0")/.."
name=$1 cu=$2
shift 2
tmp=/tmp/variant_$name
rm -rf "$tmp" && cp -r csrc "$tmp"
for patch in "$@"; do
    file=${patch%%=*} expr=${patch#*=}
    cp "$tmp/$file" "$tmp/$file.orig"
    sed -i "$expr" "$tmp/$file"
    if cmp -s "$tmp/$file" "$tmp/$file.orig"; then
        echo "variant_so: '$expr' changed nothing in $file" >&2
        exit 1
    fi
done
objs=build/temp.linux-x86_64-cpython-311
cuda_objs=$(ls $objs/cuda/*.o)
new_objs=
# (the files two at a time: nvcc's --threads parallelizes over archs only, and this builds one)
pids=()
for f in ${cu//,/ }; do
    while [ "$(jobs -rp | wc -l)" -ge "${VARIANT_JOBS:-2}" ]; do sleep 1; done
    nvcc -c "$tmp/cuda/$f" -o "$tmp/$f.o" -O3 -std=c++17 --threads 0 -Xcompiler -fPIC -I"$tmp" \
        --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -DFAD_SM90A=1 -Xcompiler -fno-gnu-unique &
    pids+=($!)
    cuda_objs=$(echo "$cuda_objs" | grep -v "/$f.o$")
    new_objs="$new_objs $tmp/$f.o"
done
for pid in "${pids[@]}"; do wait "$pid"; done
# module.c again, so that the module's BUILD names the variant (the build's own may be a CPU-only one)
gcc -c csrc/python/module.c -o "$tmp/module.o" -O2 -std=c11 -fPIC -ffp-contract=off -Icsrc \
    -I"$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" -DPy_LIMITED_API=0x030A0000 \
    -DFAD_BUILD="\"variant $name of $(git rev-parse --short HEAD) (dev/variant_so.sh: $cu for sm_90a$(printf ' %s' "$@" | tr '"\\\n' "'' "))\""
c_objs="$(find $objs/csrc -name '*.o' ! -name fad_nocuda.o ! -name module.o) $tmp/module.o"
libdir=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
[ -e "$libdir/lib64/libcudart_static.a" ] && libdir=$libdir/lib64 || libdir=$libdir/lib
[ -e "$libdir/libcudart_static.a" ] || libdir=/usr/local/cuda/lib64
mkdir -p dev/abi
gcc -shared -o "dev/abi/_C_$name.abi3.so" $c_objs $cuda_objs $new_objs -L"$libdir" \
    -lcudart_static -ldl -lrt -lpthread -lstdc++
echo "dev/abi/_C_$name.abi3.so"
