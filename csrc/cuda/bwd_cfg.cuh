/*
 * bwd_cfg.cuh — the tile shapes of the backward's kernels: bwd_cfg for the
 * mma.sync kernels, bwd_wg_cfg for their sm_90a variants (knobs: fad_config.h).
 * Constants only: the kernels and the launcher (bwd_launch.cu) both read them.
 */
#ifndef FAD_BWD_CFG_CUH
#define FAD_BWD_CFG_CUH

#include "fad_internal.h"

template <int kHeadDim> struct bwd_cfg {
    static constexpr int kWarps = 4, kThreads = kWarps * 32;
    /* dkdv_kernel: 16 keys per warp; kStepM query rows per pipeline step.
     * Above D=128 the dK/dV accumulators of 16 keys x D no longer fit in a
     * warp's registers: each CTA then keeps a kDCols-column slice of them
     * (grid x kColSplit) and recomputes S and dP, which need every column. */
    static constexpr int kKeys = kWarps * 16;
    static constexpr int kStepM = kHeadDim <= 64 ? 64 : 32;
    static constexpr int kColSplit = kHeadDim > 128 ? 2 : 1;
    static constexpr int kDCols = kHeadDim / kColSplit;
    /* dq_kernel: 16 query rows per warp; kTileN keys per pipeline step. */
    static constexpr int kRows = kWarps * 16;
    static constexpr int kTileN = kHeadDim > 128 ? 32 : 64;
    static constexpr int kDBlocks = kHeadDim / 8;
    static constexpr int kMinBlocks = kHeadDim > 128 ? 1 : 2; /* CTAs per SM */
    /* dkdv shared memory: sK, sV, then 2 stages of (sQ, sdO, lse2, dsum). */
    static constexpr int kStepElems = 2 * kStepM * kHeadDim;
    static constexpr size_t kDkdvSmem =
        (size_t)2 * kKeys * kHeadDim * 2 + 2 * ((size_t)kStepElems * 2 + 2 * kStepM * 4);
    /* dq shared memory: sQ, sdO, then 2 stages of (sK, sV). */
    static constexpr int kKvElems = 2 * kTileN * kHeadDim;
    static constexpr size_t kDqSmem = (size_t)2 * kRows * kHeadDim * 2 + (size_t)2 * kKvElems * 2;
    static_assert(kHeadDim % 64 == 0 && kDCols % 64 == 0, "swizzle needs 8 chunks per row");
    static_assert(kDkdvSmem * kMinBlocks <= 227 * 1024 && kDqSmem * kMinBlocks <= 227 * 1024,
                  "shared memory");
};

template <int kHeadDim> struct bwd_wg_cfg {
    /* kSplitCols (D256): 64 x 256 fp32 accumulators do not fit one
     * warpgroup's registers beside S and dP, so the math warpgroups share the
     * CTA's 64 keys (dK/dV kernel) or 64 rows (dQ kernel) and each keeps a
     * kDCols-column slice of the gradients. S and dP, which every column needs,
     * each issues for half of the step and hands the other its P / dS
     * fragments (FAD_BWD_WG_D256_SPLIT_SDP; else each issues them in full, as
     * dkdv_kernel's column-split CTAs do, bwd_cfg::kColSplit). */
    static constexpr bool kSplitCols = kHeadDim > 128;
    static constexpr int kDkdvThreads = FAD_BWD_WG_DKDV_WGS * 128;
    static constexpr int kDqWGs = kHeadDim <= 64 ? FAD_BWD_WG_DQ_WGS_D64 : FAD_BWD_WG_DQ_WGS_D128;
    static constexpr int kDqThreads = kDqWGs * 128;
    static constexpr int kKeys = kSplitCols ? 64 : FAD_BWD_WG_DKDV_WGS * 64; /* dkdv: keys per CTA */
    static constexpr int kDCols = kSplitCols ? kHeadDim / FAD_BWD_WG_DKDV_WGS : kHeadDim; /* dkdv: a warpgroup's dK/dV columns */
    static constexpr int kStepM = kHeadDim <= 64 ? FAD_BWD_WG_D64_STEP_M : 64; /* dkdv: query rows per step */
    static constexpr int kRows = kSplitCols ? 64 : kDqWGs * 64; /* dq: query rows per CTA */
    static constexpr int kTileN = kHeadDim <= 64 ? FAD_BWD_WG_D64_TILE_N : 64; /* dq: keys per step */
    static constexpr int kDB = kDCols / 8; /* n8 blocks of a warpgroup's dK / dV / dQ row (its slice) */
    static constexpr bool kDkdvDefer = kHeadDim <= FAD_BWD_WG_DKDV_DEFER_MAX_D;
    static constexpr bool kDqDefer = FAD_BWD_WG_DQ_DEFER && !kSplitCols; /* (D256: a third stage does not fit) */
    static constexpr int kDkdvStages = kDkdvDefer ? 3 : 2, kDqStages = kDqDefer ? 3 : 2;
    /* dkdv shared memory: sK, sV (kKeys rows), then the stages of (sQ, sdO)
     * (kStepM rows each), then the stages of (lse2, dsum) (kStepM floats each). */
    static constexpr int kStepElems = 2 * kStepM * kHeadDim;
    static constexpr size_t kDkdvSmem = (size_t)2 * kKeys * kHeadDim * 2 +
                                        (size_t)kDkdvStages * (kStepElems * 2 + 2 * kStepM * 4);
    /* dq shared memory: sQ, sdO (kRows rows), then the stages of (sK, sV). */
    static constexpr int kKvElems = 2 * kTileN * kHeadDim;
    static constexpr size_t kDqSmem = (size_t)2 * kRows * kHeadDim * 2 + (size_t)kDqStages * kKvElems * 2;
    static_assert(kHeadDim == 64 || kHeadDim == 128 || kHeadDim == 256, "wgmma backward: D 64, 128 or 256");
    /* (the split's column slices and its fragment exchange, split_store / split_load, are for
     * exactly two math warpgroups in both kernels: a third would leave columns unwritten) */
    static_assert(!kSplitCols || (FAD_BWD_WG_DKDV_WGS == 2 && kDqWGs == 2 && 2 * kDCols == kHeadDim),
                  "kSplitCols: two math warpgroups, each a half of the columns");
    static_assert(kDkdvSmem <= 227 * 1024 && kDqSmem <= 227 * 1024, "shared memory");
};
#endif /* FAD_BWD_CFG_CUH */
