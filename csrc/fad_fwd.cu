/*
 * fad_fwd.cu — the forward kernel on the fixed split plan, its combine kernel
 * and the single dispatch point that picks a compile-time variant.
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
 * softcap, ALiBi or pages, runs its wgmma variant instead (fwd_cfg<D, true>, attend_tile_wgmma, fad_wgmma.cuh):
 * each warpgroup issues S = Q K^T (Q from registers) and O += P V (P from
 * registers, V from 128-byte-swizzled shared memory) as wgmma chains, and the
 * merged result R stays in registers. The tile walk, the fragments and the
 * softmax code are the mma.sync variant's, and a wgmma chain rounds like the
 * mma.sync chain it replaces (scripts/wgmma_probe.cu; tests/test_gpu.py
 * compares the variants), so the bits are the same on either. At D 128 that
 * variant is the warp-specialized fwd_ws_kernel (fad_fwd_ws.cuh: a producer
 * warpgroup copies K/V for two consumer warpgroups, each running this file's
 * tile math on its 64 rows).
 */
#include <stdlib.h>
#include <string.h>

#include "fad_mma.cuh"
#include "fad_seq.h"
#include "fad_wgmma.cuh"

/* ------------------------------------------------------------------------ */
/* the per-tile math both forward kernels share                               */
/* ------------------------------------------------------------------------ */

/* Where a thread's rows come from. A thread holds rows r = 2*mt + e/2 of its
 * warp's 16*kMT (fragment element (mt, nb, e) belongs to row r). qrow(r): the
 * row's query index in its sequence (its mask and its ALiBi position);
 * slope(r): its ALiBi slope times log2(e), 0 for none. The prefill kernel's
 * rows are consecutive query rows of one head; the packed kernel's are
 * (query row, head of the kv group) pairs. Nothing else about a row enters
 * the tile math, and MMA rows are independent: so a row gets the same bits
 * whichever kernel and whichever position inside M it runs in. */
struct rows_prefill {
    int qrow0;        /* query row of r = 0; row r is qrow0 + 8 r */
    float slope_log2; /* one head per CTA */
    __device__ __forceinline__ int qrow(int r) const { return qrow0 + 8 * r; }
    __device__ __forceinline__ float slope(int) const { return slope_log2; }
};

template <int kRows> struct rows_packed {
    int qrow_[kRows];
    float slope_[kRows];
    __device__ __forceinline__ int qrow(int r) const { return qrow_[r]; }
    __device__ __forceinline__ float slope(int r) const { return slope_[r]; }
};

/* ALiBi slope of head h of sequence b in log2 units (0 without ALiBi). */
__device__ __forceinline__ float alibi_slope_log2(const fad_fwd_params &p, int b, int h)
{
    return p.alibi_slopes ? FAD_MUL(p.alibi_slopes[b * p.alibi_batch_stride + h], FAD_LOG2E) : 0.f;
}

/* Turns the S accumulators into scores (raw q.k, or log2 logits with a mod),
 * masks them, and updates each row's max. Fragment element (mt, nb, e) is the
 * thread's row r = 2*mt + e/2, key t0 + 8*nb + 2*(lane%4) + e%2.
 * rk: each row's key range (kMask only). */
template <bool kMask, bool kMod, int kMT, int kNB, class Rows>
__device__ __forceinline__ void score_tile(float (&s)[kMT][kNB][4], float (&m_tile)[2 * kMT],
                                           const fad_score_mod &mod, const Rows &rows,
                                           const fad_key_range *rk, int t0, int len_q, int len_k)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kNB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 2 * mt + e / 2, key = t0 + nb * 8 + (lane % 4) * 2 + (e % 2);
                float x = s[mt][nb][e];
                if (kMod) {
                    x = fad_logit(&mod, x);
                    const float slope = rows.slope(r);
                    if (slope != 0.f)
                        x = FAD_ADD(x, fad_alibi_log2(slope, rows.qrow(r), key, len_q, len_k));
                }
                if (kMask && (key < rk[r].lo || key >= rk[r].hi))
                    x = -INFINITY;
                s[mt][nb][e] = x;
            }
    /* Each row's max over its 2 * kNB values as a balanced tree (log2 steps
     * deep, not 2 * kNB): a max is exact, so any order gives the same value. */
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float v[2 * kNB];
#pragma unroll
            for (int nb = 0; nb < kNB; nb++)
                v[2 * nb] = s[mt][nb][2 * h], v[2 * nb + 1] = s[mt][nb][2 * h + 1];
#pragma unroll
            for (int w = 1; w < 2 * kNB; w *= 2)
#pragma unroll
                for (int i = 0; i + w < 2 * kNB; i += 2 * w)
                    v[i] = fmaxf(v[i], v[i + w]);
            m_tile[2 * mt + h] = fmaxf(m_tile[2 * mt + h], v[0]);
        }
}

/* An lds_base for the V operand of a warp that owns the output columns from
 * 16-column block blk0 on: addr[c] is block blk0 + c, so at(row, j) (which
 * adds (j / 4) * 64 columns to addr[j % 4]) addresses block blk0 + j for any
 * j (4 blocks on is the same swizzle position, 64 columns further). blk0 = 0
 * is lds_base's own constructor. */
template <int kHeadDim>
__device__ __forceinline__ lds_base<kHeadDim> lds_cols(const void *tile, int row0, int x, int blk0)
{
    lds_base<kHeadDim> b(tile, row0, x);
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int chunk = 2 * (blk0 + c) + x;
        b.addr[c] = smem_addr(tile) + (row0 * kHeadDim + (((chunk ^ row0) & 7) | (chunk & ~7)) * 8) * 2;
    }
    return b;
}

/* S += Q K^T over the head dim, k-chunks in increasing order, for the key
 * blocks [j0, j0 + kJ) of the tile (16 keys each) into s[.][0 .. 2 kJ). */
template <typename T, int kHeadDim, int kMT, int kJ, bool kQInRegs, int kNBs>
__device__ __forceinline__ void qk_tile(float (&s)[kMT][kNBs][4],
                                        const uint32_t (&qf)[kMT][kQInRegs ? kHeadDim / 16 : 1][4],
                                        const lds_base<kHeadDim> &q_lds,
                                        const lds_base<kHeadDim> &k_lds, int row_off)
{
    using ops = dtype_ops<T>;
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; kk++) {
        uint32_t af[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; mt++) {
            if (kQInRegs) {
#pragma unroll
                for (int i = 0; i < 4; i++)
                    af[mt][i] = qf[mt][kQInRegs ? kk : 0][i];
            } else {
                ldmatrix_x4(af[mt], q_lds.at(mt * 16, kk));
            }
        }
#pragma unroll
        for (int j = 0; j < kJ; j++) {
            uint32_t bf[4];
            ldmatrix_x4(bf, k_lds.at(row_off + j * 16, kk));
#pragma unroll
            for (int mt = 0; mt < kMT; mt++) {
                ops::mma(s[mt][2 * j], af[mt], bf[0], bf[1]);
                ops::mma(s[mt][2 * j + 1], af[mt], bf[2], bf[3]);
            }
        }
    }
}

/* x *= f[row] over a thread's accumulator fragments (row 2 mt + e / 2): the
 * online-softmax rescale of o, and the fold's rescale of R. */
template <int kMT, int kDB>
__device__ __forceinline__ void scale_rows(float (&x)[kMT][kDB][4], const float (&f)[2 * kMT])
{
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kDB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                x[mt][nb][e] = FAD_MUL(x[mt][nb][e], f[2 * mt + e / 2]);
}

/* The softmax step of one kBlockN-key tile, between the two products, in two
 * halves (softmax_tile runs both): S (raw dot products) -> scores, mask, the
 * tile's row max (softmax_max); the online-softmax step of the current split
 * (m_s, l_s per thread, acc = its o, rescaled), and S becomes P = exp2(score
 * - max) in place (softmax_exp). The one copy of this math: every forward
 * kernel, on mma.sync or wgmma, runs it on the same fragments. The packed
 * kernel issues the next tile's S = Q K^T between the halves: the second is
 * straight-line code, so those MMAs run under its exponentials. */
template <bool kMod, int kMT, int kNB, class Rows>
__device__ __forceinline__ void softmax_max(float (&s)[kMT][kNB][4], float (&m_tile)[2 * kMT],
                                            bool need_mask, const fad_score_mod &mod,
                                            const Rows &rows, int t0, int len_q, int len_k,
                                            int window_left, int window_right)
{
    constexpr int kRows = 2 * kMT;
#pragma unroll
    for (int r = 0; r < kRows; r++)
        m_tile[r] = -INFINITY;
    if (need_mask) {
        fad_key_range rk[kRows]; /* recomputed here: registers are scarce in the loop */
#pragma unroll
        for (int r = 0; r < kRows; r++)
            rk[r] = fad_row_keys(rows.qrow(r), len_q, len_k, window_left, window_right);
        score_tile<true, kMod>(s, m_tile, mod, rows, rk, t0, len_q, len_k);
    }
    else
        score_tile<false, kMod>(s, m_tile, mod, rows, nullptr, t0, len_q, len_k);
}

/* softmax_exp in two parts: softmax_exp_p is the online-softmax step of the
 * current split for everything but acc -- the new max m_s, S -> P in place,
 * l_s -- and leaves acc's factors in scale (all_one: every factor of the
 * thread is 1); rescale_acc then applies them to acc. The warp-specialized
 * kernel (fad_fwd_ws.cuh) runs the two apart, with the previous tile's
 * O += P V finishing in between. */
template <int kMT, int kNB>
__device__ __forceinline__ void softmax_exp_p(float (&s)[kMT][kNB][4], float (&m_s)[2 * kMT],
                                              float (&l_s)[2 * kMT], const float (&m_tile)[2 * kMT],
                                              const fad_score_mod &mod, float (&scale)[2 * kMT],
                                              bool &all_one)
{
    constexpr int kRows = 2 * kMT;
    float base[kRows], psum[kRows];
    all_one = true;
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        float m_new;
        scale[r] = fad_rescale(m_s[r], FAD_MUL(quad_max(m_tile[r]), mod.exp_scale), &m_new);
        m_s[r] = m_new;
        base[r] = fad_exp_base(m_new);
        psum[r] = 0.f;
        all_one &= scale[r] == 1.f;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kNB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = 2 * mt + e / 2;
                s[mt][nb][e] = fad_exp_score(s[mt][nb][e], mod.exp_scale, base[r]);
                psum[r] = FAD_ADD(psum[r], s[mt][nb][e]);
            }
#pragma unroll
    for (int r = 0; r < kRows; r++)
        l_s[r] = FAD_FMA(l_s[r], scale[r], psum[r]);
}

/* kSkipUnitScale: skip the rescale of acc when every row's factor is 1 (a
 * warp vote and a branch; worth it where acc is large). Multiplying by 1 is
 * exact, so either way gives the same bits. */
template <bool kSkipUnitScale, int kMT, int kDB>
__device__ __forceinline__ void rescale_acc(float (&acc)[kMT][kDB][4], const float (&scale)[2 * kMT],
                                            bool all_one)
{
    if (!kSkipUnitScale || !__all_sync(0xffffffffu, all_one))
        scale_rows(acc, scale);
}

template <bool kSkipUnitScale, int kMT, int kNB, int kDB>
__device__ __forceinline__ void softmax_exp(float (&s)[kMT][kNB][4], float (&acc)[kMT][kDB][4],
                                            float (&m_s)[2 * kMT], float (&l_s)[2 * kMT],
                                            const float (&m_tile)[2 * kMT], const fad_score_mod &mod)
{
    float scale[2 * kMT];
    bool all_one;
    softmax_exp_p(s, m_s, l_s, m_tile, mod, scale, all_one);
    rescale_acc<kSkipUnitScale>(acc, scale, all_one);
}

template <bool kMod, int kMT, int kNB, int kDB, class Rows>
__device__ __forceinline__ void softmax_tile(float (&s)[kMT][kNB][4], float (&acc)[kMT][kDB][4],
                                             float (&m_s)[2 * kMT], float (&l_s)[2 * kMT],
                                             bool need_mask, const fad_score_mod &mod,
                                             const Rows &rows, int t0, int len_q, int len_k,
                                             int window_left, int window_right)
{
    float m_tile[2 * kMT];
    softmax_max<kMod>(s, m_tile, need_mask, mod, rows, t0, len_q, len_k, window_left,
                      window_right);
    softmax_exp<true>(s, acc, m_s, l_s, m_tile, mod);
}

/* O += P V for one kBlockN-key tile: P goes straight from the S
 * accumulators (after softmax_tile) to A fragments. kColBlocks: the
 * 16-column blocks of the output this warp accumulates (acc holds only those;
 * v_lds already points at the first). Each output column's O += P V chain is
 * independent of the others, so a warp that owns a column range gives those
 * columns the bits of a warp that owns all of them. */
template <typename T, int kBlockN, int kMT, int kColBlocks, int kHeadDim>
__device__ __forceinline__ void pv_tile(float (&acc)[kMT][2 * kColBlocks][4],
                                        const float (&s)[kMT][kBlockN / 8][4],
                                        const lds_base<kHeadDim> &v_lds)
{
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++) {
        uint32_t pf[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; mt++)
            p_fragment<T>(s[mt], kk, pf[mt]);
#pragma unroll
        for (int j = 0; j < kColBlocks; j++) {
            uint32_t vf[4];
            ldmatrix_x4_trans(vf, v_lds.at(kk * 16, j));
#pragma unroll
            for (int mt = 0; mt < kMT; mt++) {
                dtype_ops<T>::mma(acc[mt][2 * j], pf[mt], vf[0], vf[1]);
                dtype_ops<T>::mma(acc[mt][2 * j + 1], pf[mt], vf[2], vf[3]);
            }
        }
    }
}

/* One kBlockN-key tile for a warp's 16*kMT rows on mma.sync (fwd_kernel):
 * S = Q K^T (k-chunks in increasing order), scores and mask, the
 * online-softmax step of the current split (m_s, l_s per thread, acc = its o),
 * O += P V. The one copy of this math: fwd_packed_kernel runs the same three
 * functions on the same fragments with the same kBlockN (with S one tile
 * ahead), so a row walks the same tiles through the same instruction sequence
 * in either. q from qf (kQInRegs) or through q_lds; K/V of this stage through
 * k_lds/v_lds. need_mask: some key of the tile lies outside some row's range
 * (masking an in-range key is a no-op, so the flag only costs time). */
template <typename T, int kHeadDim, int kBlockN, int kMT, bool kQInRegs, bool kMod, class Rows>
__device__ __forceinline__ void
attend_tile(float (&acc)[kMT][kHeadDim / 8][4], float (&m_s)[2 * kMT], float (&l_s)[2 * kMT],
            const uint32_t (&qf)[kMT][kQInRegs ? kHeadDim / 16 : 1][4],
            const lds_base<kHeadDim> &q_lds, const lds_base<kHeadDim> &k_lds,
            const lds_base<kHeadDim> &v_lds, bool need_mask, const fad_score_mod &mod,
            const Rows &rows, int t0, int len_q, int len_k, int window_left, int window_right)
{
    float s[kMT][kBlockN / 8][4] = {};
    qk_tile<T, kHeadDim, kMT, kBlockN / 16, kQInRegs>(s, qf, q_lds, k_lds, 0);
    softmax_tile<kMod>(s, acc, m_s, l_s, need_mask, mod, rows, t0, len_q, len_k, window_left,
                       window_right);
    pv_tile<T, kBlockN, kMT, kHeadDim / 16>(acc, s, v_lds);
}

/* The two products of a tile on sm_90a, for the 64 rows of one warpgroup:
 * wgmma chains (64 x kBlockN x 16 and 64 x kHeadDim x 16 per instruction,
 * k-chunks in increasing order) in place of attend_tile's mma.sync ones.
 * scripts/wgmma_probe.cu checks that a wgmma chain gives every fp32 result
 * the bits of the mma.sync chain it replaces, and the fragments are the same
 * registers, so a row gets the same bits on either path (and prefill rows
 * still match the packed decode kernel's). Each call issues and commits one
 * wgmma group and returns; the caller waits (wgmma_wait) before it reads the
 * results or reuses the operands.
 * S = Q K^T into s (zeroed by the caller): Q from qf (kQInRegs: this warp's A
 * fragments) or at q_addr = this warpgroup's first Q row in a swz128 tile of
 * kQRows rows; K at k_addr, a swz128 tile of kBlockN rows. */
template <typename T, int kHeadDim, int kBlockN, int kQRows, bool kQInRegs>
__device__ __forceinline__ void issue_qk_wgmma(float (&s)[1][kBlockN / 8][4],
                                               const uint32_t (&qf)[1][kQInRegs ? kHeadDim / 16 : 1][4],
                                               uint32_t q_addr, uint32_t k_addr)
{
    const uint64_t k_desc0 = gmma_desc(k_addr, 16, 1024), q_desc0 = gmma_desc(q_addr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; kk++) { /* K-major: 32 bytes per k-chunk in a 64-column block */
        const uint64_t k_desc = gmma_desc_at(k_desc0, ((kk / 4) * kBlockN * 64 + (kk % 4) * 16) * 2);
        if constexpr (kQInRegs)
            wgmma_rs_kmajor(s[0], qf[0][kk], k_desc, (const T *)nullptr);
        else
            wgmma_ss(s[0], gmma_desc_at(q_desc0, ((kk / 4) * kQRows * 64 + (kk % 4) * 16) * 2),
                     k_desc, (const T *)nullptr);
    }
    wgmma_commit();
}

/* O += P V: P (the softmax'd s) packed to A fragments pf (the caller keeps
 * them, untouched, until the wait), V at v_addr, a swz128 tile of kBlockN
 * rows read MN-major. acc_live = false: O = P V, acc's old values unread (a
 * split's first tile: what adding to zeros gives, up to the sign of an exact
 * zero, with no zeroing of acc at each split start -- ~114 instructions per
 * split at D128, about half of what deterministic mode added over fast mode). */
template <typename T, int kBlockN>
__device__ __forceinline__ void p_fragments(const float (&s)[1][kBlockN / 8][4],
                                            uint32_t (&pf)[kBlockN / 16][4])
{
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++)
        p_fragment<T>(s[0], kk, pf[kk]);
}
/* (pf already packed: issue_pv_wgmma's second half) */
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void issue_pv_wgmma_pf(float (&acc)[1][kHeadDim / 8][4],
                                                  uint32_t (&pf)[kBlockN / 16][4], uint32_t v_addr,
                                                  bool acc_live)
{
    const uint64_t v_desc0 = gmma_desc(v_addr, kBlockN * 128, 1024);
    wgmma_fence_operand(acc[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++) /* MN-major V: 16 key rows of 128 bytes per k-chunk */
        wgmma_rs_mnmajor(acc[0], pf[kk], gmma_desc_at(v_desc0, kk * 16 * 128), (const T *)nullptr,
                         kk > 0 || acc_live);
    wgmma_commit();
}
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void issue_pv_wgmma(float (&acc)[1][kHeadDim / 8][4],
                                               const float (&s)[1][kBlockN / 8][4],
                                               uint32_t (&pf)[kBlockN / 16][4], uint32_t v_addr,
                                               bool acc_live)
{
    p_fragments<T, kBlockN>(s, pf);
    issue_pv_wgmma_pf<T, kHeadDim, kBlockN>(acc, pf, v_addr, acc_live);
}

/* attend_tile on sm_90a: S = Q K^T, the softmax step, O += P V; while_s()
 * runs while S is computed (the caller issues its next K/V copies there).
 * (Issuing tile t's S before waiting for tile t-1's O += P V, with three
 * stages, was measured slower: benchmarks/NOTES.md, "Prefill on wgmma".) */
template <typename T, int kHeadDim, int kBlockN, int kQRows, bool kQInRegs, bool kMod, class Rows,
          class WhileS>
__device__ __forceinline__ void
attend_tile_wgmma(float (&acc)[1][kHeadDim / 8][4], float (&m_s)[2], float (&l_s)[2],
                  const uint32_t (&qf)[1][kQInRegs ? kHeadDim / 16 : 1][4], uint32_t q_addr,
                  uint32_t k_addr, uint32_t v_addr, bool need_mask, const fad_score_mod &mod,
                  const Rows &rows, int t0, int len_q, int len_k, int window_left, int window_right,
                  bool acc_live, const WhileS &while_s)
{
    float s[1][kBlockN / 8][4] = {};
    issue_qk_wgmma<T, kHeadDim, kBlockN, kQRows, kQInRegs>(s, qf, q_addr, k_addr);
    while_s();
    wgmma_wait<0>();
    wgmma_fence_operand(s[0]);
    softmax_tile<kMod>(s, acc, m_s, l_s, need_mask, mod, rows, t0, len_q, len_k, window_left,
                       window_right);
    uint32_t pf[kBlockN / 16][4];
    issue_pv_wgmma<T, kHeadDim, kBlockN>(acc, s, pf, v_addr, acc_live);
    wgmma_wait<0>();
    wgmma_fence_operand(acc[0]);
    wgmma_fence_operand(pf);
}

/* A fresh online-softmax state for a split that starts: (m, l) only (the
 * wgmma variant overwrites acc at the split's first P V) ... */
template <int kMT>
__device__ __forceinline__ void start_split_ml(float (&m_s)[2 * kMT], float (&l_s)[2 * kMT])
{
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++)
        m_s[r] = -INFINITY, l_s[r] = 0.f;
}

/* ... or (m, l, o). */
template <int kMT, int kDB>
__device__ __forceinline__ void start_split(float (&acc)[kMT][kDB][4], float (&m_s)[2 * kMT],
                                            float (&l_s)[2 * kMT])
{
    start_split_ml<kMT>(m_s, l_s);
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kDB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][nb][e] = 0.f;
}

/* Where a CTA keeps the o of its merged result R (one fp32 per accumulator
 * element of the thread). In shared memory: thread-private slots, slot-major
 * so that a warp's accesses hit 32 banks. In registers (the sm_90a prefill
 * variant at D128): no shared-memory round trip per split. */
template <int kMT, int kDB, int kThreads> struct r_in_smem {
    float *sR;
    static constexpr bool kSmem = true;
    __device__ __forceinline__ float &at(int mt, int nb, int e) const
    {
        return sR[((mt * kDB + nb) * 4 + e) * kThreads + threadIdx.x];
    }
};
template <int kMT, int kDB> struct r_in_regs {
    float (&o)[kMT][kDB][4];
    static constexpr bool kSmem = false;
    __device__ __forceinline__ float &at(int mt, int nb, int e) const { return o[mt][nb][e]; }
};

/* A split ends: fold its state (acc, m_s, l_s) into the row's result R with
 * fad_merge_* -- into R's o (to_R), or, for the last split, into acc, ready
 * to normalise. Before the first fold R is the empty state (o = 0), exactly
 * what the combine kernel starts from. Every lane must call it (quad_sum,
 * __any_sync). Where R lives does not change a bit: the same operations on the
 * same values. fad_merge_value is o_R * wa + o_s * wb; R's weight wa is 1
 * unless some row's max moved past R's (or R is empty), so in registers the
 * multiply by it is skipped, exactly, when no row of the warp needs it. */
template <int kMT, int kDB, class RO>
__device__ __forceinline__ void fold_split(float (&acc)[kMT][kDB][4], const float (&m_s)[2 * kMT],
                                           const float (&l_s)[2 * kMT], float (&mR)[2 * kMT],
                                           float (&lR)[2 * kMT], const RO &R, bool &have_R,
                                           bool to_R)
{
    fad_merge_w w[2 * kMT];
    bool scales_R = false;
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        w[r] = fad_merge_weights(mR[r], m_s[r]);
        lR[r] = fad_merge_value(lR[r], quad_sum(l_s[r]), w[r]);
        mR[r] = w[r].m;
        scales_R |= w[r].wa != 1.f;
    }
    /* In registers (R starts zeroed: the empty state's o), R's o * wa is
     * applied in place where some row of the warp needs it, and each value is
     * then one FMA. In shared memory (unwritten before the first fold, and
     * maybe still holding Q) the plain fad_merge_value with a select: a second
     * unrolled loop there made the D256 tile loop 25% slower, fast mode too. */
    if constexpr (!RO::kSmem) {
        /* (An empty R is +0: scaling it by wa in [0, 1] changes no bit.) */
        if (have_R && __any_sync(0xffffffffu, scales_R)) {
            float wa[2 * kMT];
#pragma unroll
            for (int r = 0; r < 2 * kMT; r++)
                wa[r] = w[r].wa;
            scale_rows(R.o, wa);
        }
    }
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kDB; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float &slot = R.at(mt, nb, e);
                const fad_merge_w &we = w[2 * mt + e / 2];
                const float v = RO::kSmem ? fad_merge_value(have_R ? slot : 0.f, acc[mt][nb][e], we)
                                          : fad_merge_keep_a(slot, acc[mt][nb][e], we.wb);
                if (to_R)
                    slot = v;
                else
                    acc[mt][nb][e] = v;
            }
            /* Keeps the scheduler from hoisting all kMT*kDB*4 loads of sR
             * ahead of the FMAs (that many live registers spill the loop). */
            if (RO::kSmem)
                __syncwarp();
        }
    have_R = true;
}

/* Row r of this thread, merged result (acc, m, l): normalised output to o
 * (the row's D values; acc holds columns col0 ..) and, with_lse, its lse. */
template <typename T, int kMT, int kDB>
__device__ __forceinline__ void store_row(const float (&acc)[kMT][kDB][4], int r, float m, float l,
                                          T *o, float *lse, int D, int col0 = 0,
                                          bool with_lse = true, bool poison = false)
{
    using ops = dtype_ops<T>;
    const int lane = threadIdx.x % 32;
    const float inv = poison ? __int_as_float(0x7fffffff) : fad_inv_sum(l);
#pragma unroll
    for (int nb = 0; nb < kDB; nb++) {
        const int col = col0 + nb * 8 + (lane % 4) * 2;
        if (col < D)
            *reinterpret_cast<uint32_t *>(o + col) =
                ops::pack(FAD_MUL(acc[r / 2][nb][2 * (r % 2)], inv),
                          FAD_MUL(acc[r / 2][nb][2 * (r % 2) + 1], inv));
    }
    if (with_lse && lane % 4 == 0)
        *lse = poison ? inv : fad_lse(m, l);
}

/* Row r of this thread, one split's state: o (unnormalised, D fp32) and
 * (m, l) into the workspace; l_row is the row's quad-summed l. */
template <int kMT, int kDB>
__device__ __forceinline__ void store_partial_row(const float (&acc)[kMT][kDB][4], int r, float m,
                                                  float l_row, float *o, float *ml, int D,
                                                  int col0 = 0, bool with_ml = true)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < kDB; nb++) {
        const int col = col0 + nb * 8 + (lane % 4) * 2;
        if (col < D)
            *reinterpret_cast<float2 *>(o + col) =
                make_float2(acc[r / 2][nb][2 * (r % 2)], acc[r / 2][nb][2 * (r % 2) + 1]);
    }
    if (with_ml && lane % 4 == 0)
        *reinterpret_cast<float2 *>(ml) = make_float2(m, l_row);
}

/* K and V rows [0, rows) of the tile at key t0 of a paged sequence into the
 * swizzled stages sK, sV (rows past `rows` zero-filled): one block-table look-up
 * per row (fad_kv_row, the CPU path's helper), shared by K and V, so a tile may
 * span pages of any multiple-of-16 size. k_h/v_h: k/v at this kv head. Returns
 * true when some row's page lies outside the cache: that row is zero-filled,
 * never read, and the caller poisons the rows it computes (NaN).
 * v_src (a pipeline that copies V one tile after K): the V copies are not
 * issued; each chunk's V source offset (-1: zero-fill) is kept there for
 * load_v_paged, so each row's page is still looked up once. */
template <typename T, int kHeadDim, int kBlockN, int kThreads, bool kSw128 = false, int kVSrc = 1>
__device__ __forceinline__ bool load_kv_paged(T *sK, T *sV, const fad_fwd_params &p,
                                              const fad_seq &seq, const T *k_h, const T *v_h,
                                              int t0, int rows, int D,
                                              int64_t (*v_src)[kVSrc] = nullptr)
{
    constexpr int kChunks = kHeadDim / 8;
    static_assert(kBlockN * kChunks % kThreads == 0, "whole chunks per thread");
    const int tid = (int)opaque(threadIdx.x);
    bool bad = false;
#pragma unroll
    for (int i = 0; i < kBlockN * kChunks / kThreads; i++) {
        const int c = tid + i * kThreads;
        const int row = c / kChunks, col = (c % kChunks) * 8;
        int64_t ko = 0, vo = 0;
        bool ok = false;
        if (row < rows) {
            const bool page_ok = fad_kv_row(&p, &seq, t0 + row, &ko, &vo);
            bad |= !page_ok;
            ok = page_ok && col < D;
        }
        const int at = tile_off<kHeadDim, kBlockN, kSw128>(row, col);
        cp_async16(sK + at, k_h + (ok ? ko + col : 0), ok ? 16 : 0);
        if (v_src)
            (*v_src)[i] = ok ? vo + col : -1;
        else
            cp_async16(sV + at, v_h + (ok ? vo + col : 0), ok ? 16 : 0);
    }
    return bad;
}

/* The V half of load_kv_paged(..., v_src): the copies it left out. */
template <typename T, int kHeadDim, int kBlockN, int kThreads, int kVSrc>
__device__ __forceinline__ void load_v_paged(T *sV, const T *v_h, const int64_t (&v_src)[kVSrc])
{
    constexpr int kChunks = kHeadDim / 8;
    static_assert(kVSrc == kBlockN * kChunks / kThreads, "one offset per chunk");
    const int tid = (int)opaque(threadIdx.x);
#pragma unroll
    for (int i = 0; i < kVSrc; i++) {
        const int c = tid + i * kThreads;
        const bool ok = v_src[i] >= 0;
        cp_async16(sV + tile_off<kHeadDim, kBlockN, false>(c / kChunks, (c % kChunks) * 8),
                   v_h + (ok ? v_src[i] : 0), ok ? 16 : 0);
    }
}

/* ------------------------------------------------------------------------ */
/* the forward kernels                                                        */
/* ------------------------------------------------------------------------ */

struct fwd_args {
    fad_fwd_params p;
    fad_plan plan;
    float *ws_o;  /* partial o, CTA-per-split schedule only */
    float *ws_ml; /* partial (m, l) */
};

/* A KV-cache sequence whose rows fall outside the cache (fad_seq.valid == 0:
 * its indices are not read back on the host) gets NaN in every element of
 * query row i of head h (out and lse): loud, and the caller needs no NaN
 * pre-fill. Varlen batches cannot say which rows an invalid sequence owns;
 * their callers pre-fill. */
__device__ __forceinline__ void poison_row(const fad_fwd_params &p, const fad_seq &seq, int h,
                                           int i, int lane, int lanes)
{
    const float nan = __int_as_float(0x7fffffff);
    if (i >= p.seqlen_q)
        return;
    uint16_t *o = (uint16_t *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride;
    for (int c = lane; c < p.head_dim; c += lanes)
        o[c] = 0x7fff; /* a quiet NaN in fp16 and bf16 alike */
    if (lane == 0 && p.softmax_lse)
        p.softmax_lse[seq.row0 + h * fad_lse_head_stride(&p) + i] = nan;
}

/* The key tiles a CTA walks, the same rule for both forward kernels (the walk
 * decides bits): the kBlockN-aligned tiles of splits [s_begin, s_end) that
 * intersect keys [first.lo, last.hi) of its rows (first/last: the key ranges of
 * its first and last query row, which only grow with the row index). On the
 * CTA-per-split schedule the CTA walks split blockIdx.z only; returns false
 * when that split is masked for every row (the combine skips it too). */
template <int kBlockN>
__device__ __forceinline__ bool tile_walk(const fad_plan &plan, fad_key_range first,
                                          fad_key_range last, int len_k, int *t_first, int *t_last)
{
    const int S = plan.split_size;
    const fad_key_range keys = {first.lo, last.hi};
    int s_begin = fad_first_split(keys, S), s_end = fad_end_split(keys, S);
    if (plan.cta_per_split) {
        if ((int)blockIdx.z < s_begin || (int)blockIdx.z >= s_end)
            return false;
        s_begin = blockIdx.z;
        s_end = blockIdx.z + 1;
    }
    *t_first = max(s_begin * S, keys.lo / kBlockN * kBlockN);
    *t_last = min(min(s_end * S, keys.hi), len_k);
    return true;
}

/* kWgmma: the sm_90a variant (D 64 and 128): each warpgroup's 64 rows run
 * attend_tile_wgmma on tiles in the swz128 layout; Q and the merged result R
 * are held in registers or in shared memory by head dim (FAD_WG_Q_REGS_MIN_D,
 * FAD_WG_R_REGS_MIN_D). The same rows per CTA and the same tile walk as the
 * mma.sync variant. */
template <int kHeadDim, bool kWgmma = false> struct fwd_cfg {
    /* Knobs in fad_internal.h (measured in benchmarks/NOTES.md). Wide (D <=
     * FAD_WIDE_MAX_D): 32 query rows per warp (two m16 tiles), so each K/V
     * fragment read from shared memory feeds four MMAs. Otherwise 16 rows per
     * warp, Q held in registers up to D=128. Several small CTAs per SM beat one
     * big one: their warps are not held in step by a shared barrier, so one
     * CTA's softmax overlaps another's MMAs. */
    static constexpr bool kWide = kHeadDim <= FAD_WIDE_MAX_D;
    static constexpr int kMT = kWide ? 2 : 1;
    static constexpr int kWarps = kHeadDim <= 64 ? FAD_D64_WARPS : kHeadDim <= 128 ? FAD_D128_WARPS : 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBlockM = kWarps * 16 * kMT;
    /* Keys per tile: 32 for wide D=128 keeps S + O within the registers. */
    static constexpr int kBlockN = kWide && kHeadDim == 128 ? 32 : 64;
    static constexpr int kDBlocks = kHeadDim / 8; /* n8 blocks of the output row */
    static constexpr bool kQInRegs = !kWide && kHeadDim <= 128 && (!kWgmma || kHeadDim >= FAD_WG_Q_REGS_MIN_D);
    /* CTAs per SM the register allocation must allow (__launch_bounds__). */
    static constexpr int kMinBlocks = kHeadDim <= 64 ? FAD_D64_MIN_BLOCKS : 1;
    /* K and V are double-buffered: tile t+1 loads while tile t computes. */
    static constexpr int kStageElems = 2 * kBlockN * kHeadDim; /* one K + one V tile */
    /* The merged result's o in registers (r_in_regs) rather than in sR. */
    static constexpr bool kRInRegs = kWgmma && kHeadDim >= FAD_WG_R_REGS_MIN_D;
    /* Shared memory: sR (merged o, fp32, thread-private slots) unless
     * kRInRegs; sQ, which lives inside sR when Q is held in registers (the
     * first fold into sR waits until every warp has read Q); then 2 x (sK, sV). */
    static constexpr size_t kSmemR = kRInRegs ? 0 : (size_t)kBlockM * kHeadDim * 4;
    static constexpr size_t kSmemQ = kQInRegs && kSmemR > 0 ? 0 : (size_t)kBlockM * kHeadDim * 2;
    static constexpr size_t kSmemBytes = kSmemR + kSmemQ + (size_t)2 * kStageElems * 2;
    static_assert(kHeadDim % 64 == 0, "swizzle needs 8 chunks per row");
    static_assert(!kWgmma || ((kHeadDim == 64 || kHeadDim == 128) && !kWide && kWarps % 4 == 0 &&
                              kSmemR % 1024 == 0 && kSmemQ % 1024 == 0),
                  "wgmma: whole warpgroups, 1024-byte aligned swz128 tiles");
    static_assert(FAD_SPLIT_QUANTUM % kBlockN == 0, "splits are whole tiles");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

/* The end of a prefill row block, shared by fwd_kernel and fwd_ws_kernel.
 * This thread's rows are m0 + row0 + 8 r of the sequence; lse_row0 is the
 * flat row of its query 0; D the head dim; poison (a page outside the
 * cache) writes NaN. */

/* CTA-per-split schedule: the block's one split, index `split`, ends: its
 * state (m_s, quad-summed l_s, acc = o) goes to the workspace. */
template <int kMT, int kDB>
__device__ __forceinline__ void store_split_rows(const fwd_args &a, int D, int split, int64_t lse_row0,
                                                 int m0, int row0, int len_q,
                                                 const float (&acc)[kMT][kDB][4],
                                                 const float (&m_s)[2 * kMT],
                                                 const float (&l_s)[2 * kMT], bool poison)
{
    const size_t row_base = (size_t)split * fad_flat_rows(&a.p) + lse_row0 + m0;
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        const float nan = __int_as_float(0x7fffffff);
        const float l_row = poison ? nan : quad_sum(l_s[r]);
        const int row = row0 + 8 * r;
        if (m0 + row < len_q)
            store_partial_row(acc, r, poison ? nan : m_s[r], l_row, a.ws_o + (row_base + row) * D,
                              a.ws_ml + (row_base + row) * 2, D);
    }
}

/* Otherwise: the merged result R (acc after the last fold, mR, lR),
 * normalised, to out and lse of head h. */
template <typename T, int kMT, int kDB>
__device__ __forceinline__ void store_result_rows(const fad_fwd_params &p, int D, const fad_seq &seq,
                                                  int h, int64_t lse_row0, int m0, int row0, int len_q,
                                                  const float (&acc)[kMT][kDB][4],
                                                  const float (&mR)[2 * kMT],
                                                  const float (&lR)[2 * kMT], bool poison)
{
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        const int row = m0 + row0 + 8 * r;
        if (row < len_q)
            store_row(acc, r, mR[r], lR[r],
                      (T *)p.out + seq.o_off + (int64_t)row * p.out_row_stride + h * p.out_head_stride,
                      p.softmax_lse + lse_row0 + row, D, 0, p.softmax_lse != nullptr, poison);
    }
}

/* The prefill kernel: one CTA per (sequence, query head, kBlockM query rows). */
template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kWgmma>
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
    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL);
    const rows_prefill rows = {m0 + row0, alibi_slope_log2(p, b, h)};

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
    int split_left = (S - t_first % S) / kBlockN;
    bool acc_live = false; /* (wgmma) acc holds this split's o: false until its first P V */
    auto fold = [&](bool to_R) {
        if constexpr (C::kRInRegs)
            fold_split(acc, m_s, l_s, mR, lR, r_in_regs<kMT, kDB>{oR}, have_R, to_R);
        else
            fold_split(acc, m_s, l_s, mR, lR, r_in_smem<kMT, kDB, C::kThreads>{sR}, have_R, to_R);
    };

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
    const uint32_t q_addr = smem_addr(sQ) + (warp / 4) * 64 * 64 * 2; /* this warpgroup's Q rows */

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
            const uint32_t k_addr = smem_addr(sK + stage * C::kStageElems);
            attend_tile_wgmma<T, kHeadDim, kBlockN, kBlockM, C::kQInRegs, kMod>(
                acc, m_s, l_s, qf, q_addr, k_addr,
                k_addr + kBlockN * kHeadDim * 2, need_mask, mod, rows, t0, len_q, len_k,
                p.window_left, p.window_right, acc_live, [&]() {
                    if constexpr (FAD_WG_LOADS_DURING_S)
                        load_next();
                });
            acc_live = true;
        } else {
            attend_tile<T, kHeadDim, kBlockN, kMT, C::kQInRegs, kMod>(
                acc, m_s, l_s, qf, q_lds, k_lds0.reload(stage * C::kStageElems * 2),
                v_lds0.reload(stage * C::kStageElems * 2), need_mask, mod, rows, t0, len_q, len_k,
                p.window_left, p.window_right);
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
            store_split_rows(a, D, t_first / S, lse_row0, m0, row0, len_q, acc, m_s, l_s, poison);
        return;
    }
    if (walked) /* R is now in acc, mR, lR */
        fold(false);
    store_result_rows<T>(p, D, seq, h, lse_row0, m0, row0, len_q, acc, mR, lR, poison);
}

#include "fad_fwd_ws.cuh"

/* The packed kernel, for short query blocks (decode): one CTA per (sequence,
 * kv head, kBlockM packed rows [, split]). Packed row pr = i * G + g is query
 * row i of head hk * G + g (G = Hq / Hkv), so a kv head's K/V tiles are read
 * once for all the query heads of its group: a decode step (Sq = 1) is G rows
 * of one 16-row warp, where the prefill kernel would run G CTAs of kBlockM
 * rows with one valid row each. Few warps and a kStages-deep cp.async
 * pipeline, so each SM keeps enough bytes in flight for a memory-bound walk.
 *
 * Bits: a row walks the same kBlockN tiles (fwd_cfg's) in the same order,
 * split by split, through the same qk_tile / softmax_max / softmax_exp /
 * pv_tile / fold_split / store_* code as in fwd_kernel (here with S = Q K^T
 * one tile ahead, see the tile loop); only the row's address, its head and
 * its query index (mask, ALiBi position) are computed differently, and MMA
 * rows are independent. The
 * tiles a CTA walks beyond a row's own key range are fully masked for that
 * row, an exact identity (fad_math.h), as they are in the prefill kernel. */
#ifndef FAD_PACKED_Q_IN_REGS
#define FAD_PACKED_Q_IN_REGS 0
#endif
/* Knobs that never change a bit (scripts/ab_decode.sh compares them):
 * FAD_PACKED_COL_WARPS: warps per 16-row group, splitting the output columns
 * of O += P V and the key blocks of S = Q K^T (1, 2, 4; fewer where the head
 * dim has too few 16-column blocks). */
#ifndef FAD_PACKED_COL_WARPS
#define FAD_PACKED_COL_WARPS 4
#endif
/* Column warps for head dim d: the knob, halved until each warp owns whole
 * 16-column blocks of the output. */
constexpr int packed_col_warps(int d, int want)
{
    return want <= 1 ? 1 : (d / 16) % want == 0 ? want : packed_col_warps(d, want / 2);
}

template <int kHeadDim, bool kMod> struct packed_cfg {
    /* kRowWarps groups of 16 packed rows (FAD_PACKED_WARPS); each group is run
     * by kColWarps warps (FAD_PACKED_COL_WARPS) that split the output columns
     * and the S = Q K^T key blocks of a tile (kKeyParts = kColWarps parts). */
    static constexpr int kRowWarps = FAD_PACKED_WARPS;
    static constexpr int kColWarps = packed_col_warps(kHeadDim, FAD_PACKED_COL_WARPS);
    static constexpr int kWarps = kRowWarps * kColWarps;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBlockM = kRowWarps * 16;
    static constexpr int kBlockN = fwd_cfg<kHeadDim>::kBlockN; /* the prefill kernel's walk */
    static constexpr int kColBlocks = kHeadDim / 16 / kColWarps; /* per warp */
    static constexpr int kDBlocks = 2 * kColBlocks;              /* n8 blocks per warp */
    static constexpr int kKeyParts = kColWarps;
    static constexpr int kKeyBlocks = kBlockN / 16 / kKeyParts; /* 16-key blocks of S per warp */
    static constexpr bool kQInRegs = FAD_PACKED_Q_IN_REGS && kHeadDim <= 128;
    static constexpr int kStageElems = 2 * kBlockN * kHeadDim; /* one K + one V tile */
    static constexpr size_t kSmemQ = (size_t)kBlockM * kHeadDim * 2;
    /* the S exchange, double-buffered: fp32 fragments of kBlockN keys per row group */
    static constexpr int kXchgFloats = kBlockN / 8 * 4 * 32; /* one row group's S */
    static constexpr size_t kSmemX = (size_t)2 * kRowWarps * kXchgFloats * 4;
    /* K/V stages: the knob, fewer where it would not fit in shared memory. */
    static constexpr int kStagesWant = kMod ? FAD_PACKED_STAGES_MOD : FAD_PACKED_STAGES;
    static constexpr size_t kStageBytes = (size_t)kStageElems * 2;
    static constexpr int kStagesFit = (int)((200 * 1024 - kSmemQ - kSmemX) / kStageBytes);
    static constexpr int kStages = kStagesWant < kStagesFit ? kStagesWant : kStagesFit;
    /* sQ; kStages x (sK, sV); 2 S exchanges. (The merged result R of a
     * one-CTA schedule lives in registers: a warp's R is its acc's columns.) */
    static constexpr size_t kSmemBytes = kSmemQ + (size_t)kStages * kStageBytes + kSmemX;
    static_assert(kStages >= 2, "at least double buffering");
    static_assert((kBlockN / 16) % kKeyParts == 0, "whole key blocks per part");
    static_assert(kRowWarps < 16, "named barriers 1 .. kRowWarps");
    static_assert(kBlockM * (kHeadDim / 8) % kThreads == 0, "whole Q chunks per thread");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

template <typename T, int kHeadDim, bool kMod, bool kPaged>
__global__ void __launch_bounds__(packed_cfg<kHeadDim, kMod>::kThreads)
fwd_packed_kernel(const __grid_constant__ fwd_args a)
{
    /* Launched early itself (FAD_ATTN_PDL): nothing in global memory is read or
     * written before the kernel ahead of it in the stream is done (a no-op when
     * launched plainly). Only then may the combine start launching (it waits
     * for us, and reads our inputs before that). */
    pdl_wait_primary();
    pdl_launch_dependents();
    using C = packed_cfg<kHeadDim, kMod>;
    constexpr int kMT = 1, kRows = 2, kBlockM = C::kBlockM, kBlockN = C::kBlockN;
    constexpr int kDB = C::kDBlocks, kStages = C::kStages, kColBlocks = C::kColBlocks;
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size;
    const int G = p.num_heads / p.num_heads_k;

    const int m_block = blockIdx.x % a.plan.m_blocks;
    const int bh = blockIdx.x / a.plan.m_blocks;
    const int b = bh / p.num_heads_k, hk = bh % p.num_heads_k;
    const fad_seq seq = fad_get_seq(&p, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int n_rows = len_q * G; /* packed rows of (b, hk); the plan bounds seqlen_q * G */
    const int m0 = m_block * kBlockM;
    if (!seq.valid && p.cache_seqlens && !a.plan.cta_per_split) { /* (else the combine does it) */
        for (int pr = m0 + (int)threadIdx.x / 32; pr < m0 + kBlockM && pr < p.seqlen_q * G;
             pr += C::kThreads / 32)
            poison_row(p, seq, hk * G + pr % G, pr / G, threadIdx.x % 32, 32);
        return;
    }
    if (m0 >= n_rows)
        return;
    const int m_end = min(m0 + kBlockM, n_rows);

    /* Keys any row of this tile may see: its query rows are m0/G .. (m_end-1)/G. */
    const fad_key_range first_row = fad_row_keys(m0 / G, len_q, len_k, p.window_left, p.window_right);
    const fad_key_range last_row =
        fad_row_keys((m_end - 1) / G, len_q, len_k, p.window_left, p.window_right);
    const bool partial = a.plan.cta_per_split;
    int t_first, t_last;
    if (!tile_walk<kBlockN>(a.plan, first_row, last_row, len_k, &t_first, &t_last))
        return; /* this split is masked for every row: the combine skips it too */

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);
    T *sK = reinterpret_cast<T *>(smem_raw + C::kSmemQ); /* stage s: + s * kStageElems */
    T *sV = sK + kBlockN * kHeadDim;
    float *sX = reinterpret_cast<float *>(smem_raw + C::kSmemQ + kStages * C::kStageBytes);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    /* row group rw (16 packed rows), column part cw (output columns
     * [cw, cw + 1) * kColBlocks * 16, and key part cw of S when shared) */
    const int rw = warp % C::kRowWarps, cw = warp / C::kRowWarps;
    const int D = p.head_dim;
    const int64_t head_stride = fad_lse_head_stride(&p);
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;

    /* This thread's rows: packed row m0 + row0 + 8r, r = 0, 1. A warp with no
     * valid row only helps with the loads. */
    const int row0 = rw * 16 + lane / 4;
    const bool warp_active = m0 + rw * 16 < m_end;
    rows_packed<kRows> rows;
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int pr = m0 + row0 + 8 * r;
        rows.qrow_[r] = pr / G;
        rows.slope_[r] = alibi_slope_log2(p, b, hk * G + pr % G);
    }
    const int unmasked_lo = last_row.lo, unmasked_hi = first_row.hi;
    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL);

    float mR[kRows], lR[kRows], oR[kMT][kDB][4] = {}; /* R: the splits folded so far */
    bool have_R = false;
    float acc[kMT][kDB][4] = {}, m_s[kRows], l_s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++)
        mR[r] = m_s[r] = -INFINITY, lR[r] = l_s[r] = 0.f;
    int cur_split = -1;

    /* The pipeline. Tile j (keys t_first + j kBlockN ..) lives in stage
     * j % kStages. The copies run K one tile ahead of V: commit group g holds
     * K(g) and V(g - 1) (and Q with K(0)), and iteration j commits group
     * j + kStages. Iteration j reads K(j + 1) and V(j), both in group j + 1.
     * S = Q K^T runs one tile ahead of the softmax: iteration j issues this
     * warp's key part of S(j + 1) between the two halves of tile j's softmax,
     * so those MMAs run under its exponentials and O += P V; the parts meet in
     * the S exchange sX[(j + 1) % 2] at iteration j + 1's barrier, the one
     * barrier per tile. Every operation is the one attend_tile does on the
     * same operands, in the same order per value: no bit changes. */
    bool bad_page = false; /* paged: this thread met a page outside the cache */
    int64_t v_src[kPaged ? kBlockN * (kHeadDim / 8) / C::kThreads : 1]; /* paged: V(g - 1)'s rows */
    const T *k_h = (const T *)p.k + hk * p.k_head_stride; /* paged: the cache at this kv head */
    const T *v_h = (const T *)p.v + hk * p.v_head_stride;
    auto tile_at = [&](int j) { return t_first + j * kBlockN; };
    /* stage offsets (elements) one tile on and one tile back */
    constexpr int kRing = kStages * C::kStageElems;
    auto next_stage = [](int st) { return st + C::kStageElems == kRing ? 0 : st + C::kStageElems; };
    auto prev_stage = [](int st) { return (st == 0 ? kRing : st) - C::kStageElems; };
    /* group g: V(g - 1) into stage st_v, K(g) into stage st_k; V first, since
     * a paged K(g) overwrites v_src */
    auto load_group = [&](int g, int st_v, int st_k) {
        if (g >= 1 && tile_at(g - 1) < t_last) {
            const int t0 = tile_at(g - 1);
            if constexpr (kPaged)
                load_v_paged<T, kHeadDim, kBlockN, C::kThreads>(sV + st_v, v_h, v_src);
            else
                load_tile_lean<T, kHeadDim, kBlockN, C::kThreads>(
                    sV + st_v, v_g + (int64_t)t0 * p.v_row_stride, (int)p.v_row_stride, len_k - t0, D);
        }
        if (tile_at(g) < t_last) {
            const int t0 = tile_at(g);
            if constexpr (kPaged)
                bad_page |= load_kv_paged<T, kHeadDim, kBlockN, C::kThreads>(
                    sK + st_k, nullptr, p, seq, k_h, v_h, t0, len_k - t0, D, &v_src);
            else
                load_tile_lean<T, kHeadDim, kBlockN, C::kThreads>(
                    sK + st_k, k_g + (int64_t)t0 * p.k_row_stride, (int)p.k_row_stride, len_k - t0, D);
        }
        cp_async_commit(); /* empty groups past the walk keep the count uniform */
    };

    /* Prologue: Q (row by row: each packed row has its own address) joins
     * group 0; groups 0 .. kStages - 1. */
    {
        constexpr int kChunks = kHeadDim / 8;
#pragma unroll
        for (int it = 0; it < kBlockM * kChunks / C::kThreads; it++) {
            const int c = tid + it * C::kThreads;
            const int row = c / kChunks, col = (c % kChunks) * 8, pr = m0 + row;
            const bool ok = pr < m_end && col < D;
            const T *src = (const T *)p.q;
            if (ok)
                src += seq.q_off + (int64_t)(pr / G) * p.q_row_stride +
                       (int64_t)(hk * G + pr % G) * p.q_head_stride + col;
            cp_async16(sQ + swz<kHeadDim>(row, col), src, ok ? 16 : 0);
        }
    }
#pragma unroll
    for (int g = 0; g < kStages; g++)
        load_group(g, (g == 0 ? kStages - 1 : g - 1) * C::kStageElems, g * C::kStageElems);

    uint32_t qf[kMT][C::kQInRegs ? kHeadDim / 16 : 1][4];
    const lds_base<kHeadDim> q_lds(sQ, rw * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> k_lds0(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> v_lds0 =
        lds_cols<kHeadDim>(sV, lane % 8 + ((lane / 8) % 2) * 8, lane / 16, cw * kColBlocks);
    /* this row group's two S exchanges; this warp's part starts at key block kp0 */
    float *const xchg0 = sX + rw * C::kXchgFloats;
    float *const xchg1 = sX + (C::kRowWarps + rw) * C::kXchgFloats;
    constexpr int kNB = kBlockN / 8, kJ = C::kKeyBlocks;
    const int kp0 = cw * kJ;
    /* this warp's part of S = Q K^T (sp zeroed) for the K tile in stage st */
    auto qk_part = [&](float (&sp)[kMT][2 * kJ][4], int st) {
        qk_tile<T, kHeadDim, kMT, kJ, C::kQInRegs>(sp, qf, q_lds, k_lds0.reload(st * 2), kp0 * 16);
    };
    auto publish = [&](const float (&sp)[kMT][2 * kJ][4], float *xchg) {
#pragma unroll
        for (int mt = 0; mt < kMT; mt++)
#pragma unroll
            for (int nb = 0; nb < 2 * kJ; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    xchg[((mt * kNB + 2 * kp0 + nb) * 4 + e) * 32 + lane] = sp[mt][nb][e];
    };

    cp_async_wait<kStages - 1>(); /* group 0: Q and K(0) (this thread's copies) */
    __syncthreads();              /* ... everyone's */
    if (warp_active) {
        if constexpr (C::kQInRegs)
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; kk++)
                ldmatrix_x4(qf[0][C::kQInRegs ? kk : 0], q_lds.at(0, kk));
        float sp[kMT][2 * kJ][4] = {};
        qk_part(sp, 0);
        publish(sp, xchg0);
        cur_split = t_first / S;
        start_split(acc, m_s, l_s);
    }

    int st = 0; /* tile j's stage */
#pragma unroll 1
    for (int j = 0; tile_at(j) < t_last; j++) {
        const int t0 = tile_at(j), st_next = next_stage(st);
        cp_async_wait<kStages - 2>(); /* group j + 1: K(j + 1), V(j) (this thread's copies) */
        __syncthreads(); /* ... everyone's; S(j) is whole; K(j)'s and V(j - 1)'s stages are free */
        load_group(j + kStages, prev_stage(st), st);

        if (warp_active) {
            float s[kMT][kNB][4];
            const float *xchg = j % 2 ? xchg1 : xchg0;
#pragma unroll
            for (int mt = 0; mt < kMT; mt++)
#pragma unroll
                for (int nb = 0; nb < kNB; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[mt][nb][e] = xchg[((mt * kNB + nb) * 4 + e) * 32 + lane];
            float m_tile[kRows];
            softmax_max<kMod>(s, m_tile, t0 < unmasked_lo || t0 + kBlockN > unmasked_hi, mod, rows,
                              t0, len_q, len_k, p.window_left, p.window_right);
            /* S(j + 1), branch-free so that it shares softmax_exp's basic
             * block; on the last tile it recomputes S(j) from K(j) (intact:
             * no copy follows it) into the exchange nobody reads. */
            const bool has_next = t0 + kBlockN < t_last;
            float sp[kMT][2 * kJ][4] = {};
            qk_part(sp, has_next ? st_next : st);
            softmax_exp<false>(s, acc, m_s, l_s, m_tile, mod);
            pv_tile<T, kBlockN, kMT, kColBlocks>(acc, s, v_lds0.reload(st * 2));
            publish(sp, j % 2 ? xchg0 : xchg1);
            /* the next tile starts a split: fold this one into R, fresh state */
            if (has_next && (t0 + kBlockN) / S != cur_split) {
                fold_split(acc, m_s, l_s, mR, lR, r_in_regs<kMT, kDB>{oR}, have_R, true);
                cur_split = (t0 + kBlockN) / S;
                start_split(acc, m_s, l_s);
            }
        }
        st = st_next;
    }
    cp_async_wait_all();
    /* a page outside the cache: every row of the CTA gets NaN (CTA-uniform branch) */
    const bool poison = kPaged ? __syncthreads_or(bad_page) != 0 : false;
    if (!warp_active)
        return;

    if (partial) { /* the CTA's one split ends: write its (m, l, o) out by flat row */
        if (cur_split >= 0) {
            const size_t split_base = (size_t)cur_split * fad_flat_rows(&p);
#pragma unroll
            for (int r = 0; r < kRows; r++) {
                const float nan = __int_as_float(0x7fffffff);
                const float l_row = poison ? nan : quad_sum(l_s[r]);
                const int pr = m0 + row0 + 8 * r;
                if (pr < m_end) {
                    const size_t row = split_base + seq.row0 + (hk * G + pr % G) * head_stride + pr / G;
                    store_partial_row(acc, r, poison ? nan : m_s[r], l_row, a.ws_o + row * D,
                                      a.ws_ml + row * 2, D,
                                      cw * kColBlocks * 16, cw == 0);
                }
            }
        }
        return;
    }
    if (cur_split >= 0)
        fold_split(acc, m_s, l_s, mR, lR, r_in_regs<kMT, kDB>{oR}, have_R, false);

#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int pr = m0 + row0 + 8 * r;
        if (pr < m_end) {
            const int i = pr / G, h = hk * G + pr % G;
            store_row(acc, r, mR[r], lR[r],
                      (T *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride,
                      p.softmax_lse + seq.row0 + h * head_stride + i, D, cw * kColBlocks * 16,
                      cw == 0 && p.softmax_lse, poison);
        }
    }
}


/* ------------------------------------------------------------------------ */
/* combine: fold split partials left to right, per query row                 */
/* ------------------------------------------------------------------------ */

/* Knob that never changes a bit: 1 = launch the combine as a programmatic
 * dependent of the attention kernel where the GPU has it (sm_90 on). */
#ifndef FAD_COMBINE_PDL
#define FAD_COMBINE_PDL 1
#endif
/* Knob that never changes a bit: 1 = launch the packed (decode) kernel as a
 * programmatic dependent of whatever runs before it in the stream (sm_90 on):
 * its CTAs are scheduled, and its code and parameters fetched, while that
 * kernel ends; they wait before touching global memory. Decode B1 8k on the
 * H200, back to back in a graph: 15.6 -> 15.0 us per call (benchmarks/NOTES.md,
 * "Decode v6"). */
#ifndef FAD_ATTN_PDL
#define FAD_ATTN_PDL 1
#endif
/* Knob that never changes a bit: 1 = for fewer than 4 query rows, the 4 warps
 * of a combine CTA split one row's columns (0: one row per warp). */
#ifndef FAD_COMBINE_BY_COLS
#define FAD_COMBINE_BY_COLS 1
#endif

/* Shapes: ws_ml (num_splits, flat rows, 2) fp32 (m, l) and ws_o (num_splits,
 * flat rows, D) fp32 o of each split's partial state (a row's splits that its
 * keys never reach are not read); out / softmax_lse as in fad_fwd_params.
 * kParts warps share a query row, each folding a 1/kParts slice of its
 * columns (kParts = 1: 4 rows per CTA, one per warp; kParts = 4: one row per
 * CTA, for short queries such as decode, where the fold's memory round trip
 * is the whole cost and fewer loads per lane shorten it). Every warp of a row
 * computes the same (m, l) chain, and each column's chain is the same
 * operations in the same split order, so kParts changes no bit. */
template <typename T, int kHeadDim, int kParts> /* kHeadDim: the variant's bound on D */
__global__ void __launch_bounds__(128, 1) combine_kernel(const __grid_constant__ fwd_args a)
{
    using ops = dtype_ops<T>;
    constexpr int kRowsPerCta = 4 / kParts;
    constexpr int kC = (kHeadDim + 32 * kParts - 1) / (32 * kParts); /* columns per lane */
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size, D = p.head_dim, lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32, part = warp % kParts;
    const int q_blocks = (p.seqlen_q + kRowsPerCta - 1) / kRowsPerCta; /* row blocks per (batch, head) */
    const int bh = blockIdx.x / q_blocks, b = bh / p.num_heads, h = bh % p.num_heads;
    const int i = (blockIdx.x % q_blocks) * kRowsPerCta + warp / kParts; /* query row of sequence b */
    /* Launched early (FAD_COMBINE_PDL), it may read the call's inputs before
     * pdl_wait_primary (the attention kernel lets it launch only once its own
     * predecessor is done) but not the partials; and every CTA waits before
     * it ends, so that this grid never ends before the attention kernel. */
    const fad_seq seq = fad_get_seq(&p, b);
    if (!seq.valid && p.cache_seqlens) {
        pdl_wait_primary();
        if (part == 0)
            poison_row(p, seq, h, i, lane, 32);
        return;
    }
    pdl_wait_primary();
    pdl_launch_dependents(); /* the next call's attention kernel, if launched early */
    if (i >= seq.len_q)
        return;
    const int64_t row = seq.row0 + h * fad_lse_head_stride(&p) + i; /* flat row */
    const size_t split_stride = (size_t)fad_flat_rows(&p);

    fad_key_range r = fad_row_keys(i, seq.len_q, seq.len_k, p.window_left, p.window_right);
    float m = -INFINITY, l = 0.f, o[kC];
    int col[kC]; /* this lane's columns */
#pragma unroll
    for (int c = 0; c < kC; c++)
        o[c] = 0.f, col[c] = (part * kC + c) * 32 + lane;
    const int s_end = fad_end_split(r, S);
    bool poison = false; /* a split CTA met a page outside the cache: (m, l) = NaN */
    /* The fold is a chain, its loads are not: each batch of kBatch splits is
     * fetched at once (one memory round trip per batch rather than per split;
     * with few rows, as at decode, this kernel is latency-bound), and the next
     * batch's fetch is issued before this batch is merged (two register sets,
     * A and B), so at long context the round trips overlap the merges. The
     * merges run in split order exactly as before. */
    constexpr int kBatch = kC <= 1 ? 16 : kC <= 4 ? 8 : 4; /* 2 x kBatch x (kC + 2) registers */
    auto fetch = [&](float2 (&ml)[kBatch], float (&ov)[kBatch][kC], int s0) {
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const size_t idx = (size_t)(s0 + u) * split_stride + row;
            const bool live = s0 + u < s_end;
            ml[u] = live ? *reinterpret_cast<const float2 *>(a.ws_ml + idx * 2) : make_float2(0.f, 0.f);
#pragma unroll
            for (int c = 0; c < kC; c++)
                ov[u][c] = live && col[c] < D ? a.ws_o[idx * D + col[c]] : 0.f;
        }
    };
    /* A split past the row's last is skipped with selects, not a branch: with
     * the batch in one basic block the (m) chain runs ahead while the
     * exponentials and the (l, o) updates of earlier splits trail behind it.
     * (A merge with an empty state is no identity: it would turn a -0 into
     * +0.) Columns past D are merged too, from zeros, and never stored. */
    auto merge = [&](const float2 (&ml)[kBatch], const float (&ov)[kBatch][kC], int s0) {
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const bool live = s0 + u < s_end;
            /* paged only: NaN inputs stay as before */
            poison |= live && p.block_table && ml[u].y != ml[u].y;
            const fad_merge_w w = fad_merge_weights(m, ml[u].x);
#pragma unroll
            for (int c = 0; c < kC; c++) {
                const float v = fad_merge_value(o[c], ov[u][c], w);
                o[c] = live ? v : o[c];
            }
            const float lv = fad_merge_value(l, ml[u].y, w);
            l = live ? lv : l;
            m = live ? w.m : m;
        }
    };
    float2 ml_a[kBatch], ml_b[kBatch];
    float ov_a[kBatch][kC], ov_b[kBatch][kC];
    int s0 = fad_first_split(r, S);
    if (s0 < s_end)
        fetch(ml_a, ov_a, s0);
    for (; s0 < s_end; s0 += 2 * kBatch) {
        if (s0 + kBatch < s_end)
            fetch(ml_b, ov_b, s0 + kBatch);
        merge(ml_a, ov_a, s0);
        if (s0 + kBatch >= s_end)
            break;
        if (s0 + 2 * kBatch < s_end)
            fetch(ml_a, ov_a, s0 + 2 * kBatch);
        merge(ml_b, ov_b, s0 + kBatch);
    }
    const float inv = poison ? __int_as_float(0x7fffffff) : fad_inv_sum(l);
    T *out = (T *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride;
#pragma unroll
    for (int c = 0; c < kC; c++)
        if (col[c] < D) {
            uint32_t two = ops::pack(FAD_MUL(o[c], inv), 0.f);
            out[col[c]] = *reinterpret_cast<T *>(&two);
        }
    if (lane == 0 && part == 0 && p.softmax_lse)
        p.softmax_lse[row] = poison ? inv : fad_lse(m, l);
}

/* ------------------------------------------------------------------------ */
/* host side: SM count, and the one dispatch point                            */
/* ------------------------------------------------------------------------ */

/* Attribute attr of the current device, asked once per device: cache holds
 * one value per device, 0 = not asked yet (every attribute asked here is > 0). */
static fad_status current_device_attr(cudaDeviceAttr attr, int *cache, int *value, char *msg,
                                      size_t msg_len)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= FAD_MAX_DEVICES)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "device %d: too many devices", dev);
    if (!cache[dev])
        CUDA_TRY(cudaDeviceGetAttribute(&cache[dev], attr, dev));
    *value = cache[dev];
    return FAD_OK;
}

extern "C" fad_status fad_cuda_num_sms(int *num_sms, char *msg, size_t msg_len)
{
    static int sms[FAD_MAX_DEVICES];
    return current_device_attr(cudaDevAttrMultiProcessorCount, sms, num_sms, msg, msg_len);
}

extern "C" int fad_has_cuda(void) { return 1; }

extern "C" fad_status fad_cuda_set_device(int dev, int *prev, char *msg, size_t msg_len)
{
    CUDA_TRY(cudaGetDevice(prev));
    if (*prev != dev)
        CUDA_TRY(cudaSetDevice(dev));
    return FAD_OK;
}

/* words (n, uint32) <- pattern: a grid-stride loop of plain stores (memory bound;
 * at most 1024 CTAs of 256 threads, enough to keep every SM streaming). */
__global__ void fill32_kernel(uint32_t *words, uint32_t pattern, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        words[i] = pattern;
}

extern "C" fad_status fad_cuda_fill32(void *ptr, uint32_t pattern, size_t words,
                                      struct CUstream_st *stream, char *msg, size_t msg_len)
{
    if (!words)
        return FAD_OK;
    const size_t blocks = (words + 255) / 256;
    fill32_kernel<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, stream>>>(
        (uint32_t *)ptr, pattern, words);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

/* Compute capability major of the current device: 9 is sm_90 (H100, H200;
 * no other 9.x exists), which runs programmatic dependent launch and, from
 * an sm_90a build, the wgmma kernels. */
static fad_status device_major(int *major, char *msg, size_t msg_len)
{
    static int majors[FAD_MAX_DEVICES];
    return current_device_attr(cudaDevAttrComputeCapabilityMajor, majors, major, msg, msg_len);
}

/* Launches kernel<<<grid, block, smem, stream>>>(a), as a programmatic
 * dependent of the kernel ahead of it in the stream when pdl is set and the
 * GPU has it (sm_90 on): its CTAs may then be scheduled while that kernel's
 * last CTAs still run, and wait in griddepcontrol.wait (pdl_wait_primary)
 * before touching what it wrote. */
static fad_status launch_kernel(void (*kernel)(fwd_args), dim3 grid, int block, size_t smem,
                                cudaStream_t stream, int pdl, const fwd_args &a, char *msg,
                                size_t msg_len)
{
    if (pdl) {
        int major = 0;
        fad_status st = device_major(&major, msg, msg_len);
        if (st != FAD_OK)
            return st;
        pdl = major >= 9;
    }
    if (!pdl) {
        kernel<<<grid, block, smem, stream>>>(a);
        CUDA_TRY(cudaGetLastError());
        return FAD_OK;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a));
    return FAD_OK;
}

/* CTA-per-split schedule: the combine kernel, for every (batch, head, query
 * row), whichever kernel wrote the partials: 4 rows per block, one warp each,
 * or for fewer than 4 query rows one row per block, its columns split over
 * the 4 warps (decode).
 * On sm_90 it is launched as a programmatic dependent of the attention kernel
 * (FAD_COMBINE_PDL): its CTAs launch while the last split CTAs still run and
 * wait in griddepcontrol.wait, so the gap between the two kernels (a few us
 * at decode, where the attention kernel itself takes ~12) is hidden. Bits:
 * the same kernel reads the same complete partials. */
template <typename T, int kHeadDim>
static fad_status launch_combine(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    if (!a.plan.cta_per_split)
        return FAD_OK;
    /* Short queries (decode): the 4 warps of a CTA share one row's columns. */
    const bool by_cols = FAD_COMBINE_BY_COLS && a.p.seqlen_q < 4;
    const int rows_per_cta = by_cols ? 1 : 4;
    const int64_t blocks =
        (int64_t)(a.p.seqlen_q + rows_per_cta - 1) / rows_per_cta * a.p.batch * a.p.num_heads;
    void (*kernel)(fwd_args) = by_cols ? combine_kernel<T, kHeadDim, 4> : combine_kernel<T, kHeadDim, 1>;
    return launch_kernel(kernel, dim3((unsigned)blocks), 128, 0, stream, FAD_COMBINE_PDL, a, msg,
                         msg_len);
}

/* The sm_90a variants (the prefill kernel's, and the backward's in fad_bwd.cu)
 * run when this build has sm_90a code (setup.py defines FAD_SM90A) and the
 * device is sm_90, for the compile-time variants that have them (D 64 or 128,
 * no softcap or ALiBi; the prefill kernel: no paged KV).
 * FLASH_ATTN_DET_WGMMA in the environment (read once): "0" turns them off, for
 * A/B runs and for the tests that compare the two variants' bits; "force"
 * (*use = 2) also runs the backward's variants on grids too small for them
 * to pay (fad_bwd.cu), which those tests need. */
#ifndef FAD_SM90A
#define FAD_SM90A 0
#endif
extern "C" fad_status fad_use_wgmma(int *use, char *msg, size_t msg_len)
{
    static int env = -1; /* 0 off, 1 default, 2 force */
    if (env < 0) {
        const char *e = getenv("FLASH_ATTN_DET_WGMMA");
        env = e && e[0] == '0' ? 0 : e && strcmp(e, "force") == 0 ? 2 : 1;
    }
    *use = 0;
    if (!FAD_SM90A || env == 0)
        return FAD_OK;
    int major = 0;
    fad_status st = device_major(&major, msg, msg_len);
    *use = major == 9 ? env : 0;
    return st;
}

template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kWgmma>
static fad_status launch_prefill(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = fwd_cfg<kHeadDim, kWgmma>;
    static int smem_set[FAD_MAX_DEVICES];
    fad_status st = allow_smem(fwd_kernel<T, kHeadDim, kMod, kPaged, kWgmma>, smem_set, C::kSmemBytes,
                               msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (C::kBlockM != fad_block_m(a.p.head_dim)) /* the plan's m_blocks assume this tile */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: tile rows %d != plan's %d",
                        C::kBlockM, fad_block_m(a.p.head_dim));
    dim3 grid((unsigned)((int64_t)a.plan.m_blocks * a.p.batch * a.p.num_heads), 1,
              a.plan.cta_per_split ? a.plan.num_splits : 1);
    fwd_kernel<T, kHeadDim, kMod, kPaged, kWgmma><<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    return FAD_OK;
}

/* The warp-specialized kernel (fad_fwd_ws.cuh): one CTA per pair of the
 * plan's 64-row query blocks. */
template <typename T, int kHeadDim>
static fad_status launch_prefill_ws(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = fwd_ws_cfg<kHeadDim>;
    static int smem_set[FAD_MAX_DEVICES];
    fad_status st = allow_smem(fwd_ws_kernel<T, kHeadDim>, smem_set, C::kSmemBytes, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (C::kBlockM != fad_block_m(a.p.head_dim)) /* the plan's m_blocks assume this tile */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: tile rows %d != plan's %d",
                        C::kBlockM, fad_block_m(a.p.head_dim));
    dim3 grid((unsigned)((int64_t)(a.plan.m_blocks + 1) / 2 * a.p.batch * a.p.num_heads), 1,
              a.plan.cta_per_split ? a.plan.num_splits : 1);
    fwd_ws_kernel<T, kHeadDim><<<grid, C::kThreads, C::kSmemBytes, stream>>>(a);
    return FAD_OK;
}

template <typename T, int kHeadDim, bool kMod, bool kPaged>
static fad_status launch(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    const fad_plan &plan = a.plan;
    if (plan.packed) {
        using C = packed_cfg<kHeadDim, kMod>;
        static int smem_set[FAD_MAX_DEVICES];
        fad_status st = allow_smem(fwd_packed_kernel<T, kHeadDim, kMod, kPaged>, smem_set, C::kSmemBytes,
                                   msg, msg_len);
        if (st != FAD_OK)
            return st;
        if (C::kBlockM != fad_packed_block_m()) /* the plan's m_blocks assume this tile */
            return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: packed tile rows %d != plan's %d",
                            C::kBlockM, fad_packed_block_m());
        dim3 grid((unsigned)((int64_t)plan.m_blocks * a.p.batch * a.p.num_heads_k), 1,
                  plan.cta_per_split ? plan.num_splits : 1);
        st = launch_kernel(fwd_packed_kernel<T, kHeadDim, kMod, kPaged>, grid, C::kThreads,
                           C::kSmemBytes, stream, FAD_ATTN_PDL, a, msg, msg_len);
        if (st != FAD_OK)
            return st;
    } else {
        /* Softcap/ALiBi and paged KV stay on mma.sync: their wgmma builds
         * spilled 8-16 B at D128 (where, not yet read off their SASS), and
         * spills around in-flight wgmma are the suspect in the D64 failure
         * (benchmarks/NOTES.md, "Prefill on wgmma"). */
        constexpr bool kHasWgmma = kHeadDim <= 128 && !kMod && !kPaged;
        int wgmma = 0;
        fad_status st = kHasWgmma ? fad_use_wgmma(&wgmma, msg, msg_len) : FAD_OK;
        if constexpr (kHasWgmma && kHeadDim == 128 && FAD_WG_WS) {
            if (st == FAD_OK && wgmma)
                st = launch_prefill_ws<T, kHeadDim>(a, stream, msg, msg_len);
            else if (st == FAD_OK)
                st = launch_prefill<T, kHeadDim, kMod, kPaged, false>(a, stream, msg, msg_len);
        } else if (st == FAD_OK) {
            st = wgmma ? launch_prefill<T, kHeadDim, kMod, kPaged, kHasWgmma>(a, stream, msg, msg_len)
                       : launch_prefill<T, kHeadDim, kMod, kPaged, false>(a, stream, msg, msg_len);
        }
        if (st != FAD_OK)
            return st;
    }
    CUDA_TRY(cudaGetLastError());
    return launch_combine<T, kHeadDim>(a, stream, msg, msg_len);
}


template <typename T, bool kMod, bool kPaged>
static fad_status dispatch_head_dim(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    const int D = a.p.head_dim;
    if (D <= 64) return launch<T, 64, kMod, kPaged>(a, s, msg, msg_len);
    if (D <= 128) return launch<T, 128, kMod, kPaged>(a, s, msg, msg_len);
    if (D <= 192) return launch<T, 192, kMod, kPaged>(a, s, msg, msg_len);
    return launch<T, 256, kMod, kPaged>(a, s, msg, msg_len);
}

/* Paged KV (block_table) is its own compile-time variant: the block-table
 * look-ups stay out of the contiguous kernels' registers. */
template <typename T, bool kMod>
static fad_status dispatch_paged(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (a.p.block_table)
        return dispatch_head_dim<T, kMod, true>(a, s, msg, msg_len);
    return dispatch_head_dim<T, kMod, false>(a, s, msg, msg_len);
}

/* The one place a call picks its compile-time variant: dtype x head dim x
 * whether scores need a mod (softcap/ALiBi) before the softmax x paged KV. */
template <typename T>
static fad_status dispatch_mod(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (a.p.softcap > 0.f || a.p.alibi_slopes)
        return dispatch_paged<T, true>(a, s, msg, msg_len);
    return dispatch_paged<T, false>(a, s, msg, msg_len);
}

extern "C" fad_status fad_fwd_cuda_launch(const fad_fwd_params *p, const fad_plan *plan,
                                          void *workspace, struct CUstream_st *stream, char *msg,
                                          size_t msg_len)
{
    fwd_args a;
    a.p = *p;
    a.plan = *plan;
    a.ws_o = (float *)((char *)workspace + plan->ws_o_offset);
    a.ws_ml = (float *)((char *)workspace + plan->ws_ml_offset);
    if (p->dtype == FAD_BFLOAT16)
        return dispatch_mod<__nv_bfloat16>(a, stream, msg, msg_len);
    return dispatch_mod<__half>(a, stream, msg, msg_len);
}
