#!/usr/bin/env bash
# d256_fold_probes.sh: The D256 fold's timing probes, built here and timed in one device call. Verdict: the stores of R are the cost (nostore 1.11-1.21x from 4k keys, as much as no fold); load batches 8 / 4 no help (benchmarks/results/2026-11-30_h200_fwd_d256_fold_stores.md, section 1; nofold is also D128's ceiling, section 6).
# At D256 the deterministic forward reads 0.81-0.85x its own fast mode (no fold before a row's
# last split) from 4k keys, and fast mode 0.99-1.08x cuDNN
# (benchmarks/results/2026-11-30_h200_fwd_persistent_thresholds.md, section 1). Prefetching R,
# loading no R, float4 slots and a late fold did not recover it. These probes find which part of
# the fold costs:
#   nostore  the fold's stores of R left out (wrong answers)
#   nofold   the fold left out, the split's bookkeeping (the wait for O += P V, fresh m, l) kept
#   rgb8     R's global part loaded 8 n8 blocks ahead in the short-key variant (4 now)
#   rglb4    4 ahead in the long variant (8 now)
#
#   dev/d256_fold_probes.sh build      # here, after a CUDA build (build/); dev/abi/_C_{base,...}.abi3.so
#   OUT=$OUT dev/d256_fold_probes.sh run   # on the device, the modules carried in dev/abi
set -euo pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
build)
    cp flash_attn_det/_C.abi3.so dev/abi/_C_base.abi3.so
    dev/variant_so.sh nostore fwd_prefill_ws.cu 'cuda/fwd_tile.cuh=s/R.at(mt, nb0 + u, e) = v;/(void)v;/'
    dev/variant_so.sh nofold fwd_prefill_ws.cu \
        'cuda/fwd_prefill_ws.cu=s/^                fold(true);$/                (void)0;/'
    dev/variant_so.sh rgb8 fwd_prefill_ws.cu 'fad_config.h=s/#define FAD_WS_RG_BATCH 4/#define FAD_WS_RG_BATCH 8/'
    dev/variant_so.sh rglb4 fwd_prefill_ws.cu \
        'fad_config.h=s/#define FAD_WS_RG_LONG_BATCH 8/#define FAD_WS_RG_LONG_BATCH 4/'
    ;;
run)
    out=${OUT:-device_out}
    mkdir -p "$out"
    OUT=$out BENCH=fwd PRESET=full FILTER="bf16&D256&L1024|bf16&D256&L4096|bf16&D256&L16384" \
        BUILDS="base nostore nofold rgb8 rglb4" RUN_TIMEOUT=60 bash dev/ab_so.sh 2 > "$out/ab.log" 2>&1
    ;;
*)
    echo "usage: $0 build|run" >&2
    exit 2
    ;;
esac
