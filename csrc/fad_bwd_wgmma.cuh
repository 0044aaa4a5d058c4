/*
 * fad_bwd_wgmma.cuh — the Hopper (sm_90a) variants of the backward's two
 * matmul kernels, dkdv_kernel and dq_kernel of fad_bwd.cu, on warpgroup MMA.
 * Included by fad_bwd.cu (bwd_args, lse_log2, first_row live there).
 *
 * Same work, same order, same fragments: each variant computes what its
 * mma.sync sibling computes, chain by chain (every product a chain of k16
 * steps in increasing order, fad_wgmma.cuh), with the same element-wise math
 * on the same accumulator layout. A wgmma chain rounds like the mma.sync
 * chain it replaces (scripts/wgmma_probe.cu), so the gradients keep their
 * bits (tests/test_backward.py compares the two variants bit for bit).
 * What changes is who reads the operands: the tensor cores read them from
 * 128-byte-swizzled shared memory (swz128) instead of every warp loading
 * fragments with ldmatrix, which is what bounded the mma.sync kernels
 * (benchmarks/NOTES.md, "Backward v1").
 *
 * dkdv_wgmma_kernel: one CTA per (sequence, kv head, kKeys keys); warpgroup w
 * owns keys 64w .. 64w + 63 of them, so each wgmma has M = 64 keys:
 *   S^T  (64 keys x kStepM rows) = K  Q^T     A: sK (K-major)  B: sQ (K-major)
 *   dP^T (64 keys x kStepM rows) = V  dO^T    A: sV            B: sdO
 *   dV   (64 keys x D)          += P^T  dO    A: P^T registers B: sdO (MN-major)
 *   dK   (64 keys x D)          += dS^T Q     A: dS^T registers B: sQ (MN-major)
 * Steps: the group's query heads in increasing order, then row tiles of
 * kStepM rows from the sequence's row 0 up (the mma.sync kernel's order; its
 * steps are shorter, which only regroups the same k16 chain).
 *
 * dq_wgmma_kernel: one CTA per (sequence, query head, kRows rows); warpgroup
 * w owns rows 64w .. 64w + 63:
 *   S  (64 rows x kTileN keys) = Q K^T        A: sQ            B: sK (K-major)
 *   dP (64 rows x kTileN keys) = dO V^T       A: sdO           B: sV (K-major)
 *   dQ (64 rows x D)          += dS K         A: dS registers  B: sK (MN-major)
 * Key tiles from key 0 up.
 *
 * Shapes: kHeadDim 64 or 128 (D <= kHeadDim, the columns beyond D zero-filled
 * in shared memory and never stored); no softcap or ALiBi (those stay on the
 * mma.sync kernels, as in the forward).
 */
#ifndef FAD_BWD_WGMMA_CUH
#define FAD_BWD_WGMMA_CUH

#include "fad_wgmma.cuh"

/* FAD_BWD_WG_DKDV_WGS / FAD_BWD_WG_DQ_WGS: warpgroups per CTA of each kernel
 * (64 keys per dkdv warpgroup, 64 rows per dq warpgroup). More share each
 * streamed tile's copy; fewer give more CTAs per SM that no barrier holds in
 * step. Changes no bit. */
#ifndef FAD_BWD_WG_DKDV_WGS
#define FAD_BWD_WG_DKDV_WGS 2
#endif
#ifndef FAD_BWD_WG_DQ_WGS_D64
#define FAD_BWD_WG_DQ_WGS_D64 1
#endif
#ifndef FAD_BWD_WG_DQ_WGS_D128
#define FAD_BWD_WG_DQ_WGS_D128 2
#endif
/* Deferred waits (changes no bit): the matmuls that end a step (dV, dK; dQ)
 * are left in flight while the next step's S and dP are issued, and waited
 * for with S; the streamed tiles then take 3 shared-memory stages, so that a
 * stage is reloaded only after every warpgroup has passed such a wait.
 * FAD_BWD_WG_DKDV_DEFER_MAX_D: dkdv defers up to this head dim (at D128 the
 * P^T and dS^T fragments no longer fit beside the next step's S^T and dP^T).
 * FAD_BWD_WG_DQ_DEFER: dq defers (1) or not (0). */
#ifndef FAD_BWD_WG_DKDV_DEFER_MAX_D
#define FAD_BWD_WG_DKDV_DEFER_MAX_D 0
#endif
#ifndef FAD_BWD_WG_DQ_DEFER
#define FAD_BWD_WG_DQ_DEFER 1
#endif
/* FAD_BWD_WG_D64_STEP_M / FAD_BWD_WG_D64_TILE_N: at D64, query rows per
 * dkdv step / keys per dq tile (64 or 128: the wgmma N of S^T, dP^T / of S,
 * dP). Changes no bit. */
#ifndef FAD_BWD_WG_D64_STEP_M
#define FAD_BWD_WG_D64_STEP_M 128
#endif
#ifndef FAD_BWD_WG_D64_TILE_N
#define FAD_BWD_WG_D64_TILE_N 128
#endif

template <int kHeadDim> struct bwd_wg_cfg {
    static constexpr int kDkdvThreads = FAD_BWD_WG_DKDV_WGS * 128;
    static constexpr int kDqWGs = kHeadDim <= 64 ? FAD_BWD_WG_DQ_WGS_D64 : FAD_BWD_WG_DQ_WGS_D128;
    static constexpr int kDqThreads = kDqWGs * 128;
    static constexpr int kKeys = FAD_BWD_WG_DKDV_WGS * 64; /* dkdv: keys per CTA */
    static constexpr int kStepM = kHeadDim <= 64 ? FAD_BWD_WG_D64_STEP_M : 64; /* dkdv: query rows per step */
    static constexpr int kRows = kDqWGs * 64;              /* dq: query rows per CTA */
    static constexpr int kTileN = kHeadDim <= 64 ? FAD_BWD_WG_D64_TILE_N : 64; /* dq: keys per step */
    static constexpr int kDB = kHeadDim / 8; /* n8 blocks of a dK / dV / dQ row */
    static constexpr bool kDkdvDefer = kHeadDim <= FAD_BWD_WG_DKDV_DEFER_MAX_D;
    static constexpr bool kDqDefer = FAD_BWD_WG_DQ_DEFER;
    static constexpr int kDkdvStages = kDkdvDefer ? 3 : 2, kDqStages = kDqDefer ? 3 : 2;
    /* dkdv shared memory: sK, sV (kKeys rows), then the stages of (sQ, sdO)
     * (kStepM rows each), then the stages of (lse2, dsum) (kStepM floats each). */
    static constexpr int kStepElems = 2 * kStepM * kHeadDim;
    static constexpr size_t kDkdvSmem = (size_t)2 * kKeys * kHeadDim * 2 +
                                        (size_t)kDkdvStages * (kStepElems * 2 + 2 * kStepM * 4);
    /* dq shared memory: sQ, sdO (kRows rows), then the stages of (sK, sV). */
    static constexpr int kKvElems = 2 * kTileN * kHeadDim;
    static constexpr size_t kDqSmem = (size_t)2 * kRows * kHeadDim * 2 + (size_t)kDqStages * kKvElems * 2;
    static_assert(kHeadDim == 64 || kHeadDim == 128, "wgmma backward: D 64 or 128");
    static_assert(kDkdvSmem <= 227 * 1024 && kDqSmem <= 227 * 1024, "shared memory");
};

/* Descriptor of k16 chunk kk of a K-major swz128 operand: rows 0.. of a tile
 * of kTileRows rows starting at desc0's address (32 bytes per chunk inside a
 * 64-column block, then the next block). */
template <int kTileRows>
__device__ __forceinline__ uint64_t kmajor_chunk(uint64_t desc0, int kk)
{
    return gmma_desc_at(desc0, ((kk / 4) * kTileRows * 64 + (kk % 4) * 16) * 2);
}

/* acc (64 x kHeadDim) += A (registers: a[kk] for k16 chunk kk) * B (a swz128
 * tile of kK rows x kHeadDim at b_addr, read MN-major: rows are the k dim). */
template <typename T, int kHeadDim, int kK>
__device__ __forceinline__ void issue_rs_mn(float (&acc)[kHeadDim / 8][4], uint32_t (&a)[kK / 16][4],
                                            uint32_t b_addr)
{
    const uint64_t b_desc0 = gmma_desc(b_addr, kK * 128, 1024);
    wgmma_fence_operand(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk++) /* 16 rows of 128 bytes per k-chunk */
        wgmma_rs_mnmajor(acc, a[kk], gmma_desc_at(b_desc0, kk * 16 * 128), (const T *)nullptr);
    wgmma_commit();
}

/* d (64 x kN) = A (this warpgroup's 64 rows of a K-major swz128 tile of kARows
 * rows at a_addr) * B^T (a K-major swz128 tile of kN rows at b_addr). The
 * first k-chunk overwrites d (accumulate 0), so d needs no zeroing. */
template <typename T, int kHeadDim, int kARows, int kN>
__device__ __forceinline__ void issue_ss(float (&d)[kN / 8][4], uint32_t a_addr, uint32_t b_addr)
{
    const uint64_t a_desc0 = gmma_desc(a_addr, 16, 1024), b_desc0 = gmma_desc(b_addr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; kk++)
        wgmma_ss(d, kmajor_chunk<kARows>(a_desc0, kk), kmajor_chunk<kN>(b_desc0, kk), (const T *)nullptr,
                 kk > 0);
    wgmma_commit();
}

/* S^T -> P^T in place (dkdv): element (nb, e) of a thread is key
 * key0 + 8 (e/2) and query row m0 + 8 nb + 2 (lane%4) + e%2, whose lse (log2
 * units) is lse2[row - m0]. kMask: some element may lie outside its row's
 * key range (else none does). The element-wise math of dkdv_kernel (its
 * mask through fad_band, the per-element form of fad_row_keys). */
template <bool kMask, int kMB>
__device__ __forceinline__ void scores_to_p(float (&pt)[kMB][4], const float *lse2,
                                            const fad_score_mod &mod, const fad_band &band, int m0,
                                            int key0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < kMB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2, i = m0 + i_loc, j = key0 + 8 * (e / 2);
            const float x = kMask && fad_band_masked(band, i, j) ? -INFINITY : pt[nb][e];
            pt[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[i_loc]);
        }
}

/* S -> P in place (dq): element (nb, e) of a thread is its row r = e/2
 * (lse2[r], key range rk[r]) and key t0 + 8 nb + 2 (lane%4) + e%2. */
template <bool kMask, int kNB>
__device__ __forceinline__ void scores_to_p(float (&pr)[kNB][4], const float (&lse2)[2],
                                            const fad_key_range (&rk)[2], const fad_score_mod &mod,
                                            int t0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < kNB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e / 2, j = t0 + nb * 8 + (lane % 4) * 2 + e % 2;
            const bool masked = kMask && (j < rk[r].lo || j >= rk[r].hi);
            const float x = masked ? -INFINITY : pr[nb][e];
            pr[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[r]);
        }
}

/* ------------------------------------------------------------------------ */
/* dK, dV                                                                     */
/* ------------------------------------------------------------------------ */

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(bwd_wg_cfg<kHeadDim>::kDkdvThreads, 1)
dkdv_wgmma_kernel(const __grid_constant__ bwd_args a)
{
    using C = bwd_wg_cfg<kHeadDim>;
    constexpr int kN = C::kKeys, kM = C::kStepM, kDB = C::kDB, kMB = kM / 8;
    const fad_fwd_params &p = a.p;
    dkdv_work w;
    if (!dkdv_work_of_cta<kN, kM>(a, 1, kHeadDim, &w))
        return;
    const fad_seq &seq = w.seq;
    const int hk = w.hk, group = w.group, n0 = w.n0;
    const int mt_first = w.mt_first, mt_count = w.mt_count;
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int wl = p.window_left, wr = p.window_right, D = p.head_dim;
    const int steps = group * mt_count; /* step = (group head g, row tile): g outer */

    extern __shared__ __align__(1024) unsigned char wg_smem[];
    T *sK = reinterpret_cast<T *>(wg_smem), *sV = sK + kN * kHeadDim;
    T *sQ = sV + kN * kHeadDim; /* stage st: + st * kStepElems; sdO follows sQ */
    float *sL = reinterpret_cast<float *>(sQ + C::kDkdvStages * C::kStepElems); /* [stage][kM] lse2, then dsum */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    const T *q_g = (const T *)p.q + seq.q_off, *do_g = (const T *)a.dout + seq.o_off;
    const int64_t lse_hs = fad_lse_head_stride(&p);

    auto load_step = [&](int step, int st) {
        const int h = hk * group + step / mt_count, m0 = (mt_first + step % mt_count) * kM;
        T *q_s = sQ + st * C::kStepElems;
        load_tile_lean<T, kHeadDim, kM, C::kDkdvThreads, true>(
            q_s, q_g + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride, (int)p.q_row_stride,
            len_q - m0, D);
        load_tile_lean<T, kHeadDim, kM, C::kDkdvThreads, true>(
            q_s + kM * kHeadDim, do_g + (int64_t)m0 * p.out_row_stride + h * p.out_head_stride,
            (int)p.out_row_stride, len_q - m0, D);
        for (int t = tid; t < kM; t += C::kDkdvThreads) {
            const int64_t flat = seq.row0 + h * lse_hs + m0 + t;
            const bool exists = m0 + t < len_q;
            sL[st * 2 * kM + t] = lse_log2(p, flat, exists);
            sL[st * 2 * kM + kM + t] = exists ? a.dsum[flat] : 0.f;
        }
    };

    /* Prologue: K, V and the first step's tiles in flight. */
    load_tile<T, kHeadDim, kN, C::kDkdvThreads, true>(
        sK, (const T *)p.k + seq.k_off + (int64_t)n0 * p.k_row_stride + hk * p.k_head_stride,
        (int)p.k_row_stride, len_k - n0, D);
    load_tile<T, kHeadDim, kN, C::kDkdvThreads, true>(
        sV, (const T *)p.v + seq.v_off + (int64_t)n0 * p.v_row_stride + hk * p.v_head_stride,
        (int)p.v_row_stride, len_k - n0, D);
    if (steps > 0)
        load_step(0, 0);
    cp_async_commit();

    /* This warpgroup's keys: n0 + 64 wg ..; this thread's: n0 + key_row + 8r. */
    const uint32_t k_addr = smem_addr(sK) + wg * 64 * 128, v_addr = smem_addr(sV) + wg * 64 * 128;
    const int key_row = warp * 16 + lane / 4, wg_n0 = n0 + wg * 64;
    const float scale = p.softmax_scale;
    const fad_score_mod mod = fad_make_score_mod(scale, 0.f, 0);
    const fad_band band = fad_make_band(len_q, len_k, wl, wr);
    float dk[kDB][4] = {}, dv[kDB][4] = {};
    uint32_t pf[kM / 16][4], sf[kM / 16][4]; /* P^T, dS^T as A fragments */

    for (int step = 0, st = 0; step < steps; step++, st = st + 1 == C::kDkdvStages ? 0 : st + 1) {
        cp_async_wait_all();
        fence_async_smem(); /* cp.async wrote what wgmma (the async proxy) reads next */
        __syncthreads();    /* step's tiles landed; every warp is done with the stage reloaded next */

        const int m0 = (mt_first + step % mt_count) * kM;
        const uint32_t q_addr = smem_addr(sQ + st * C::kStepElems), do_addr = q_addr + kM * kHeadDim * 2;
        const float *lse2 = sL + st * 2 * kM, *dsum = lse2 + kM;

        /* S^T = K Q^T, then dP^T = V dO^T: two groups in flight. */
        float pt[kMB][4], ds[kMB][4]; /* written by their first k-chunk */
        issue_ss<T, kHeadDim, kN, kM>(pt, k_addr, q_addr);
        issue_ss<T, kHeadDim, kN, kM>(ds, v_addr, do_addr);
        /* The next step's copies, while the tensor cores run S^T and dP^T. */
        if (step + 1 < steps)
            load_step(step + 1, st + 1 == C::kDkdvStages ? 0 : st + 1);
        cp_async_commit();
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
        if (wg_n0 < last.lo || wg_n0 + 64 > first.hi)
            scores_to_p<true, kMB>(pt, lse2, mod, band, m0, n0 + key_row);
        else
            scores_to_p<false, kMB>(pt, lse2, mod, band, m0, n0 + key_row);

        /* dS^T = P^T (dP^T - D) scale, in place in ds, once dP^T has landed. */
        wgmma_wait<0>();
        wgmma_fence_operand(ds);
#pragma unroll
        for (int nb = 0; nb < kMB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2;
                ds[nb][e] = FAD_MUL(FAD_MUL(pt[nb][e], FAD_ADD(ds[nb][e], -dsum[i_loc])), scale);
            }

        /* dV += P^T dO and dK += dS^T Q, P^T and dS^T from the accumulators
         * as A fragments. (Issued together, after dS^T: dV issued before it
         * kept P^T's fragments live beside dS^T, and the D128 build spilled.) */
#pragma unroll
        for (int kk = 0; kk < kM / 16; kk++) {
            p_fragment<T>(pt, kk, pf[kk]);
            p_fragment<T>(ds, kk, sf[kk]);
        }
        issue_rs_mn<T, kHeadDim, kM>(dv, pf, do_addr);
        issue_rs_mn<T, kHeadDim, kM>(dk, sf, q_addr);
        if constexpr (!C::kDkdvDefer) {
            wgmma_wait<0>();
            wgmma_fence_operand(dv);
            wgmma_fence_operand(dk);
            wgmma_fence_operand(pf);
            wgmma_fence_operand(sf);
        }
    }
    if constexpr (C::kDkdvDefer) {
        wgmma_wait<0>();
        wgmma_fence_operand(dv);
        wgmma_fence_operand(dk);
    }
    cp_async_wait_all();

    store_dkdv<T>(dk, dv, a, seq, hk, n0 + key_row, 0);
}

/* ------------------------------------------------------------------------ */
/* dQ                                                                         */
/* ------------------------------------------------------------------------ */

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(bwd_wg_cfg<kHeadDim>::kDqThreads, 1)
dq_wgmma_kernel(const __grid_constant__ bwd_args a)
{
    using C = bwd_wg_cfg<kHeadDim>;
    constexpr int kM = C::kRows, kN = C::kTileN, kDB = C::kDB, kNB = kN / 8;
    const fad_fwd_params &p = a.p;
    dq_work w;
    if (!dq_work_of_cta<kM, kN>(a, &w))
        return;
    const fad_seq &seq = w.seq;
    const int h = w.h, hk = w.hk, m0 = w.m0, t_first = w.t_first, t_last = w.t_last;
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int wl = p.window_left, wr = p.window_right, D = p.head_dim;

    extern __shared__ __align__(1024) unsigned char wg_smem[];
    T *sQ = reinterpret_cast<T *>(wg_smem), *sdO = sQ + kM * kHeadDim;
    T *sK = sdO + kM * kHeadDim, *sV = sK + kN * kHeadDim; /* stage st: + st * kKvElems */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = warp / 4;
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;
    auto load_kv = [&](int t0, int st) {
        load_tile_lean<T, kHeadDim, kN, C::kDqThreads, true>(sK + st * C::kKvElems, k_g + (int64_t)t0 * p.k_row_stride,
                                                      (int)p.k_row_stride, len_k - t0, D);
        load_tile_lean<T, kHeadDim, kN, C::kDqThreads, true>(sV + st * C::kKvElems, v_g + (int64_t)t0 * p.v_row_stride,
                                                      (int)p.v_row_stride, len_k - t0, D);
    };
    load_q_do<T, kHeadDim, kM, C::kDqThreads, true>(sQ, sdO, a, seq, h, m0);
    if (t_first < t_last)
        load_kv(t_first, 0);
    cp_async_commit();

    /* This thread's rows: m0 + row0 + 8r (warp w of the CTA owns rows 16w ..). */
    const int row0 = warp * 16 + lane / 4;
    float lse2[2], dsum[2];
    fad_key_range rk[2];
    dq_row_state(a, seq, h, m0 + row0, lse2, dsum, rk);
    /* A tile needs no mask when it lies inside every row of this warpgroup
     * (its last row: the last below len_q, or wg_m0 when it has none; such
     * rows have lse +inf, so their P is 0 whatever the mask). */
    const int wg_m0 = m0 + wg * 64;
    const fad_key_range wg_first = fad_row_keys(wg_m0, len_q, len_k, wl, wr);
    const fad_key_range wg_last = fad_row_keys(min(wg_m0 + 64, max(len_q, wg_m0 + 1)) - 1, len_q, len_k, wl, wr);
    const float scale = p.softmax_scale;
    const fad_score_mod mod = fad_make_score_mod(scale, 0.f, 0);
    const uint32_t q_addr = smem_addr(sQ) + wg * 64 * 128, do_addr = smem_addr(sdO) + wg * 64 * 128;
    float dq[kDB][4] = {};
    uint32_t sf[kN / 16][4]; /* dS as A fragments */

    for (int t0 = t_first, st = 0; t0 < t_last; t0 += kN, st = st + 1 == C::kDqStages ? 0 : st + 1) {
        cp_async_wait_all();
        fence_async_smem();
        __syncthreads();
        const uint32_t k_addr = smem_addr(sK + st * C::kKvElems), v_addr = k_addr + kN * kHeadDim * 2;

        /* S = Q K^T, then dP = dO V^T: two groups in flight. */
        float pr[kNB][4], ds[kNB][4]; /* written by their first k-chunk */
        issue_ss<T, kHeadDim, kM, kN>(pr, q_addr, k_addr);
        issue_ss<T, kHeadDim, kM, kN>(ds, do_addr, v_addr);
        /* The next tile's copies, while the tensor cores run S and dP. */
        if (t0 + kN < t_last)
            load_kv(t0 + kN, st + 1 == C::kDqStages ? 0 : st + 1);
        cp_async_commit();
        wgmma_wait<1>(); /* S landed (and, deferred, the last tile's dQ) */
        wgmma_fence_operand(pr);
        if constexpr (C::kDqDefer) {
            wgmma_fence_operand(dq);
            wgmma_fence_operand(sf);
        }
        /* P: element (nb, e) is row m0 + row0 + 8 (e/2), key t0 + 8 nb + 2 (lane%4) + e%2. */
        if (t0 < wg_last.lo || t0 + kN > wg_first.hi)
            scores_to_p<true>(pr, lse2, rk, mod, t0);
        else
            scores_to_p<false>(pr, lse2, rk, mod, t0);
        /* dS = P (dP - D) scale, in place in ds. */
        wgmma_wait<0>();
        wgmma_fence_operand(ds);
#pragma unroll
        for (int nb = 0; nb < kNB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[nb][e] = FAD_MUL(FAD_MUL(pr[nb][e], FAD_ADD(ds[nb][e], -dsum[e / 2])), scale);

        /* dQ += dS K (K read MN-major: its rows are the k dim). */
#pragma unroll
        for (int kk = 0; kk < kN / 16; kk++)
            p_fragment<T>(ds, kk, sf[kk]);
        issue_rs_mn<T, kHeadDim, kN>(dq, sf, k_addr);
        if constexpr (!C::kDqDefer) {
            wgmma_wait<0>();
            wgmma_fence_operand(dq);
            wgmma_fence_operand(sf);
        }
    }
    if constexpr (C::kDqDefer) {
        wgmma_wait<0>();
        wgmma_fence_operand(dq);
    }
    cp_async_wait_all();

    store_dq<T>(dq, a, seq, h, m0 + row0);
}

#endif /* FAD_BWD_WGMMA_CUH */
