/*
 * bwd_dq_wgmma.cu — the Hopper (sm_90a) variant of dq_kernel (bwd_dq.cu) on
 * warpgroup MMA; bwd_dkdv_wgmma.cu's header describes both variants.
 */
#include "bwd_tile_wgmma.cuh"

/* kWs (FAD_BWD_WG_DQ_WS_MIN_D): as dkdv_wgmma_kernel's (bwd_dkdv_wgmma.cu): a
 * producer warpgroup streams Q/dO once and then each step's K/V tiles into a
 * ring of kStages stages through mbarriers; the math warpgroups meet no CTA
 * barrier per step and issue no copy. The math is unchanged. */
template <int kHeadDim, bool kWs> struct dq_wgmma_shape {
    using C = bwd_wg_cfg<kHeadDim>;
    static constexpr int kThreads = C::kDqThreads + (kWs ? 128 : 0);
    static constexpr int kStages = C::kDqStages;
    /* setmaxnreg where the launch's share (65536 / kThreads) is below what the
     * math needs: two math warpgroups (D128, and D64:
     * FAD_BWD_WG_DQ_WGS_D64) */
    static constexpr bool kRegs = kWs && C::kDqWGs == 2;
    static constexpr int kProducerRegs = 40, kMathRegs = 232;
    static constexpr size_t kBarOffset = C::kDqSmem; /* (a multiple of 8) */
    /* kSplit (FAD_BWD_WG_D256_SPLIT_SDP): warpgroup w issues S and dP for keys
     * [kN/2 w, kN/2 (w + 1)) of a tile and the two exchange their dS fragments
     * (split_store / split_load, bwd_tile_wgmma.cuh) through kX, two buffers
     * (step parity) of kN/16 chunks of 128 uint4. */
    static constexpr bool kSplit = C::kSplitCols && FAD_BWD_WG_D256_SPLIT_SDP;
    /* kByProd (FAD_BWD_WG_D256_BY_PRODUCT, set by the kernel where it applies:
     * no score mod): S by warpgroup 0, dP by warpgroup 1; kX then holds warpgroup
     * 0's P (fp32, kRows x kTileN, in its accumulators' order: float4 i of
     * thread t at i * 128 + t) and warpgroup 1's dS fragments (kTileN / 16
     * chunks of 128 uint4), one buffer each: the barriers order their reuse. */
    static constexpr size_t kXOffset = (kBarOffset + (kWs ? (2 * kStages + 1) * sizeof(uint64_t) : 0) + 15) / 16 * 16;
    static constexpr size_t kSplitXBytes = (size_t)2 * (C::kTileN / 16) * 128 * 16;
    static constexpr size_t kByProdXBytes = (size_t)C::kRows * C::kTileN * 4 + (size_t)(C::kTileN / 16) * 128 * 16;
    static constexpr size_t kXBytes = !kSplit                                                     ? 0
                                      : FAD_BWD_WG_D256_BY_PRODUCT && kByProdXBytes > kSplitXBytes ? kByProdXBytes
                                                                                                    : kSplitXBytes;
    static constexpr size_t kSmemBytes = kXOffset + kXBytes;
    static_assert(!kRegs || (kProducerRegs + 2 * kMathRegs) * 128 <= 65536 / kThreads / 8 * 8 * kThreads,
                  "setmaxnreg: the registers the producer frees must cover the math warpgroups'");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <typename T, int kHeadDim, bool kDrop, bool kWs, bool kMod>
__global__ void __launch_bounds__(dq_wgmma_shape<kHeadDim, kWs>::kThreads, 1)
dq_wgmma_kernel(const __grid_constant__ bwd_ws_args wa)
{
    const bwd_args &a = wa.a;
    using C = bwd_wg_cfg<kHeadDim>;
    using Shape = dq_wgmma_shape<kHeadDim, kWs>;
    constexpr int kM = C::kRows, kN = C::kTileN, kDB = C::kDB, kNB = kN / 8, kStages = Shape::kStages;
    constexpr bool kByProd = Shape::kSplit && FAD_BWD_WG_D256_BY_PRODUCT && !kMod && !kDrop;
    constexpr bool kSplit = Shape::kSplit && !kByProd;
    constexpr int kNw = kSplit ? kN / 2 : kN; /* keys of a tile whose S and dP this warpgroup issues */
    static_assert(!(kDrop && C::kSplitCols), "D256 with dropout stays on mma.sync (bwd_launch.cu)");
    const fad_fwd_params &p = a.p;
    /* (pdl: launched as a programmatic dependent of the dK/dV kernel, whose
     * output it does not read, so that its CTAs take the SMs that kernel's
     * last wave leaves idle; every exit waits for that kernel to end, so the
     * two end in stream order: bwd_launch.cu) */
    dq_work w;
    if (!dq_work_of_cta<kM, kN>(a, &w)) {
        pdl_wait_primary();
        return;
    }
    const fad_seq &seq = w.seq;
    const int b = w.b, h = w.h, hk = w.hk, m0 = w.m0, t_first = w.t_first, t_last = w.t_last;
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int wl = p.window_left, wr = p.window_right, D = p.head_dim;

    extern __shared__ __align__(1024) unsigned char wg_smem[];
    T *sQ = reinterpret_cast<T *>(wg_smem), *sdO = sQ + kM * kHeadDim;
    T *sK = sdO + kM * kHeadDim, *sV = sK + kN * kHeadDim; /* stage st: + st * kKvElems */

    uint64_t *full = reinterpret_cast<uint64_t *>(wg_smem + Shape::kBarOffset); /* (kWs) */
    uint64_t *empty = full + kStages, *q_full = empty + kStages;
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;
    /* The loaders' threads: every thread, or (kWs) the producer warpgroup's. */
    constexpr int kLoaders = kWs ? 128 : C::kDqThreads;
    auto load_kv = [&](int t0, int st) {
        load_tile_lean<T, kHeadDim, kN, kLoaders, true>(sK + st * C::kKvElems, k_g + (int64_t)t0 * p.k_row_stride,
                                                        (int)p.k_row_stride, len_k - t0, D);
        load_tile_lean<T, kHeadDim, kN, kLoaders, true>(sV + st * C::kKvElems, v_g + (int64_t)t0 * p.v_row_stride,
                                                        (int)p.v_row_stride, len_k - t0, D);
    };
    if constexpr (kWs) {
        /* full: every producer thread's copies; empty: one arrival per math warp */
        ring_init(full, empty, kStages, 128, 4 * C::kDqWGs, q_full, 128);
        if (threadIdx.x < 128) {
            /* ---- producer: Q and dO, then each step's K/V tiles into the ring ---- */
            if constexpr (Shape::kRegs)
                setmaxnreg_dec<Shape::kProducerRegs>();
            /* Q and dO by cp.async, announced (landed, fenced) once the
             * first K/V tile's copies are issued (the dK/dV kernel's K and V
             * say why) */
            load_q_do<T, kHeadDim, kM, kLoaders, true>(sQ, sdO, a, seq, h, m0);
            cp_async_commit();
            /* wa.tma: a tile inside the sequence comes from the copy engine
             * (thread 0's arrival expects its bytes, the other threads' stands
             * in for their copies'); one the sequence's end cuts, by cp.async,
             * zero-filled, announced once landed and fenced (the writer's
             * fence: the math warps fence no step). */
            const int64_t k_row0 = wa.tma ? seq.k_off / p.k_row_stride : 0;
            const int64_t v_row0 = wa.tma ? seq.v_off / p.v_row_stride : 0;
            for (int t0 = t_first, i = 0; t0 < t_last; t0 += kN, i++) {
                const int st = i % kStages;
                ring_wait_empty(&empty[st], i, kStages); /* the math warps are done with the tile kStages back */
                if (wa.tma && t0 + kN <= len_k) {
                    if (threadIdx.x == 0) {
                        mbar_arrive_expect_tx(&full[st], 2u * kN * kHeadDim * 2);
                        tma_load_tile<kN, kHeadDim>(sK + st * C::kKvElems, &wa.map0, hk, (int)(k_row0 + t0), &full[st]);
                        tma_load_tile<kN, kHeadDim>(sV + st * C::kKvElems, &wa.map1, hk, (int)(v_row0 + t0), &full[st]);
                    } else {
                        mbar_arrive(&full[st]);
                    }
                } else {
                    load_kv(t0, st);
                    cp_async_announce(&full[st]);
                }
                if (i == 0)
                    cp_async_announce(q_full);
            }
            if (t_first >= t_last)
                cp_async_announce(q_full); /* (the math warps wait for it) */
            pdl_wait_primary();
            return;
        }
        if constexpr (Shape::kRegs)
            setmaxnreg_inc<Shape::kMathRegs>();
    } else {
        load_q_do<T, kHeadDim, kM, C::kDqThreads, true>(sQ, sdO, a, seq, h, m0);
        if (t_first < t_last)
            load_kv(t_first, 0);
        cp_async_commit();
    }
    /* The math warpgroups: tid from 0 */
    const int tid = threadIdx.x - (kWs ? 128 : 0), warp = tid / 32, lane = tid % 32;
    const int wg = uniform_warpgroup() - (kWs ? 1 : 0);

    /* This thread's rows: m0 + row0 + 8r (warp w of the CTA owns rows 16w ..;
     * kSplitCols: warp w of each warpgroup, whose dQ columns start at col0). */
    constexpr int kWgRows = C::kSplitCols ? 0 : 64;
    const int row0 = (C::kSplitCols ? warp % 4 : warp) * 16 + lane / 4;
    const int col0 = C::kSplitCols ? wg * C::kDCols : 0;
    float lse2[2], dsum[2];
    fad_key_range rk[2];
    dq_row_state(a, seq, h, m0 + row0, lse2, dsum, rk);
    /* A tile needs no mask when it lies inside every row of this warpgroup
     * (its last row: the last below len_q, or wg_m0 when it has none; such
     * rows have lse +inf, so their P is 0 whatever the mask). */
    const int wg_m0 = m0 + wg * kWgRows;
    const fad_key_range wg_first = fad_row_keys(wg_m0, len_q, len_k, wl, wr);
    const fad_key_range wg_last = fad_row_keys(min(wg_m0 + 64, max(len_q, wg_m0 + 1)) - 1, len_q, len_k, wl, wr);
    const float scale = p.softmax_scale;
    /* (kMod: dq_kernel's mod and slope; bwd_dkdv.cu says why the flag reads so) */
    const fad_score_mod mod = kMod ? fad_make_score_mod(scale, p.softcap, p.alibi_slopes != NULL || kDrop)
                                   : fad_make_score_mod(scale, 0.f, 0);
    const float slope_log2 = kMod ? fad_alibi_slope_log2(&p, b, h) : 0.f;
    fad_dropout drop = {}; /* (bwd_dsum.cu's header has the math) */
    int i_pos[2] = {0, 0}; /* this thread's rows' key-space positions, dropout's counter */
    if constexpr (kDrop) {
        drop = fad_dropout_of(&p, b);
        i_pos[0] = m0 + row0 + len_k - len_q, i_pos[1] = i_pos[0] + 8;
    }
    const uint32_t q_addr = smem_addr(sQ) + wg * kWgRows * 128, do_addr = smem_addr(sdO) + wg * kWgRows * 128;
    const uint32_t col_bytes = (uint32_t)(col0 / 64) * kN * 128; /* col0's block in sK */
    float dq[kDB][4] = {};
    uint32_t sf[kN / 16][4]; /* dS as A fragments */

    /* (kByProd) named barriers: warpgroup 0 stored P, warpgroup 1 stored dS
     * (1, 2 are warpgroup_sync's, 3 split_meet's and the epilogue's). Both
     * warpgroups sync on each, at one instruction outside their branches: with
     * the writer's bar.arrive instead, compute-sanitizer's racecheck reported
     * the next tile's stores as racing with this tile's loads, and with each
     * warpgroup's bar.sync in its own branch synccheck reported divergence. */
    enum { kBarPFull = 4, kBarDsFull = 5 };
    /* (kWs) a math warp releases a stage once its products on it are done:
     * with deferred waits, the step after (the dQ product still reads K) */
    auto release = [&](int st) { warp_arrive(&empty[st], lane); };
    if constexpr (kWs)
        mbar_wait(q_full, 0);
    for (int t0 = t_first, st = 0, i = 0; t0 < t_last; t0 += kN, st = st + 1 == kStages ? 0 : st + 1, i++) {
        if constexpr (kWs) {
            mbar_wait(&full[st], (i / kStages) & 1);
        } else {
            cp_async_wait_all();
            fence_async_smem(); /* cp.async wrote what wgmma (the async proxy) reads next */
            __syncthreads();
        }
        const uint32_t k_addr = smem_addr(sK + st * C::kKvElems), v_addr = k_addr + kN * kHeadDim * 2;

        /* S = Q K^T, then dP = dO V^T: two groups in flight (kSplit: this
         * warpgroup's kNw keys from tw0, K's and V's rows tw0 - t0 ..). */
        const int tw0 = t0 + (kSplit ? wg * kNw : 0);
        const uint32_t kv_row = (uint32_t)(tw0 - t0) * 128;
        float pr[kNw / 8][4], ds[kNw / 8][4]; /* written by their first k-chunk (kByProd: ds only) */
        if constexpr (kByProd) {
            /* one product a warpgroup, on one code path (a wgmma under a
             * branch makes ptxas serialize them): S = Q K^T into warpgroup 0's
             * ds, dP = dO V^T into warpgroup 1's */
            issue_ss<T, kHeadDim, kM, kN, kN>(ds, wg ? do_addr : q_addr, wg ? v_addr : k_addr);
            wgmma_wait<0>();
            wgmma_fence_operand(ds);
            float4 *xp = reinterpret_cast<float4 *>(wg_smem + Shape::kXOffset); /* P: kN / 2 float4 a thread */
            uint4 *xs = reinterpret_cast<uint4 *>(xp + kM * kN / 4);           /* dS: kN / 16 chunks */
            const int t = tid % 128;
            if (wg == 0) { /* P, as the split kernels make it, to warpgroup 1 */
                if (t0 < wg_last.lo || t0 + kN > wg_first.hi)
                    scores_to_p<true>(ds, lse2, rk, mod, t0);
                else
                    scores_to_p<false>(ds, lse2, rk, mod, t0);
#pragma unroll
                for (int nb = 0; nb < kN / 8; nb++)
                    xp[nb * 128 + t] = make_float4(ds[nb][0], ds[nb][1], ds[nb][2], ds[nb][3]);
            }
            named_bar_sync(kBarPFull, 256);
            if (wg == 1) { /* dS = P (dP - D) scale, element by element as the split kernels */
#pragma unroll
                for (int nb = 0; nb < kN / 8; nb++) {
                    const float4 pv = xp[nb * 128 + t];
                    const float pe[4] = {pv.x, pv.y, pv.z, pv.w};
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        ds[nb][e] = fad_ds(pe[e], ds[nb][e], dsum[e / 2], scale);
                }
                uint32_t own[kN / 16][4];
#pragma unroll
                for (int kk = 0; kk < kN / 16; kk++)
                    p_fragment<T>(ds, kk, own[kk]);
                split_store(xs, own, 0, t);
            }
            named_bar_sync(kBarDsFull, 256);
            split_load(xs, sf, t);
            issue_rs_mn<T, C::kDCols, kN>(dq, sf, k_addr + col_bytes);
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            wgmma_fence_operand(sf);
            if constexpr (kWs)
                release(st);
            continue;
        } else {
            issue_ss<T, kHeadDim, kM, kNw, kN>(pr, q_addr, k_addr + kv_row);
            issue_ss<T, kHeadDim, kM, kNw, kN>(ds, do_addr, v_addr + kv_row);
        }
        /* The next tile's copies, while the tensor cores run S and dP. */
        if constexpr (!kWs) {
            if (t0 + kN < t_last)
                load_kv(t0 + kN, st + 1 == kStages ? 0 : st + 1);
            cp_async_commit();
        }
        fad_u32x4 dbits[2][dropout_tile_draws<kNB>::kDraws]; /* (kDrop) this tile's dropout draws */
        if constexpr (kDrop) /* the draws need neither S nor dP: issued before the waits */
            dropout_draw_tile<2, kNB>(dbits, drop, h, i_pos, t0);
        wgmma_wait<1>(); /* S landed (and, deferred, the last tile's dQ) */
        wgmma_fence_operand(pr);
        if constexpr (C::kDqDefer) {
            wgmma_fence_operand(dq);
            wgmma_fence_operand(sf);
            if constexpr (kWs)
                if (i > 0) /* the last tile's dQ product, its last read of that stage, is done */
                    release(st == 0 ? kStages - 1 : st - 1);
        }
        /* P: element (nb, e) is row m0 + row0 + 8 (e/2), key t0 + 8 nb + 2 (lane%4) + e%2. */
        const bool need_mask = t0 < wg_last.lo || t0 + kN > wg_first.hi;
        if constexpr (!kMod) {
            if (need_mask)
                scores_to_p<true>(pr, lse2, rk, mod, tw0);
            else
                scores_to_p<false>(pr, lse2, rk, mod, tw0);
        }
        /* dS = P (dP - D) scale, in place in ds. kMod: P here too, element by
         * element as dq_kernel makes it, and dS with its gradient factor. */
        wgmma_wait<0>();
        wgmma_fence_operand(ds);
        if constexpr (kDrop) /* dP of a kept element times rp, of a dropped one 0 (dq_kernel's; not kSplit) */
            dropout_walk_drawn<2, kNB>(drop, dbits, t0, [&](int r, int nb, int e, bool kept) {
                float &x = ds[nb][2 * r + e];
                x = kept ? FAD_MUL(x, drop.rp) : 0.f;
            });
#pragma unroll
        for (int nb = 0; nb < kNw / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float g = scale;
                if constexpr (kMod) {
                    const int r = e / 2, i = m0 + row0 + 8 * r, j = tw0 + nb * 8 + (lane % 4) * 2 + e % 2;
                    const bool masked = need_mask && (j < rk[r].lo || j >= rk[r].hi);
                    const float x = bwd_score<true>(pr[nb][e], mod, scale, slope_log2, i, j, len_q, len_k,
                                                    masked, &g);
                    pr[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[r]);
                }
                ds[nb][e] = fad_ds(pr[nb][e], ds[nb][e], dsum[e / 2], g);
            }

        /* dQ += dS K (K read MN-major: its rows are the k dim); kSplit: this
         * warpgroup's chunks of dS, then both warpgroups' in key order. */
        if constexpr (kSplit) {
            uint32_t own[kNw / 16][4];
#pragma unroll
            for (int kk = 0; kk < kNw / 16; kk++)
                p_fragment<T>(ds, kk, own[kk]);
            uint4 *x = reinterpret_cast<uint4 *>(wg_smem + Shape::kXOffset) + (i & 1) * (kN / 16) * 128;
            split_store(x, own, wg, tid % 128);
            split_meet();
            split_load(x, sf, tid % 128);
        } else {
#pragma unroll
            for (int kk = 0; kk < kN / 16; kk++)
                p_fragment<T>(ds, kk, sf[kk]);
        }
        issue_rs_mn<T, C::kDCols, kN>(dq, sf, k_addr + col_bytes);
        if constexpr (!C::kDqDefer) {
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            wgmma_fence_operand(sf);
            if constexpr (kWs)
                release(st);
        }
    }
    if constexpr (C::kDqDefer) {
        wgmma_wait<0>();
        wgmma_fence_operand(dq);
    }
    if constexpr (!kWs)
        cp_async_wait_all();

    /* dQ staged where Q was (bwd_tile_wgmma.cuh: stage_acc), once every
     * product is done with it (barrier 3: split_meet's, the same threads) */
    named_bar_sync(3, C::kDqThreads);
    const uint32_t s[1] = {smem_addr(sQ)};
    stage_acc<T, kHeadDim>(dq, s[0], row0 - lane / 4, col0, lane);
    named_bar_sync(3, C::kDqThreads);
    T *const g[1] = {(T *)a.dq + seq.q_off + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride}; /* (row m0 first) */
    const int64_t stride[1] = {p.q_row_stride};
    store_staged<T, kHeadDim, kM, C::kDqThreads>(s, g, stride, len_q - m0, D, tid);
    pdl_wait_primary();
}

template <typename T, int kHeadDim, bool kMod>
fad_status launch_dq_wgmma(const bwd_args &a, int64_t ctas, cudaStream_t stream, int pdl, char *msg,
                           size_t msg_len)
{
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES];
    constexpr bool kWs = kHeadDim >= FAD_BWD_WG_DQ_WS_MIN_D;
    using Shape = dq_wgmma_shape<kHeadDim, kWs>;
    const bool drop = a.p.dropout_p > 0.f;
    if (kMod && drop) /* (a score mod with dropout stays on mma.sync: bwd_launch.cu) */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma dQ for a score mod with dropout");
    /* (so no kMod kernel with dropout is built, nor a D256 one) */
    constexpr bool kDropBuilt = !bwd_wg_cfg<kHeadDim>::kSplitCols;
    if (!kDropBuilt && drop)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma dQ for D %d with dropout", kHeadDim);
    void (*kernel)(bwd_ws_args) = kMod || !drop ? dq_wgmma_kernel<T, kHeadDim, false, kWs, kMod>
                                                : dq_wgmma_kernel<T, kHeadDim, kDropBuilt, kWs, false>;
    fad_status st = allow_smem(kernel, drop ? smem_set_drop : smem_set, Shape::kSmemBytes, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* (the producer's whole K/V tiles through the copy engine where it can) */
    bwd_ws_args wa;
    wa.a = a;
    const fad_fwd_params &p = a.p;
    using C = bwd_wg_cfg<kHeadDim>;
    wa.tma = kWs && fad_make_kv_maps(p, C::kTileN, &wa.map0, &wa.map1);
    return launch_kernel(kernel, dim3((unsigned)ctas), Shape::kThreads, Shape::kSmemBytes, stream, pdl, wa, msg,
                         msg_len);
}

#define FAD_INST(T, D)                                                                                  \
    template fad_status launch_dq_wgmma<T, D, false>(const bwd_args &, int64_t, cudaStream_t, int, char *, size_t); \
    template fad_status launch_dq_wgmma<T, D, true>(const bwd_args &, int64_t, cudaStream_t, int, char *, size_t);
FAD_BWD_WGMMA_VARIANTS(FAD_INST)
