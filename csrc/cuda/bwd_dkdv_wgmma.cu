/*
 * bwd_dkdv_wgmma.cu — the Hopper (sm_90a) variant of dkdv_kernel (bwd_dkdv.cu)
 * on warpgroup MMA; this header also describes its sibling, dq_wgmma_kernel
 * (bwd_dq_wgmma.cu).
 *
 * Same work, same order, same fragments: each variant computes what its
 * mma.sync sibling computes, chain by chain (every product a chain of k16
 * steps in increasing order, wgmma.cuh), with the same element-wise math
 * on the same accumulator layout. A wgmma chain rounds like the mma.sync
 * chain it replaces (tests/wgmma_probe.cu), so the gradients keep their
 * bits (tests/test_backward.py compares the two variants bit for bit).
 * What changes is who reads the operands: the tensor cores read them from
 * 128-byte-swizzled shared memory (swz128) instead of every warp loading
 * fragments with ldmatrix, which is what bounded the mma.sync kernels
 * (docs/design.md, "backward-order").
 *
 * dkdv_wgmma_kernel: one CTA per (sequence, kv head, kKeys keys); warpgroup w
 * owns keys 64w .. 64w + 63 of them, so each wgmma has M = 64 keys:
 *   S^T  (64 keys x kStepM rows) = K  Q^T     A: sK (K-major)  B: sQ (K-major)
 *   dP^T (64 keys x kStepM rows) = V  dO^T    A: sV            B: sdO
 *   dV   (64 keys x D)          += P^T  dO    A: P^T registers B: sdO (MN-major)
 *   dK   (64 keys x D)          += dS^T Q     A: dS^T registers B: sQ (MN-major)
 * Steps: the group's query heads in increasing order, then row tiles of
 * kStepM rows from the sequence's row 0 up (the mma.sync kernel's order; its
 * steps are shorter, which only regroups the same k16 chain); kRed with
 * GQA: row tiles from the last down, the heads inner (step_h below says why).
 *
 * dq_wgmma_kernel: one CTA per (sequence, query head, kRows rows); warpgroup
 * w owns rows 64w .. 64w + 63:
 *   S  (64 rows x kTileN keys) = Q K^T        A: sQ            B: sK (K-major)
 *   dP (64 rows x kTileN keys) = dO V^T       A: sdO           B: sV (K-major)
 *   dQ (64 rows x D)          += dS K         A: dS registers  B: sK (MN-major)
 * Key tiles from key 0 up.
 *
 * Shapes: kHeadDim 64, 128 or 256 (D <= kHeadDim, the columns beyond D
 * zero-filled in shared memory and never stored). At 256 (bwd_wg_cfg's
 * kSplitCols) the warpgroups share the CTA's 64 keys (dK/dV) or 64 rows (dQ)
 * and each issues its gradient products on its 128-column slice of dO, Q (K),
 * so each keeps the D128 kernels' registers. Without a score mod warpgroup 0
 * issues S^T (S) and makes P^T (P), warpgroup 1 issues dP^T (dP) and, with
 * that P through shared memory, makes dS^T (dS), each product for the whole
 * step (tile): m64n64 (FAD_BWD_WG_D256_BY_PRODUCT). With a score mod each
 * issues both for half of the step's rows (the tile's keys), m64n32, handing
 * the other its P^T / dS^T (dS) fragments through shared memory
 * (FAD_BWD_WG_D256_SPLIT_SDP; 0: both issue them in full). kDrop: dropout, as the mma.sync
 * kernels apply it (the same keep rule through dropout.cuh, the same
 * element-wise math), so the bits stay those of the mma.sync variant. kMod:
 * softcap and ALiBi, through the mma.sync kernels' bwd_score (the same logit
 * and gradient factor of each element). Their P is made once dP has landed,
 * in the loop that makes dS: the factor then needs no register beside P. A
 * score mod with dropout stays on mma.sync (bwd_launch.cu).
 *
 * kWs (both kernels; the dQ kernel from FAD_BWD_WG_DQ_WS_MIN_D): warpgroup 0
 * is a producer that streams the tiles through a ring of mbarrier-guarded
 * stages, and the warpgroups above ("w" here counts from the first math one)
 * only compute: no copy and no CTA barrier per step, so the two math
 * warpgroups run out of step. The whole backward measured 1.04-1.13x faster
 * with it at D128 (docs/design.md, "backward-order"). Whole
 * tiles (Q and dO here, K and V in the dQ kernel) come by the bulk tensor
 * copy engine where a tensor map can be made (tma.cuh; bwd_ws_args carries
 * the maps), the rest by cp.async: 0.99-1.04x more.
 *
 * kRed (FLASH_ATTN_DET_BWD_DQ=reduce, D 64 and 128, no score mod with dropout): the fifth
 * product, dQ = dS K, with no dQ kernel after it: each math warpgroup stores
 * its dS^T transposed and computes a 64 x 64 part of the step's dQ tile, and
 * the producer's last warps (the dQ warps, FAD_BWD_DQ_WARPS; the others load)
 * add the tile to an fp32 accumulator in key-block order (bwd_dq_reduce.cuh;
 * the order: bwd_dq_accum.cuh). With kLag (D64) the warpgroups take turns at
 * issuing their products. Its grid is persistent (kPersist): a CTA an SM,
 * taking work items in order from a ticket.
 */
#include "bwd_dq_reduce.cuh"

/* kWs (FAD_BWD_WG_DKDV_WS): a producer warpgroup streams each step's tiles
 * into a ring of kStages stages through mbarriers (full: its copies and
 * row values landed; empty: every math warp is done with them), so the two
 * math warpgroups meet no CTA barrier per step and issue no copy; with
 * setmaxnreg the producer's registers go to them. The math is unchanged. */
template <int kHeadDim, bool kWs> struct dkdv_wgmma_shape {
    using C = bwd_wg_cfg<kHeadDim>;
    static constexpr int kThreads = C::kDkdvThreads + (kWs ? 128 : 0);
    static constexpr int kStages = kWs ? FAD_BWD_WG_DKDV_WS_STAGES : C::kDkdvStages;
    static constexpr int kProducerRegs = 40, kMathRegs = 232;
    static_assert(!kWs || (kProducerRegs + 2 * kMathRegs) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
                  "setmaxnreg: the registers the producer frees must cover the math warpgroups'");
};

/* Shared memory of dkdv_wgmma_kernel: sK, sV, the stages of (sQ, sdO), the
 * stages of (lse2, dsum); with dropout each warpgroup's draws of a step
 * (dropout.cuh, dropout_group_smem); kWs: the ring's mbarriers. */
template <int kHeadDim, bool kDrop, bool kWs, bool kRed = false> struct dkdv_wgmma_smem {
    using C = bwd_wg_cfg<kHeadDim>;
    using Drop = dropout_group_smem<C::kStepM>;
    static constexpr int kStages = dkdv_wgmma_shape<kHeadDim, kWs>::kStages;
    static constexpr size_t kStageOffset = (size_t)2 * C::kKeys * kHeadDim * 2;
    static constexpr size_t kRowOffset = kStageOffset + (size_t)kStages * C::kStepElems * 2;
    static constexpr size_t kDropOffset = kRowOffset + (size_t)kStages * 2 * C::kStepM * 4;
    static constexpr size_t kBarOffset =
        (kDropOffset + (kDrop ? FAD_BWD_WG_DKDV_WGS * Drop::kBytes : 0) + 7) / 8 * 8;
    /* kSplit (FAD_BWD_WG_D256_SPLIT_SDP): warpgroup w issues S^T and dP^T for
     * rows [kStepM/2 w, kStepM/2 (w + 1)) of a step and the two exchange their
     * P^T and dS^T fragments (split_store / split_load, bwd_tile_wgmma.cuh)
     * through kX: per step parity, P^T's then dS^T's kStepM/16 chunks of 128 uint4. */
    static constexpr bool kSplit = C::kSplitCols && FAD_BWD_WG_D256_SPLIT_SDP && !kDrop; /* (none with dropout is built) */
    /* kRed (the persistent grid, bwd_dkdv_wgmma_kernel's kPersist): after the
     * ring's barriers, the item ring's (item_full[2], item_empty[2]), kv_empty
     * and the two item slots */
    static constexpr size_t kItemOffset = kBarOffset + (kWs ? (2 * kStages + 1) * sizeof(uint64_t) : 0);
    static constexpr size_t kXOffset = (kItemOffset + (kRed ? 7 * sizeof(uint64_t) : 0) + 15) / 16 * 16;
    static constexpr size_t kXChunks = C::kStepM / 16; /* of one operand */
    /* kRed (dQ summed here, bwd_dq_accum.cuh): two buffers (step parity) of
     * dS, kStepM rows x the CTA's kKeys keys (the A operand of dQ = dS K,
     * K-major swz128), then kDqBufs of the step's fp32 dQ tile, which the dQ
     * warps add to the accumulator: two, or with dropout one (two and the
     * draws need 235 KB at D128, 243 KB at D64). */
    static constexpr int kDqBufs = kDrop ? 1 : 2;
    static constexpr size_t kDsOffset = (kXOffset + (kSplit ? 2 * 2 * kXChunks * 128 * 16 : 0) + 1023) / 1024 * 1024;
    static constexpr size_t kDqOffset = kDsOffset + (kRed ? (size_t)2 * C::kStepM * C::kKeys * 2 : 0);
    static constexpr size_t kBytes = kDqOffset + (kRed ? (size_t)kDqBufs * C::kStepM * kHeadDim * 4 : 0);
    static_assert(kWs || kDropOffset == C::kDkdvSmem, "bwd_wg_cfg's layout");
    static_assert(kBytes <= 227 * 1024, "shared memory");
};

template <typename T, int kHeadDim, bool kDrop, bool kWs, bool kMod, bool kRed = false, bool kDown = false>
__global__ void __launch_bounds__(dkdv_wgmma_shape<kHeadDim, kWs>::kThreads, 1)
dkdv_wgmma_kernel(const __grid_constant__ bwd_ws_args wa)
{
    const bwd_args &a = wa.a;
    pdl_launch_dependents(); /* the dQ kernel may take the SMs this grid's last wave leaves (bwd_launch.cu) */
    using C = bwd_wg_cfg<kHeadDim>;
    using Shape = dkdv_wgmma_shape<kHeadDim, kWs>;
    using Smem = dkdv_wgmma_smem<kHeadDim, kDrop, kWs, kRed>;
    /* kRed: the fifth product, dQ = dS K per step, added to a.dq_accum in
     * key-block order by the producer warpgroup's last warps (the dQ warps), so
     * that no dQ kernel runs (bwd_dq_accum.cuh) */
    static_assert(!kRed || (kWs && !C::kSplitCols && !C::kDkdvDefer && !(kDrop && kMod)),
                  "kRed: the producer-fed kernel at D 64 and 128, waits not deferred, no score mod with dropout");
    static_assert(!kDown || kRed, "kDown: the five-product kernel's GQA walk");
    constexpr int kN = C::kKeys, kM = C::kStepM, kDB = C::kDB, kStages = Shape::kStages;
    static_assert(!(kDrop && C::kSplitCols), "D256 with dropout stays on mma.sync (bwd_launch.cu)");
    /* kByProd (FAD_BWD_WG_D256_BY_PRODUCT, no score mod): S^T by warpgroup 0,
     * dP^T by warpgroup 1, each for all kM rows of the step (m64n64, not
     * m64n32); kX then holds warpgroup 0's P^T (fp32, in its accumulators'
     * order) and the P^T and dS^T fragments (kM / 16 chunks each), one buffer
     * each: named barriers 4 (P^T stored) and 5 (dS^T stored), which both
     * warpgroups sync on outside their branches, order their reuse (the dQ
     * kernel's kByProd says why). */
    constexpr bool kByProd = Smem::kSplit && FAD_BWD_WG_D256_BY_PRODUCT && !kMod && kWs;
    static_assert(!kByProd || 2 * 2 * Smem::kXChunks * 128 * 16 >= kM * kN * 4 + 2 * Smem::kXChunks * 128 * 16,
                  "kByProd: P^T and both fragments' chunks fit kX");
    constexpr bool kSplit = Smem::kSplit && !kByProd;
    constexpr bool kThreadRelease = kRed || C::kSplitCols; /* (the ring's release, below) */
    constexpr int kMw = kSplit ? kM / 2 : kM; /* rows of a step whose S^T and dP^T this warpgroup issues */
    const fad_fwd_params &p = a.p;
    /* kPersist (the five-product kernels): a CTA an SM, each taking work items
     * (dkdv_work_of_item's index: a key block of a (sequence, kv head)) one
     * after another, from a.dq_ticket, in the order they are handed out. An
     * item's work, and so every bit, is the same whichever CTA takes it. The
     * next item's tiles load while the last one's steps end and its dK, dV
     * are stored, where a CTA an item paid its prologue, its epilogue and the
     * SM's turn-over on every item (dev/probe_bwd_cta_timeline.py: 9-18% of
     * SM time at D128 L2k, 3-6% at L8k). No wait can deadlock: an item waits
     * only for items handed out before it (bwd_dq_accum.cuh), and every item
     * handed out is held by a running CTA, which finishes its earlier items
     * first. (CTA i taking items i, i + grid, ... could: with fewer CTAs
     * resident than the grid -- a MIG slice, another kernel beside it -- a
     * running CTA could wait for an item held by one that never starts.) The
     * other kernels: one CTA an item, blockIdx.x. */
    constexpr bool kPersist = kRed;
    const unsigned items = (unsigned)a.n_blocks * (unsigned)(p.batch * p.num_heads_k);
    dkdv_work w;
    const fad_seq &seq = w.seq;
    int b = 0, hk = 0, group = 1, n0 = 0, mt_first = 0, mt_count = 0, len_q = 0, len_k = 0, steps = 0;
    const int wl = p.window_left, wr = p.window_right, D = p.head_dim;
    const T *q_g = nullptr, *do_g = nullptr;
    /* item's work into the variables above; false if it has no key */
    auto set_item = [&](unsigned item) {
        if (!dkdv_work_of_item<kN, kM>(a, item, 1, kHeadDim, &w, kRed, kDown))
            return false;
        b = w.b, hk = w.hk, group = w.group, n0 = w.n0;
        mt_first = w.mt_first, mt_count = w.mt_count;
        len_q = seq.len_q, len_k = seq.len_k;
        steps = group * mt_count;
        q_g = (const T *)p.q + seq.q_off, do_g = (const T *)a.dout + seq.o_off;
        return true;
    };
    if constexpr (!kPersist)
        if (!set_item(blockIdx.x))
            return;

    extern __shared__ __align__(1024) unsigned char wg_smem[];
    T *sK = reinterpret_cast<T *>(wg_smem), *sV = sK + kN * kHeadDim;
    T *sQ = reinterpret_cast<T *>(wg_smem + Smem::kStageOffset); /* stage st: + st * kStepElems; sdO follows sQ */
    float *sL = reinterpret_cast<float *>(wg_smem + Smem::kRowOffset); /* [stage][kM] lse2, then dsum */
    uint64_t *full = reinterpret_cast<uint64_t *>(wg_smem + Smem::kBarOffset); /* (kWs) */
    uint64_t *empty = full + kStages, *kv_full = empty + kStages;
    /* kPersist: item_full[i] (thread 0 put the i-th item into slot i % 2),
     * item_empty[i] (every thread took it), kv_empty (the math threads are
     * done with sK, sV) */
    uint64_t *item_full = reinterpret_cast<uint64_t *>(wg_smem + Smem::kItemOffset);
    uint64_t *item_empty = item_full + 2, *kv_empty = item_full + 4;
    volatile unsigned *item_slot = reinterpret_cast<volatile unsigned *>(item_full + 5);
    /* The n-th item of this CTA: thread 0 takes a ticket (fetch_item), every
     * thread reads it (take_item); >= items: none is left. */
    auto fetch_item = [&](int n) {
        if (n >= 2)
            mbar_wait(&item_empty[n & 1], ((n >> 1) - 1) & 1);
        item_slot[n & 1] = atomicAdd(a.dq_ticket, 1u);
        mbar_arrive(&item_full[n & 1]); /* (release: the slot's store before it) */
    };
    auto take_item = [&](int n) -> unsigned {
        if constexpr (!kPersist)
            return n == 0 ? blockIdx.x : items;
        mbar_wait(&item_full[n & 1], (n >> 1) & 1);
        const unsigned item = item_slot[n & 1];
        mbar_arrive(&item_empty[n & 1]);
        return item;
    };

    const int64_t lse_hs = fad_lse_head_stride(&p);
    /* The loaders' threads: every thread, or (kWs) the producer warpgroup's
     * (kRed: its first warps; the last kDqWarps are the dQ warps: with one dQ
     * buffer, one, bwd_dq_reduce.cuh's dq_warp says why). */
    static_assert(FAD_BWD_DQ_WARPS == 1 || FAD_BWD_DQ_WARPS == 2, "a dQ warp for both buffers, or one each");
    constexpr int kDqWarps = Smem::kDqBufs == 1 ? 1 : FAD_BWD_DQ_WARPS;
    constexpr int kLoaders = kRed ? 128 - 32 * kDqWarps : kWs ? 128 : C::kDkdvThreads;
    const int ltid = threadIdx.x % kLoaders;

    /* step's head and first row: the group's heads outer, row tiles from
     * mt_first up (the mma.sync kernel's order: dK and dV keep its bits);
     * kDown (kRed with GQA): row tiles from the last down, the heads inner.
     * Causal and full, every block of a pair then starts at the same row tile
     * and reaches each (head, row tile) after the same number of steps, so
     * the adds to a dQ tile and the reads of its Q, dO follow one another
     * while they are in L2. Walking up from its diagonal, under a causal mask,
     * a block reached head g's tiles 2 (g + 1) steps after the block above it:
     * with 4 heads a group, 1/3 of the kernel's L2 reads missed (D128 L16k GQA
     * 32/8: 0.84x cuDNN, against 0.95x walking down). With one head a group
     * the walk stays up: its diagonal's offset spaces the adds to a tile by 1
     * or 2 steps, and walking down queued them (D64 L8k causal 1.00 -> 0.81x).
     * (The turns follow the walk: bwd_dq_accum.cuh. A variant of its own:
     * with the walk chosen at run time, the MHA rows ran 2-4% slower.) */
    auto step_h = [&](int step) { return hk * group + (kDown ? step % group : step / mt_count); };
    auto step_m0 = [&](int step) {
        return (kDown ? mt_first + mt_count - 1 - step / group : mt_first + step % mt_count) * kM;
    };
    auto load_step_tiles = [&](int step, int st) { /* Q, dO by cp.async (zero-filled past len_q) */
        const int h = step_h(step), m0 = step_m0(step);
        T *q_s = sQ + st * C::kStepElems;
        load_tile_lean<T, kHeadDim, kM, kLoaders, true>(
            q_s, q_g + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride, (int)p.q_row_stride,
            len_q - m0, D);
        load_tile_lean<T, kHeadDim, kM, kLoaders, true>(
            q_s + kM * kHeadDim, do_g + (int64_t)m0 * p.out_row_stride + h * p.out_head_stride,
            (int)p.out_row_stride, len_q - m0, D);
    };
    auto load_step_rows = [&](int step, int st) { /* the rows' lse (log2 units) and dsum */
        const int h = step_h(step), m0 = step_m0(step);
        for (int t = ltid; t < kM; t += kLoaders) {
            const int64_t flat = seq.row0 + h * lse_hs + m0 + t;
            const bool exists = m0 + t < len_q;
            sL[st * 2 * kM + t] = lse_log2(p, flat, exists);
            sL[st * 2 * kM + kM + t] = exists ? a.dsum[flat] : 0.f;
        }
    };
    auto load_step = [&](int step, int st) {
        load_step_tiles(step, st);
        load_step_rows(step, st);
    };
    /* K and V, once an item: every producer thread (kWs; the dQ warps too,
     * before their adds: with 64 loaders the copy's unrolled offsets
     * spilled); kPersist: the loaders, by the lean copy (the dQ warps are
     * adding the last item's tiles then) */
    constexpr int kKvLoaders = kPersist ? kLoaders : kWs ? 128 : C::kDkdvThreads;
    auto load_kv = [&]() {
        const T *k_g = (const T *)p.k + seq.k_off + (int64_t)n0 * p.k_row_stride + hk * p.k_head_stride;
        const T *v_g = (const T *)p.v + seq.v_off + (int64_t)n0 * p.v_row_stride + hk * p.v_head_stride;
        if constexpr (kPersist) {
            load_tile_lean<T, kHeadDim, kN, kKvLoaders, true>(sK, k_g, (int)p.k_row_stride, len_k - n0, D);
            load_tile_lean<T, kHeadDim, kN, kKvLoaders, true>(sV, v_g, (int)p.v_row_stride, len_k - n0, D);
        } else {
            load_tile<T, kHeadDim, kN, kKvLoaders, true>(sK, k_g, (int)p.k_row_stride, len_k - n0, D);
            load_tile<T, kHeadDim, kN, kKvLoaders, true>(sV, v_g, (int)p.v_row_stride, len_k - n0, D);
        }
    };

    if constexpr (kWs) {
        /* full: each producer thread arrives twice, when its copies land
         * (cp.async) and once its row values are stored (a plain arrive);
         * empty: one arrival per math thread, or at D <= 128 in the dQ
         * pass's kernels one per math warp (below) */
        if (kPersist && threadIdx.x == 0) {
            for (int i = 0; i < 2; i++) {
                mbar_init(&item_full[i], 1);
                mbar_init(&item_empty[i], Shape::kThreads);
            }
            mbar_init(kv_empty, C::kDkdvThreads);
        } /* (fenced and met by ring_init) */
        ring_init(full, empty, kStages, 2 * kLoaders, kThreadRelease ? C::kDkdvThreads : 4 * FAD_BWD_WG_DKDV_WGS,
                  kv_full, kKvLoaders);
        if (threadIdx.x < 128) {
            /* ---- producer: K, V, then each step's tiles into the ring ---- */
            setmaxnreg_dec<Shape::kProducerRegs>();
            if constexpr (kRed) {
                if (threadIdx.x >= kLoaders) { /* ---- the dQ warps: each item's adds ---- */
                    for (int n = 0, base = 0;; n++) {
                        const unsigned item = take_item(n);
                        if (item >= items)
                            break;
                        if (!set_item(item)) /* (the dQ warps exist with kPersist only) */
                            continue;
                        dq_warp<kHeadDim, kDown, Smem::kDqBufs, kDqWarps>(
                            a, w, step_h, step_m0, ((int)threadIdx.x - kLoaders) / 32, base, steps, kN,
                            reinterpret_cast<const float *>(wg_smem + Smem::kDqOffset));
                        base += steps;
                    }
                    return;
                }
            }
            /* K and V by cp.async, announced (cp_async_announce: landed,
             * fenced) once the first step's copies are issued: announced at
             * once, the producer waited for them to land before it issued
             * those (D256 L1k 0.98-0.99x). kPersist: an item's K and V once
             * the math warps are done with the last item's (kv_empty), after
             * its first step's tiles. */
            if constexpr (!kPersist) {
                load_kv();
                cp_async_commit();
            }
            /* wa.tma: a step whose rows all lie inside the sequence gets Q and
             * dO from the copy engine (thread 0's arrival expects their bytes,
             * the other threads' stands in for their copies'); a step that the
             * sequence's end cuts, by cp.async, announced once it has landed
             * and been fenced (cp_async_announce): the writer's fence, so the
             * math warps fence no step. */
            if (kPersist && threadIdx.x == 0)
                fetch_item(0);
            for (int n = 0, g = 0, kv_loads = 0;; n++) { /* (g: the CTA's steps so far) */
            const unsigned item = take_item(n);
            if (item >= items)
                break;
            if (kPersist && !set_item(item)) { /* (else: set before ring_init) */
                if (kPersist && threadIdx.x == 0)
                    fetch_item(n + 1);
                continue;
            }
            const int64_t q_row0 = wa.tma ? seq.q_off / p.q_row_stride : 0;
            const int64_t o_row0 = wa.tma ? seq.o_off / p.out_row_stride : 0;
            for (int step = 0; step < steps; step++, g++) {
                const int st = g % kStages;
                ring_wait_empty(&empty[st], g, kStages); /* the math warps are done with the step kStages back */
                const int m0 = step_m0(step);
                if (wa.tma && m0 + kM <= len_q) {
                    if (ltid == 0) {
                        T *q_s = sQ + st * C::kStepElems;
                        mbar_arrive_expect_tx(&full[st], 2u * kM * kHeadDim * 2);
                        tma_load_tile<kM, kHeadDim>(q_s, &wa.map0, step_h(step), (int)(q_row0 + m0), &full[st]);
                        tma_load_tile<kM, kHeadDim>(q_s + kM * kHeadDim, &wa.map1, step_h(step), (int)(o_row0 + m0),
                                                    &full[st]);
                    } else {
                        mbar_arrive(&full[st]);
                    }
                } else {
                    load_step_tiles(step, st);
                    cp_async_announce(&full[st]);
                }
                load_step_rows(step, st);
                mbar_arrive(&full[st]);
                if (step == 0) {
                    if constexpr (kPersist) {
                        if (kv_loads > 0)
                            mbar_wait(kv_empty, (kv_loads - 1) & 1);
                        load_kv();
                    }
                    cp_async_announce(kv_full);
                    kv_loads++;
                }
            }
            if (!kPersist && steps == 0)
                cp_async_announce(kv_full); /* (the epilogue waits for it) */
            if (kPersist && threadIdx.x == 0)
                fetch_item(n + 1); /* (the next item's ticket while the ring drains) */
            }
            return;
        }
        setmaxnreg_inc<Shape::kMathRegs>();
    } else {
        /* Prologue: K, V and the first step's tiles in flight. */
        load_kv();
        if (steps > 0)
            load_step(0, 0);
        cp_async_commit();
    }
    /* The math warpgroups: tid from 0 */
    const int tid = threadIdx.x - (kWs ? 128 : 0), warp = tid / 32, lane = tid % 32;
    const int wg = uniform_warpgroup() - (kWs ? 1 : 0);

    /* This warpgroup's keys: n0 + 64 wg ..; this thread's: n0 + key_row + 8r.
     * (kSplitCols: every warpgroup's keys are the CTA's 64, and its dK/dV
     * columns col0 ..; K-major tiles keep 64-column blocks of kN or kM rows.) */
    constexpr int kWgKeys = C::kSplitCols ? 0 : 64;
    const uint32_t k_addr = smem_addr(sK) + wg * kWgKeys * 128, v_addr = smem_addr(sV) + wg * kWgKeys * 128;
    const int key_row = (C::kSplitCols ? warp % 4 : warp) * 16 + lane / 4;
    const int col0 = C::kSplitCols ? wg * C::kDCols : 0;
    const uint32_t col_bytes = (uint32_t)(col0 / 64) * kM * 128; /* col0's block in sQ, sdO */
    const float scale = p.softmax_scale;
    /* (kMod: dkdv_kernel's mod, bwd_dkdv.cu says why the flag reads so) */
    const fad_score_mod mod = kMod ? fad_make_score_mod(scale, p.softcap, p.alibi_slopes != NULL || kDrop)
                                   : fad_make_score_mod(scale, 0.f, 0);
    /* this warpgroup's draws of a step (kDrop; its keys are one 64-key group) */
    uint32_t *s_drop = reinterpret_cast<uint32_t *>(wg_smem + Smem::kDropOffset) +
                       wg * dropout_group_smem<kM>::kWords;
    uint32_t pf[kM / 16][4], sf[kM / 16][4]; /* P^T, dS^T as A fragments */

    /* kRed: the fifth product and its hand-off to the dQ warps (bwd_dq_reduce.cuh).
     * (Not the lag with dropout: its turns take named barriers 1 and 2, which
     * the draws' warpgroup_sync takes.) */
    constexpr bool kLag = kRed && !kMod && !kDrop && kHeadDim <= FAD_BWD_DQ_LAG_MAX_D;
    /* kEarlyStore (kRed without the lag): the step's products in the order
     * dV, dQ, dK, and dQ's part stored while dK runs (FlashAttention's sm90
     * backward's order; before, the store waited for all three). */
    constexpr bool kEarlyStore = kRed && !kLag;
    using Red = std::conditional_t<kRed, dq_reducer<T, kRed ? kHeadDim : 64, kM, kN, kLag, Smem::kDqBufs>,
                                   dq_no_reducer>;
    Red red(wg_smem + Smem::kDsOffset, wg_smem + Smem::kDqOffset, smem_addr(sK), wg, tid);
    red.start();
    /* Each item (g: the CTA's steps before it; kv_uses: its K/V loads) */
    int g = 0, kv_uses = 0;
    for (int n = 0;; n++) {
    const unsigned item = take_item(n);
    if (item >= items)
        break;
    if (kPersist && !set_item(item)) /* (else: set before ring_init) */
        continue;
    const int wg_n0 = n0 + wg * kWgKeys;
    const fad_band band = fad_make_band(len_q, len_k, wl, wr);
    fad_dropout drop = {}; /* (bwd_dsum.cu's header has the math) */
    if constexpr (kDrop)
        drop = fad_dropout_of(&p, b);
    const dropout_bytes keep(drop);
    float dk[kDB][4] = {}, dv[kDB][4] = {};
    red.base = g;
    if constexpr (kWs)
        if (steps > 0)
            mbar_wait(kv_full, kv_uses & 1);
    for (int step = 0, st = g % kStages; step < steps; step++, st = st + 1 == kStages ? 0 : st + 1) {
        if constexpr (kWs) {
            mbar_wait(&full[st], ((g + step) / kStages) & 1);
        } else {
            cp_async_wait_all();
            fence_async_smem(); /* cp.async wrote what wgmma (the async proxy) reads next */
            __syncthreads();    /* step's tiles landed; every warp is done with the stage reloaded next */
        }

        const int m0 = step_m0(step);
        const uint32_t q_addr = smem_addr(sQ + st * C::kStepElems), do_addr = q_addr + kM * kHeadDim * 2;
        const float *lse2 = sL + st * 2 * kM, *dsum = lse2 + kM;

        /* S^T = K Q^T, then dP^T = V dO^T: two groups in flight (kSplit: for
         * this warpgroup's kMw rows from m0 + rw0). */
        const int rw0 = kSplit ? wg * kMw : 0;
        float pt[kMw / 8][4], ds[kMw / 8][4]; /* written by their first k-chunk (kByProd: ds only) */
        if constexpr (kByProd) {
            /* one product a warpgroup, on one code path (a wgmma under a
             * branch makes ptxas serialize them): S^T into warpgroup 0's ds,
             * dP^T into warpgroup 1's */
            issue_ss<T, kHeadDim, kN, kM, kM>(ds, wg ? v_addr : k_addr, wg ? do_addr : q_addr);
            wgmma_wait<0>();
            wgmma_fence_operand(ds);
            float4 *xp = reinterpret_cast<float4 *>(wg_smem + Smem::kXOffset); /* P^T: kM / 2 float4 a thread */
            uint4 *xpf = reinterpret_cast<uint4 *>(xp + kM * kN / 4), *xsf = xpf + Smem::kXChunks * 128;
            const int t = tid % 128;
            if (wg == 0) { /* P^T, as the split kernel makes it, to warpgroup 1 */
                const fad_key_range first = fad_row_keys(m0, len_q, len_k, wl, wr);
                const fad_key_range last = fad_row_keys(min(m0 + kM, len_q) - 1, len_q, len_k, wl, wr);
                if (n0 < last.lo || n0 + 64 > first.hi)
                    scores_to_p<true, kM / 8>(ds, lse2, mod, band, m0, n0 + key_row);
                else
                    scores_to_p<false, kM / 8>(ds, lse2, mod, band, m0, n0 + key_row);
#pragma unroll
                for (int nb = 0; nb < kM / 8; nb++)
                    xp[nb * 128 + t] = make_float4(ds[nb][0], ds[nb][1], ds[nb][2], ds[nb][3]);
#pragma unroll
                for (int kk = 0; kk < kM / 16; kk++)
                    p_fragment<T>(ds, kk, pf[kk]);
                split_store(xpf, pf, 0, t);
            }
            named_bar_sync(4, 256);
            if (wg == 1) { /* dS^T = P^T (dP^T - D) scale, element by element as the split kernel */
#pragma unroll
                for (int nb = 0; nb < kM / 8; nb++) {
                    const float4 pv = xp[nb * 128 + t];
                    const float pe[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2;
                        ds[nb][e] = fad_ds(pe[e], ds[nb][e], dsum[i_loc], scale);
                    }
                }
                split_load(xpf, pf, t); /* (before barrier 5: warpgroup 0's next P^T takes the buffer) */
#pragma unroll
                for (int kk = 0; kk < kM / 16; kk++)
                    p_fragment<T>(ds, kk, sf[kk]);
                split_store(xsf, sf, 0, t);
            }
            named_bar_sync(5, 256);
            if (wg == 0)
                split_load(xsf, sf, t);
            issue_rs_mn<T, C::kDCols, kM>(dv, pf, do_addr + col_bytes);
            issue_rs_mn<T, C::kDCols, kM>(dk, sf, q_addr + col_bytes);
            wgmma_wait<0>();
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            wgmma_fence_operand(pf);
            wgmma_fence_operand(sf);
            mbar_arrive(&empty[st]); /* (every math thread: kThreadRelease) */
            continue;
        }
        red.turn_wait();
        issue_ss<T, kHeadDim, kN, kMw, kM>(pt, k_addr, q_addr + (uint32_t)rw0 * 128);
        issue_ss<T, kHeadDim, kN, kMw, kM>(ds, v_addr, do_addr + (uint32_t)rw0 * 128);
        red.turn_pass();
        /* The next step's copies, while the tensor cores run S^T and dP^T. */
        if constexpr (!kWs) {
            if (step + 1 < steps)
                load_step(step + 1, st + 1 == kStages ? 0 : st + 1);
            cp_async_commit();
        }
        /* Dropout's draws while the tensor cores run S^T and dP^T (they need
         * neither): each of the step's draws once per warpgroup, into shared
         * memory (the step's barrier above ended the reads of the last step's). */
        if constexpr (kDrop) {
            if constexpr (kWs) /* (no CTA barrier: every warp of the group is done with the last step's) */
                warpgroup_sync(1 + wg);
            dropout_draw_group<kM>(s_drop, drop, keep, step_h(step), wg_n0, m0,
                                   len_k - len_q, tid % 128);
        }
        wgmma_wait<1>(); /* S^T landed (and, deferred, the last step's dV, dK) */
        wgmma_fence_operand(pt);
        if constexpr (C::kDkdvDefer) {
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            wgmma_fence_operand(pf);
            wgmma_fence_operand(sf);
        }

        /* P^T: element (nb, e) is key n0 + key_row + 8 (e/2), row m0 + 8 nb + 2 (lane%4) + e%2. */
        const fad_key_range first = fad_row_keys(m0, len_q, len_k, wl, wr);
        const fad_key_range last = fad_row_keys(min(m0 + kM, len_q) - 1, len_q, len_k, wl, wr);
        /* (one loop per case: a per-element test of need_mask costs a branch each) */
        const bool need_mask = wg_n0 < last.lo || wg_n0 + 64 > first.hi;
        if constexpr (!kMod) {
            if (need_mask)
                scores_to_p<true, kMw / 8>(pt, lse2 + rw0, mod, band, m0 + rw0, n0 + key_row);
            else
                scores_to_p<false, kMw / 8>(pt, lse2 + rw0, mod, band, m0 + rw0, n0 + key_row);
        }

        /* Dropout: masks of the dropped elements (dropout.cuh), read from the
         * step's draws, which the warpgroup made above. */
        if constexpr (kDrop)
            warpgroup_sync(1 + wg);
        const dropout_staged_masks<kM> dropped(s_drop, key_row % 64);

        /* dS^T = P^T (dP^T - D) scale, in place in ds, once dP^T has landed
         * (with dropout: dP of a kept element times rp, of a dropped one 0).
         * kMod: P^T here too, element by element as dkdv_kernel makes it, and
         * dS^T with its gradient factor g in place of scale. */
        const float slope_log2 = kMod ? fad_alibi_slope_log2(&p, b, step_h(step)) : 0.f;
        wgmma_wait<0>();
        wgmma_fence_operand(ds);
#pragma unroll
        for (int nb = 0; nb < kMw / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i_loc = rw0 + nb * 8 + (lane % 4) * 2 + e % 2;
                float dp = ds[nb][e];
                if constexpr (kDrop) /* +0 where dropped: the bits of the select it replaces */
                    dp = __uint_as_float(__float_as_uint(FAD_MUL(dp, drop.rp)) & ~dropped.element(nb, e));
                float g = scale;
                if constexpr (kMod) {
                    const int i = m0 + i_loc, j = n0 + key_row + 8 * (e / 2);
                    const float x = bwd_score<true>(pt[nb][e], mod, scale, slope_log2, i, j, len_q, len_k,
                                                    need_mask && fad_band_masked(band, i, j), &g);
                    pt[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[i_loc]);
                }
                ds[nb][e] = fad_ds(pt[nb][e], dp, dsum[i_loc], g);
            }

        /* dV += P^T dO and dK += dS^T Q, P^T and dS^T from the accumulators
         * as A fragments. (Issued together, after dS^T: dV issued before it
         * kept P^T's fragments live beside dS^T, and the D128 build spilled.) */
        if constexpr (kSplit) { /* this warpgroup's chunks of P^T and dS^T, then both's in row order */
            uint32_t own_p[kMw / 16][4], own_s[kMw / 16][4];
#pragma unroll
            for (int kk = 0; kk < kMw / 16; kk++) {
                p_fragment<T>(pt, kk, own_p[kk]);
                p_fragment<T>(ds, kk, own_s[kk]);
            }
            uint4 *x = reinterpret_cast<uint4 *>(wg_smem + Smem::kXOffset) + (step & 1) * 2 * Smem::kXChunks * 128;
            split_store(x, own_p, wg, tid % 128);
            split_store(x + Smem::kXChunks * 128, own_s, wg, tid % 128);
            split_meet();
            split_load(x, pf, tid % 128);
            split_load(x + Smem::kXChunks * 128, sf, tid % 128);
        } else {
#pragma unroll
            for (int kk = 0; kk < kM / 16; kk++) {
                if constexpr (kDrop) { /* dV's P^T: rp P^T where kept, +0 where dropped (dkdv_kernel's) */
                    float pv[2][4];
#pragma unroll
                    for (int n = 0; n < 2; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            pv[n][e] = FAD_MUL(pt[2 * kk + n][e], drop.rp);
                    p_fragment<T>(pv, 0, pf[kk]);
#pragma unroll
                    for (int r = 0; r < 4; r++) /* (pf[kk][r]: n-block 2 kk + r / 2, keys + 8 (r % 2)) */
                        pf[kk][r] &= ~dropped.pair(2 * kk + r / 2, r % 2);
                } else {
                    p_fragment<T>(pt, kk, pf[kk]);
                }
                p_fragment<T>(ds, kk, sf[kk]);
            }
        }
        red.store_ds(sf, step, warp, lane); /* (kRed: dS for the fifth product) */
        red.turn_wait();
        float dqa[8][4]; /* (kRed: this step's dQ part; kLag: the last step's) */
        if constexpr (kEarlyStore) {
            /* dV, then dQ (once both warpgroups' dS is stored), then dK: once dQ
             * is done its part goes to the dQ warps while dK still runs. (Each
             * product's chain is unchanged, so are the bits.) */
            issue_rs_mn<T, C::kDCols, kM>(dv, pf, do_addr + col_bytes);
            red.issue(dqa, step);
            wgmma_wait<1>(); /* dV done */
            wgmma_fence_operand(dv);
            wgmma_fence_operand(pf);
            issue_rs_mn<T, C::kDCols, kM>(dk, sf, q_addr + col_bytes);
            wgmma_wait<1>(); /* dQ done */
            red.hand_off(dqa, step);
            wgmma_wait<0>();
            wgmma_fence_operand(dk);
            wgmma_fence_operand(sf);
            if (!(kPersist && step == steps - 1)) /* (kPersist: the item's last stage is dV's staging) */
                mbar_arrive(&empty[st]); /* (every math thread: see below) */
            continue;
        }
        issue_rs_mn<T, C::kDCols, kM>(dv, pf, do_addr + col_bytes);
        issue_rs_mn<T, C::kDCols, kM>(dk, sf, q_addr + col_bytes);
        red.issue(dqa, step);
        red.turn_pass();
        if constexpr (!C::kDkdvDefer) {
            wgmma_wait<0>();
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            wgmma_fence_operand(pf);
            wgmma_fence_operand(sf);
        }
        if constexpr (kWs) { /* this thread is done with the stage */
            static_assert(!C::kDkdvDefer, "kWs: the stage is released after its last product");
            /* Every math thread arrives, releasing its own plain loads of the
             * stage's row values (lse2, dsum). After a lane-0 arrival behind
             * __syncwarp (CUTLASS's pattern, the dQ kernel's release),
             * compute-sanitizer's racecheck reports the producer's next stores
             * there as racing with the other lanes' loads. (Not in the dQ
             * pass's D <= 128 kernels: at D128 ptxas then serialized their
             * wgmmas, C7512.) */
            if constexpr (kThreadRelease) {
                if (!(kPersist && step == steps - 1)) /* (kPersist: the item's last stage is dV's staging) */
                    mbar_arrive(&empty[st]);
            } else {
                warp_arrive(&empty[st], lane);
            }
        }
        /* kRed: the part to the dQ warps. After the stage's release: its wait
         * may follow another CTA's turn. */
        red.hand_off(dqa, step);
    }
    red.finish(steps);
    if constexpr (C::kDkdvDefer) {
        wgmma_wait<0>();
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
    }
    if constexpr (!kWs)
        cp_async_wait_all();

    /* dK and dV staged at s_dk, s_dv (wgmma.cuh: stage_acc) once both
     * warpgroups' products are done with that space (barrier 3: split_meet's,
     * the same 256 threads), then stored, the item's first key, n0, at each
     * tile's row 0 */
    auto store_dkdv_staged = [&](uint32_t s_dk, uint32_t s_dv) {
        named_bar_sync(3, C::kDkdvThreads);
        const uint32_t s[2] = {s_dk, s_dv};
        stage_acc<T, kHeadDim>(dk, s[0], key_row - lane / 4, col0, lane);
        stage_acc<T, kHeadDim>(dv, s[1], key_row - lane / 4, col0, lane);
        named_bar_sync(3, C::kDkdvThreads);
        T *const gl[2] = {(T *)a.dk + seq.k_off + (int64_t)n0 * p.k_row_stride + hk * p.k_head_stride,
                          (T *)a.dv + seq.v_off + (int64_t)n0 * p.v_row_stride + hk * p.v_head_stride};
        const int64_t stride[2] = {p.k_row_stride, p.v_row_stride};
        store_staged<T, kHeadDim, kN, C::kDkdvThreads>(s, gl, stride, len_k - n0, p.head_dim, tid);
    };
    if constexpr (kPersist) {
        /* Every product of the item is done (each step's, finish's): sK and
         * sV are the next item's at once (kv_empty), so that its K and V load
         * while dK and dV are staged and stored elsewhere: dK in the dS
         * buffers (free until the next item's first dS), dV in the item's
         * last ring stage (its Q and dO read; released to the producer once
         * the stores have read it). Staged in sK, sV, the next item's K/V
         * issued 4.1-4.4 us after the loop's end (D128 L8k,
         * dev/probe_bwd_item_timeline.patch), and the math warps waited for
         * them. Staged, not stored from the registers: those 4-byte stores
         * took 5 us at D128 and held up what the math warps did next. An item
         * without steps (its keys see no row) loaded no K/V and holds no
         * stage: its zeros go from the registers. */
        static_assert((size_t)kN * kHeadDim * 2 <= Smem::kDqOffset - Smem::kDsOffset &&
                          kN * kHeadDim <= C::kStepElems,
                      "dK staged in the dS buffers, dV in a ring stage");
        if (steps > 0) {
            mbar_arrive(kv_empty); /* (release: after this thread's products, which read sK, sV) */
            kv_uses++;
            const int st_last = (g + steps - 1) % kStages;
            if (a.dk) { /* (a dQ-only call passes no dK, dV) */
                store_dkdv_staged(smem_addr(wg_smem + Smem::kDsOffset), smem_addr(sQ + st_last * C::kStepElems));
                /* every thread done reading the staged dK before the next
                 * item's first dS lands there */
                named_bar_sync(3, C::kDkdvThreads);
            }
            mbar_arrive(&empty[st_last]); /* (the held stage; release: after this thread's reads of dV) */
        } else if (a.dk) {
            T *const gk = (T *)a.dk + seq.k_off + (int64_t)(n0 + key_row) * p.k_row_stride + hk * p.k_head_stride;
            T *const gv = (T *)a.dv + seq.v_off + (int64_t)(n0 + key_row) * p.v_row_stride + hk * p.v_head_stride;
            store_acc_rows<T>(dk, gk, p.k_row_stride, len_k - n0 - key_row, D, lane);
            store_acc_rows<T>(dv, gv, p.v_row_stride, len_k - n0 - key_row, D, lane);
        }
        g += steps;
        continue;
    }
    if (!kRed || a.dk) { /* (kRed: a dQ-only call passes no dK, dV) */
        /* (a CTA without steps never waited for its K/V copies) */
        if constexpr (kWs)
            if (steps == 0)
                mbar_wait(kv_full, 0);
        store_dkdv_staged(smem_addr(sK), smem_addr(sV)); /* (the other warpgroup's products read this one's keys) */
    }
    }
    red.base = g; /* (the CTA's steps) */
    red.drain();
}

template <typename T, int kHeadDim, bool kMod>
fad_status launch_dkdv_wgmma(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len)
{
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES], smem_set_red[FAD_MAX_DEVICES],
        smem_set_down[FAD_MAX_DEVICES], smem_set_red_drop[FAD_MAX_DEVICES], smem_set_down_drop[FAD_MAX_DEVICES];
    constexpr bool kWs = FAD_BWD_WG_DKDV_WS;
    const bool drop = a.p.dropout_p > 0.f;
    if (kMod && drop) /* (a score mod with dropout stays on mma.sync: bwd_launch.cu) */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma dK/dV for a score mod with dropout");
    /* (so no kMod kernel with dropout is built, nor a D256 one) */
    constexpr bool kDropBuilt = !bwd_wg_cfg<kHeadDim>::kSplitCols;
    if (!kDropBuilt && drop)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma dK/dV for D %d with dropout", kHeadDim);
    void (*kernel)(bwd_ws_args) = kMod || !drop ? dkdv_wgmma_kernel<T, kHeadDim, false, kWs, kMod>
                                                : dkdv_wgmma_kernel<T, kHeadDim, kDropBuilt, kWs, false>;
    size_t smem = drop ? dkdv_wgmma_smem<kHeadDim, kDropBuilt, kWs>::kBytes : dkdv_wgmma_smem<kHeadDim, false, kWs>::kBytes;
    int *set = drop ? smem_set_drop : smem_set;
    /* a.dq_accum: the variant that adds dQ (bwd_launch.cu picks it: D 64 and 128, no score mod
     * with dropout, refused above) */
    constexpr bool kRedBuilt = kWs && !bwd_wg_cfg<kHeadDim>::kSplitCols && !bwd_wg_cfg<kHeadDim>::kDkdvDefer;
    if (a.dq_accum) {
        if (!kRedBuilt)
            return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no dK/dV kernel that adds dQ for D %d", kHeadDim);
        /* (GQA: the walk down, the turns from the first key block up, bwd_block.cuh) */
        const bool down = dq_turns_from_first(a.p.num_heads, a.p.num_heads_k);
        if (drop) {
            kernel = down ? dkdv_wgmma_kernel<T, kHeadDim, kDropBuilt, kWs, false, kRedBuilt, kRedBuilt>
                          : dkdv_wgmma_kernel<T, kHeadDim, kDropBuilt, kWs, false, kRedBuilt>;
            smem = dkdv_wgmma_smem<kHeadDim, kDropBuilt, kWs, kRedBuilt>::kBytes;
            set = down ? smem_set_down_drop : smem_set_red_drop;
        } else {
            kernel = down ? dkdv_wgmma_kernel<T, kHeadDim, false, kWs, kMod, kRedBuilt, kRedBuilt>
                          : dkdv_wgmma_kernel<T, kHeadDim, false, kWs, kMod, kRedBuilt>;
            smem = dkdv_wgmma_smem<kHeadDim, false, kWs, kRedBuilt>::kBytes;
            set = down ? smem_set_down : smem_set_red;
        }
    }
    fad_status st = allow_smem(kernel, set, smem, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* (the producer's whole Q/dO tiles through the copy engine where it can) */
    bwd_ws_args wa;
    wa.a = a;
    const fad_fwd_params &p = a.p;
    constexpr int kM = bwd_wg_cfg<kHeadDim>::kStepM;
    wa.tma = kWs && fad_make_maps(p, p.batch, p.seqlen_q, p.num_heads, kM,
                                  {p.q, p.q_batch_stride, p.q_row_stride, p.q_head_stride},
                                  {a.dout, p.out_batch_stride, p.out_row_stride, p.out_head_stride}, &wa.map0,
                                  &wa.map1);
    /* a.dq_accum: the persistent grid (kPersist), a CTA an SM for all of the
     * call's items (one CTA fits an SM: its registers) */
    int64_t grid = ctas;
    if (a.dq_accum) {
        int sms = 0;
        st = fad_cuda_num_sms(&sms, msg, msg_len);
        if (st != FAD_OK)
            return st;
        grid = ctas < sms ? ctas : sms;
        /* FLASH_ATTN_DET_BWD_CTAS (read once; a test knob): at most this many CTAs, so
         * that small test grids still run many items a CTA (the bits are the same) */
        static int cap = -1;
        if (cap < 0) {
            const char *e = getenv("FLASH_ATTN_DET_BWD_CTAS");
            cap = e && atoi(e) > 0 ? atoi(e) : 0;
        }
        if (cap > 0 && grid > cap)
            grid = cap;
    }
    kernel<<<(unsigned)grid, dkdv_wgmma_shape<kHeadDim, kWs>::kThreads, smem, stream>>>(wa);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

#define FAD_INST(T, D)                                                                                    \
    template fad_status launch_dkdv_wgmma<T, D, false>(const bwd_args &, int64_t, cudaStream_t, char *, size_t); \
    template fad_status launch_dkdv_wgmma<T, D, true>(const bwd_args &, int64_t, cudaStream_t, char *, size_t);
FAD_BWD_WGMMA_VARIANTS(FAD_INST)
