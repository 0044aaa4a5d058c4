/*
 * fwd_prefill_kernel.cuh — the prefill kernel (fwd_kernel) on the fixed split plan,
 * on mma.sync and, on sm_90a, its one-warpgroup wgmma variant. fwd_prefill.cu
 * launches it and compiles its variants but the group walk's (kGroups), which
 * fwd_prefill_groups.cu compiles, so that the two compile side by side.
 *
 * Shapes (flash_attn layout, strides from fad_fwd_params; fad_seq.h says
 * where sequence b lives):
 *   padded: q, out (B, Sq, Hq, D)   k, v (B, Sk, Hkv, D)     lse (B, Hq, Sq) fp32
 *   varlen: q, out (total_q, Hq, D) k, v (total_k, Hkv, D)   lse (Hq, total_q) fp32
 *   workspace (partials): o [split][flat row][D] fp32, ml [split][flat row][2] fp32,
 *   flat row = the row's index in lse.
 *
 * One CTA = one (sequence, head, query tile of kBlockM rows); 16 query rows per
 * warp (32 in the wide variant), warps per CTA by head dim (fwd_cfg). It walks
 * kBlockN-key tiles in increasing order. Tiles belong to splits
 * at absolute positions [s*S, (s+1)*S); a split starts from a fresh online-
 * softmax state and, when it ends, is merged into the row's result R with
 * fad_merge_* (fad_math.h). Either all splits of a row run in one CTA (R lives
 * in shared memory or registers), or each split runs in its own CTA and writes its state to
 * the workspace, and combine_kernel folds the states left to right with the
 * same merge. Both give the same bits: the fold is the same sequence of the
 * same operations, and skipped tiles/splits are exact identities.
 *
 * Tensor cores: mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate), operands
 * from XOR-swizzled shared memory through ldmatrix (.trans for V), P kept in
 * registers and fed back as the A operand, cp.async for global->shared.
 * On sm_90 (from an sm_90a build) the prefill kernel at D 64/128, without
 * softcap, ALiBi or pages, runs its wgmma variant instead (fwd_cfg<D, true>, attend_tile_wgmma, wgmma.cuh):
 * each warpgroup issues S = Q K^T (Q from registers) and O += P V (P from
 * registers, V from 128-byte-swizzled shared memory) as wgmma chains, and the
 * merged result R stays in registers. The tile walk, the fragments and the
 * softmax code are the mma.sync variant's, and a wgmma chain rounds like the
 * mma.sync chain it replaces (tests/wgmma_probe.cu; tests/test_contract.py
 * compares the variants), so the bits are the same on either. At D 128 that
 * variant, and at D 256 the mma.sync kernel, give way to the warp-specialized
 * fwd_ws_kernel (fwd_prefill_ws.cu: a producer warpgroup copies K/V for two
 * consumer warpgroups, one at D 256, each running this file's tile math on
 * its 64 rows).
 * kDrop: dropout, a variant of each of the above (softcap/ALiBi or not). The
 * mma.sync kernel zeroes dropped elements of P in fp32 (dropout_tile), the
 * wgmma ones the halves of P's packed fragments (dropout.cuh, dropout_pf):
 * the same bits, as every variant's P.
 */
#ifndef FAD_FWD_PREFILL_KERNEL_CUH
#define FAD_FWD_PREFILL_KERNEL_CUH

#include "fwd_block.cuh"
#include "fwd_tile_wgmma.cuh"

/* The prefill kernel: one CTA per (sequence, query head, kBlockM query rows).
 * kGroups (mma.sync only): the one-CTA walk of a plan past FAD_MERGE_GROUP
 * splits, which folds them in two levels (fold_group_close / fold_group_end,
 * X slots in the workspace); without it the group logic is compiled out, since
 * in every walk it cost ordinary calls 3-11% of the forward (docs/design.md,
 * "merge-groups"). */
template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kWgmma, bool kDrop = false, bool kGroups = false>
__global__ void __launch_bounds__(fwd_cfg<kHeadDim, kWgmma>::kThreads, fwd_cfg<kHeadDim, kWgmma>::kMinBlocks)
fwd_kernel(const __grid_constant__ fwd_args a)
{
    pdl_launch_dependents(); /* the combine, if any, may start launching (it waits for us) */
    using C = fwd_cfg<kHeadDim, kWgmma>;
    constexpr int kMT = C::kMT, kBlockM = C::kBlockM, kBlockN = C::kBlockN, kDB = C::kDBlocks;
    constexpr int kRows = 2 * kMT; /* rows per thread */
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size;

    const int m_block = blockIdx.x % a.plan.m_blocks;
    const int bh = blockIdx.x / a.plan.m_blocks;
    const int b = bh / p.num_heads, h = bh % p.num_heads;
    const int hk = h / (p.num_heads / p.num_heads_k);
    const fad_seq seq = fad_get_seq(&p, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int m0 = m_block * kBlockM;
    if (!seq.valid && p.cache_seqlens && !a.plan.cta_per_split) { /* (else the combine does it) */
        for (int i = m0 + (int)threadIdx.x / 32; i < m0 + kBlockM; i += C::kThreads / 32)
            poison_row(p, seq, h, i, threadIdx.x % 32, 32);
        return;
    }
    if (m0 >= len_q)
        return;
    const int64_t lse_row0 = seq.row0 + h * fad_lse_head_stride(&p); /* flat row of query 0 */
    const int m_end = min(m0 + kBlockM, len_q);

    /* Keys any row of this tile may see: lo and hi grow with the row index. */
    const fad_key_range first_row = fad_row_keys(m0, len_q, len_k, p.window_left, p.window_right);
    const fad_key_range last_row = fad_row_keys(m_end - 1, len_q, len_k, p.window_left, p.window_right);
    const bool partial = a.plan.cta_per_split;
    int t_first, t_last;
    if (!tile_walk<kBlockN>(a.plan, first_row, last_row, len_k, &t_first, &t_last))
        return; /* this split is masked for every row: the combine skips it too */

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    float *sR = reinterpret_cast<float *>(smem_raw);
    T *sQ = reinterpret_cast<T *>(smem_raw + (C::kSmemQ ? C::kSmemR : 0));
    T *sK = reinterpret_cast<T *>(smem_raw + C::kSmemR + C::kSmemQ); /* stage s: + s * kStageElems */
    T *sV = sK + kBlockN * kHeadDim;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int D = p.head_dim;
    const T *q_g = (const T *)p.q + seq.q_off + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride;
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;

    /* This thread's rows: row0 + 8r (tile-local), r = 2*mt + e/2. */
    const int row0 = warp * 16 * kMT + lane / 4;
    /* A tile needs no mask when it lies inside every row's range. */
    const int unmasked_lo = last_row.lo, unmasked_hi = first_row.hi;
    /* (kMod's code makes log2 logits of every score, so its mod must say so:
     * true at run time, since dispatch_mod sends only softcap or ALiBi to kMod,
     * and a compile-time true in kMod's dropout variant, whose code that keeps
     * as it was -- 8 B of spills at D128 where a run-time flag gave 24 B) */
    const fad_score_mod mod =
        fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL || (kMod && kDrop));
    const rows_prefill rows = {m0 + row0, fad_alibi_slope_log2(&p, b, h)};
    fad_dropout drop = {}; /* (all zero, rp included, unless kDrop: read only under kDrop) */
    int i_pos[kRows] = {}; /* (wgmma, kDrop) this thread's rows' key-space positions */
    if constexpr (kDrop) {
        drop = fad_dropout_of(&p, b);
#pragma unroll
        for (int r = 0; r < kRows; r++)
            i_pos[r] = rows.qrow(r) + len_k - len_q;
    }
    const dropout_bytes keep(drop);

    /* Merged result R: (m, l) in registers, o in sR (or oR) once a second split starts. */
    float mR[kRows], lR[kRows];
    float oR[C::kRInRegs ? kMT : 1][C::kRInRegs ? kDB : 1][4] = {}; /* the empty state's o */
    bool have_R = false;
    /* Current split: o in registers, l per thread (quad-summed when the split ends). */
    float acc[kMT][kDB][4] = {}, m_s[kRows], l_s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++)
        mR[r] = m_s[r] = -INFINITY, lR[r] = l_s[r] = 0.f;
    /* The state above is a fresh one (start_split) for the first tile's split;
     * split_left counts the tiles of the current split still to walk (no
     * division per tile: registers are scarce in the loop). */
    const bool walked = t_first < t_last;
    int split_left = fad_split_tiles_left(t_first, S, kBlockN);
    bool acc_live = false; /* (wgmma) acc holds this split's o: false until its first P V */
    auto with_R = [&](auto f) {
        if constexpr (C::kRInRegs)
            f(r_in_regs<kMT, kDB>{oR});
        else
            f(r_in_smem<kMT, kDB, C::kThreads>{sR, (int)threadIdx.x});
    };
    auto fold = [&](bool to_R) {
        with_R([&](const auto &R) { fold_split(acc, m_s, l_s, mR, lR, R, have_R, to_R); });
    };
    static_assert(!kGroups || !kWgmma, "the group walk is fwd_kernel's mma.sync variant's");
    /* (kGroups) X: the outer result of a walk across split groups
     * (fold_group_close); its slot's index in shared memory on sm_80, in a
     * register on sm_90, whichever spilled this kernel's builds less (ptxas -v) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
    x_slot<kMT, kDB, C::kSmemXAt> X;
#else
    x_slot<kMT, kDB> X;
#endif
    if constexpr (kGroups)
        X.set(-1);
    const x_pool pool = {a.ws_x, a.ws_x_flag, a.plan.x_slots};

    /* Loads K and V tile t0 into stage st. */
    auto copy_tile = [&](T *dst, const T *src, int row_stride, int rows) {
        if constexpr (kWgmma && FAD_WG_LEAN_LOADS)
            load_tile_lean<T, kHeadDim, kBlockN, C::kThreads, true>(dst, src, row_stride, rows, D);
        else
            load_tile<T, kHeadDim, kBlockN, C::kThreads, kWgmma>(dst, src, row_stride, rows, D);
    };
    bool bad_page = false; /* paged: this thread met a page outside the cache */
    auto load_kv = [&](int t0, int st) {
        if constexpr (kPaged) {
            bad_page |= load_kv_paged<T, kHeadDim, kBlockN, C::kThreads, kWgmma>(
                sK + st * C::kStageElems, sV + st * C::kStageElems, p, seq,
                (const T *)p.k + hk * p.k_head_stride, (const T *)p.v + hk * p.v_head_stride, t0,
                len_k - t0, D);
        } else {
            copy_tile(sK + st * C::kStageElems, k_g + (int64_t)t0 * p.k_row_stride,
                      (int)p.k_row_stride, len_k - t0);
            copy_tile(sV + st * C::kStageElems, v_g + (int64_t)t0 * p.v_row_stride,
                      (int)p.v_row_stride, len_k - t0);
        }
    };

    /* Prologue: Q and the first K/V tiles in flight. */
    load_tile<T, kHeadDim, kBlockM, C::kThreads, kWgmma>(sQ, q_g, (int)p.q_row_stride, m_end - m0, D);
    if (t_first < t_last)
        load_kv(t_first, 0);
    cp_async_commit();

    uint32_t qf[kMT][C::kQInRegs ? kHeadDim / 16 : 1][4];
    /* Per-thread ldmatrix bases: A (Q) and V read chunk 2kk + lane/16 of row
     * lane % 16 (+8 for V's second matrix pair); K reads chunk 2kk + (lane/8) % 2. */
    const lds_base<kHeadDim> q_lds(sQ, warp * 16 * kMT + lane % 16, lane / 16);
    const lds_base<kHeadDim> k_lds0(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> v_lds0(sV, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

    /* Q's A fragments, once its tile has landed. */
    auto load_qf = [&]() {
#pragma unroll
        for (int mt = 0; mt < kMT; mt++)
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; kk++)
                ldmatrix_x4(qf[mt][C::kQInRegs ? kk : 0],
                            kWgmma ? smem_addr(sQ + swz128<kBlockM>(warp * 16 + lane % 16,
                                                                   16 * kk + 8 * (lane / 16)))
                                   : q_lds.at(mt * 16, kk));
    };
    const uint32_t q_addr = smem_addr(sQ) + uniform_warpgroup() * 64 * 64 * 2; /* this warpgroup's Q rows */

    for (int t0 = t_first, stage = 0; t0 < t_last; t0 += kBlockN, stage ^= 1) {
        cp_async_wait_all();
        if (kWgmma)
            fence_async_smem(); /* cp.async wrote what wgmma (the async proxy) reads next */
        __syncthreads(); /* K/V(t0) landed; every warp is done with the other stage (and with sQ) */
        /* The next tile's copies: issued here, or (wgmma) while S is computed,
         * where they also keep the accumulators out of the registers the
         * copy addresses would take. */
        auto load_next = [&]() {
            if (t0 + kBlockN < t_last)
                load_kv(t0 + kBlockN, stage ^ 1);
            cp_async_commit();
        };
        if constexpr (!kWgmma || !FAD_WG_LOADS_DURING_S)
            load_next();

        if constexpr (C::kQInRegs)
            if (t0 == t_first)
                load_qf();

        const bool need_mask = t0 < unmasked_lo || t0 + kBlockN > unmasked_hi;
        if constexpr (kWgmma) {
            fad_u32x4 dbits[2][1]; /* (kDrop) this tile's dropout draws, one per row */
            const uint32_t k_addr = smem_addr(sK + stage * C::kStageElems);
            attend_tile_wgmma<T, kHeadDim, kBlockN, kBlockM, C::kQInRegs, kMod>(
                acc, m_s, l_s, qf, q_addr, k_addr,
                k_addr + kBlockN * kHeadDim * 2, need_mask, mod, rows, t0, len_q, len_k,
                p.window_left, p.window_right, acc_live,
                [&]() {
                    if constexpr (FAD_WG_LOADS_DURING_S)
                        load_next();
                    /* (the draws need no S: issued before its wait; ptxas mixes
                     * them with the exponentials) */
                    if constexpr (kDrop)
                        dropout_draw_tile<2, kBlockN / 8>(dbits, drop, h, i_pos, t0);
                },
                [&](uint32_t (&pf)[kBlockN / 16][4]) {
                    if constexpr (kDrop)
                        dropout_pf(pf, keep, dbits);
                });
            acc_live = true;
        } else {
            attend_tile<T, kHeadDim, kBlockN, kMT, C::kQInRegs, kMod, kDrop>(
                acc, m_s, l_s, qf, q_lds, k_lds0.reload(stage * C::kStageElems * 2),
                v_lds0.reload(stage * C::kStageElems * 2), need_mask, mod, rows, t0, len_q, len_k,
                p.window_left, p.window_right, drop, h);
        }
        /* A split ends with this tile and another follows: fold it into R and
         * start a fresh state. (Done here, where acc was just written, rather
         * than at the next tile's start: ptxas then copied acc out of the
         * wgmma accumulator registers on every iteration for that fold.) */
        if (--split_left == 0 && t0 + kBlockN < t_last) { /* (CTA-uniform) */
            /* sQ inside sR: every warp must have read Q before sR is written */
            if (C::kSmemQ == 0 && t0 == t_first)
                __syncthreads();
            fold(true); /* never in a partial CTA: it walks one split */
            if constexpr (kGroups)
                if (fad_group_closes(fad_split_of(t0, S))) /* (CTA-uniform; once per FAD_MERGE_GROUP splits) */
                    with_R([&](const auto &R) { fold_group_close(mR, lR, R, have_R, X, pool); });
            split_left = S / kBlockN;
            if constexpr (kWgmma)
                start_split_ml<kMT>(m_s, l_s), acc_live = false;
            else
                start_split(acc, m_s, l_s);
        }
    }
    cp_async_wait_all();
    /* a page outside the cache: every row of the CTA gets NaN (CTA-uniform branch) */
    const bool poison = kPaged ? __syncthreads_or(bad_page) != 0 : false;

    if (partial) { /* the CTA's one split ends: write its (m, l, o) out */
        if (walked)
            store_split_rows(a, D, fad_split_of(t_first, S), lse_row0, m0, row0, len_q, acc, m_s, l_s, poison);
        return;
    }
    if (walked) { /* R is now in acc, mR, lR */
        fold(false);
        if constexpr (kGroups)
            fold_group_end(acc, mR, lR, X, pool);
    }
    /* O staged in the K/V stages, which every warp is done with once all
     * meet (kPaged: they just did), each warp its 16 kMT rows */
    static_assert(C::kBlockM * kHeadDim <= 2 * C::kStageElems, "O's staging fits the K/V stages");
    if constexpr (!kPaged)
        __syncthreads();
    store_result_staged<T, kHeadDim, kMT>(p, D, seq, h, lse_row0, m0 + warp * 16 * kMT, len_q, acc, mR, lR, poison,
                                          kDrop ? drop.rp : 1.f, smem_addr(sK + warp * 16 * kMT * kHeadDim),
                                          lane);
}

/* The kGroups variants (mma.sync, no dropout: launch_prefill picks them),
 * compiled in fwd_prefill_groups.cu alone: launch_prefill takes them from
 * there by pointer (nvcc refuses an extern template of a kernel in a
 * whole-program build, and a kernel named here would be compiled again). */
typedef void (*fwd_kernel_fn)(fwd_args);
template <typename T, int kHeadDim, bool kMod, bool kPaged>
fwd_kernel_fn fwd_groups_kernel();

#endif
