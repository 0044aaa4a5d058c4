/*
 * fwd_tile.cuh — the per-tile math every forward kernel shares (fwd_kernel,
 * fwd_ws_kernel, fwd_packed_kernel): a thread's rows, S = Q K^T and O += P V
 * on mma.sync, scores and mask, the online-softmax step, the fold of a split
 * into the row's merged result, and the store of a row. The one copy of this
 * math: a row gets the same bits whichever kernel runs it (fwd_prefill_kernel.cuh's
 * header says why).
 *
 * Fragment shapes (mma.m16n8k16, mma.cuh): a thread holds rows r = 2*mt + e/2
 * of its warp's 16*kMT, s[kMT][kNB][4] (kNB n8 blocks of keys), acc
 * [kMT][kDB][4] (kDB n8 blocks of output columns).
 */
#ifndef FAD_FWD_TILE_CUH
#define FAD_FWD_TILE_CUH

#include <type_traits>

#include "dropout.cuh"
#include "fad_seq.h"
#include "mma.cuh"

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
 * kernel (fwd_prefill_ws.cu) runs the two apart, with the previous tile's
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

/* The forward's dropout of a tile's P (after softmax_exp, whose l_s sums every
 * p: dropout only thins what reaches O += P V; rp scales the output at the end). */
template <int kMT, int kNB, class Rows>
__device__ __forceinline__ void dropout_tile(float (&s)[kMT][kNB][4], const fad_dropout &d,
                                             int head, const Rows &rows, int t0, int len_q,
                                             int len_k)
{
    int i_pos[2 * kMT];
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++)
        i_pos[r] = rows.qrow(r) + len_k - len_q;
    dropout_walk<2 * kMT, kNB>(d, head, i_pos, t0, [&](int r, int nb, int e, bool kept) {
        float &x = s[r / 2][nb][2 * (r % 2) + e];
        x = kept ? x : 0.f;
    });
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
 * (masking an in-range key is a no-op, so the flag only costs time). kDrop:
 * dropout on P between the two products (its own compile-time variant, so that
 * the other kernels' register allocation is not touched by it). */
template <typename T, int kHeadDim, int kBlockN, int kMT, bool kQInRegs, bool kMod, bool kDrop,
          class Rows>
__device__ __forceinline__ void
attend_tile(float (&acc)[kMT][kHeadDim / 8][4], float (&m_s)[2 * kMT], float (&l_s)[2 * kMT],
            const uint32_t (&qf)[kMT][kQInRegs ? kHeadDim / 16 : 1][4],
            const lds_base<kHeadDim> &q_lds, const lds_base<kHeadDim> &k_lds,
            const lds_base<kHeadDim> &v_lds, bool need_mask, const fad_score_mod &mod,
            const Rows &rows, int t0, int len_q, int len_k, int window_left, int window_right,
            const fad_dropout &drop, int head)
{
    float s[kMT][kBlockN / 8][4] = {};
    qk_tile<T, kHeadDim, kMT, kBlockN / 16, kQInRegs>(s, qf, q_lds, k_lds, 0);
    softmax_tile<kMod>(s, acc, m_s, l_s, need_mask, mod, rows, t0, len_q, len_k, window_left,
                       window_right);
    if constexpr (kDrop)
        dropout_tile(s, drop, head, rows, t0, len_q, len_k);
    pv_tile<T, kBlockN, kMT, kHeadDim / 16>(acc, s, v_lds);
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
 * element of the thread). In shared memory: thread-private float4 slots (an
 * n8 block's four values), slot-major so that a warp's 16-byte accesses are
 * 512 contiguous bytes, four wavefronts with no bank conflict. In shared and
 * global memory (r_in_smem_global: the sm_90a D256 kernel's, a warp's first
 * kSN n8 blocks in shared memory and the rest in its global slot, where a
 * warp's accesses are one 128-byte line). In registers (the sm_90a prefill
 * variant at D128): no shared-memory round trip per split. */
template <int kMT, int kDB, int kThreads> struct r_in_smem {
    float *sR;
    int t; /* the thread's index among the kThreads that share sR */
    static constexpr bool kSmem = true;
    static constexpr bool kVec = true; /* (an n8 block's four values as one float4) */
    static constexpr int kBatch = 1;   /* (n8 blocks fold_split loads ahead of their merges) */
    __device__ __forceinline__ float4 &at4(int mt, int nb) const
    {
        return reinterpret_cast<float4 *>(sR)[(mt * kDB + nb) * kThreads + t];
    }
    /* (one value of it: fold_group_close's) */
    __device__ __forceinline__ float &at(int mt, int nb, int e) const
    {
        return sR[((mt * kDB + nb) * kThreads + t) * 4 + e];
    }
};
/* kBatch n8 blocks loaded ahead of their merges: global memory's round trip
 * is long. sR and gR are the lane's own bases, so that every element is a
 * constant offset from one (an index with the thread in it made ptxas build a
 * 64-bit address per element ahead of the loop and spill). */
template <int kMT, int kDB, int kSN, int kBatch_> struct r_in_smem_global {
    float *sR, *gR; /* this lane's bases: n8 blocks [0, kSN) in shared memory, [kSN, kDB) global */
    static constexpr bool kSmem = true;
    static constexpr bool kVec = false;
    /* (fold_split's batches of loads, each wholly in one of the two parts) */
    static constexpr int kBatch = kBatch_;
    static_assert(kSN % kBatch == 0 && kSN <= kDB, "batches inside a part");
    __device__ __forceinline__ float &at(int mt, int nb, int e) const
    {
        return nb < kSN ? sR[((mt * kSN + nb) * 4 + e) * 32] : gR[((mt * (kDB - kSN) + nb - kSN) * 4 + e) * 32];
    }
};
template <int kMT, int kDB> struct r_in_regs {
    float (&o)[kMT][kDB][4];
    static constexpr bool kSmem = false;
    static constexpr bool kVec = false;
    static constexpr int kBatch = 1;
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
     * then one FMA. In shared memory as float4s (r_in_smem, kVec; unwritten
     * before the first fold, and maybe still holding Q) the same, by three
     * unrolled loops on the warp's uniform state: the first fold writes R's o
     * without reading it (an empty R is +0, and +0 * wa is +0), and later ones
     * multiply by wa only where some row of the warp needs it (x * 1 is x). An
     * n8 block then costs one 16-byte load, four FMAs and one 16-byte store,
     * where a load, a select, a multiply, an FMA and a store per value made
     * the D128 fold 14% of the three-consumer kernel's instructions. */
    if constexpr (RO::kVec) {
        const bool any_scales = __any_sync(0xffffffffu, scales_R);
        auto merge = [&](auto read, auto scale) {
#pragma unroll
            for (int mt = 0; mt < kMT; mt++)
#pragma unroll
                for (int nb = 0; nb < kDB; nb++) {
                    float4 r = make_float4(0.f, 0.f, 0.f, 0.f);
                    if constexpr (decltype(read)::value)
                        r = R.at4(mt, nb);
                    const float a[4] = {r.x, r.y, r.z, r.w};
                    float v[4];
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const fad_merge_w &we = w[2 * mt + e / 2];
                        v[e] = fad_merge_keep_a(decltype(scale)::value ? FAD_MUL(a[e], we.wa) : a[e],
                                                acc[mt][nb][e], we.wb);
                    }
                    if (to_R) {
                        R.at4(mt, nb) = make_float4(v[0], v[1], v[2], v[3]);
                    } else {
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            acc[mt][nb][e] = v[e];
                    }
                    /* Keeps the scheduler from hoisting every block's load
                     * ahead of the FMAs (all kDB in flight spilled the D128
                     * loop): two blocks' loads in flight at a time. */
                    if (nb % 2 == 1 || nb == kDB - 1)
                        __syncwarp();
                }
        };
        using no = std::false_type;
        using yes = std::true_type;
        if (!have_R)
            merge(no{}, no{});
        else if (any_scales)
            merge(yes{}, yes{});
        else
            merge(yes{}, no{});
    } else {
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
        constexpr int kB = RO::kBatch;
        static_assert(kDB % kB == 0, "whole batches");
        if constexpr (kB == 1) { /* (R in registers: r_in_regs) */
            static_assert(!RO::kSmem, "R in memory: the float4 path, or batches of loads");
#pragma unroll
            for (int mt = 0; mt < kMT; mt++)
#pragma unroll
                for (int nb = 0; nb < kDB; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float &slot = R.at(mt, nb, e);
                        const float v = fad_merge_keep_a(slot, acc[mt][nb][e], w[2 * mt + e / 2].wb);
                        if (to_R)
                            slot = v;
                        else
                            acc[mt][nb][e] = v;
                    }
        } else { /* (R in global memory: a batch's loads are issued before its
                  * merges. Kept apart from the loop above, whose kernels this
                  * form gave other register allocations than the ones measured.) */
            static_assert(RO::kSmem, "R in registers needs no batches");
#pragma unroll
            for (int mt = 0; mt < kMT; mt++)
#pragma unroll
                for (int nb0 = 0; nb0 < kDB; nb0 += kB) {
                    float rv[kB][4];
#pragma unroll
                    for (int u = 0; u < kB; u++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            rv[u][e] = have_R ? R.at(mt, nb0 + u, e) : 0.f;
#pragma unroll
                    for (int u = 0; u < kB; u++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const float v = fad_merge_value(rv[u][e], acc[mt][nb0 + u][e], w[2 * mt + e / 2]);
                            if (to_R)
                                R.at(mt, nb0 + u, e) = v;
                            else
                                acc[mt][nb0 + u][e] = v;
                        }
                    __syncwarp(); /* (as above: one batch's values live at a time) */
                }
        }
    }
    have_R = true;
}

/* The two-level fold of a walk across split groups (fad_math.h,
 * FAD_MERGE_GROUP), in fwd_kernel's kGroups variant only (the plan's one-CTA
 * schedule past FAD_MERGE_GROUP splits; docs/design.md, "merge-groups"): where a split that closes its group ends and the walk goes
 * on, fold_group_close moves R into X, the outer result of the warp's rows (X
 * <- X (+) R, R empty); after the last fold (R in acc, mR, lR),
 * fold_group_end makes acc X (+) R. X lives in a slot of the call's workspace
 * (fad_make_plan's x_slots, FAD_X_LANE_FLOATS a lane, lane-interleaved so that
 * a warp's accesses are whole lines), taken at the walk's first close and
 * given back at its end: a close comes once per FAD_MERGE_GROUP splits, so its
 * memory round trip costs nothing a split. A row whose keys a group does not
 * reach has an empty R or X there, which fad_outer_* copy or keep: every row
 * gets the chain of its own groups, as on the CPU and in the combine. */
/* A pool of slots in the call's workspace with a taken flag each (zeroed by
 * the launch), which warps take and give back: lane 0 scans by
 * compare-and-swap from slot `start` on (this SM's and warp's, so that the
 * slot a warp that ran here gave back is found first, one compare-and-swap as
 * a rule); a pool with a slot for every warp that can be resident always has
 * a free one, so the scan ends. Returns the slot to every lane. */
__device__ __forceinline__ int take_pool_slot(unsigned *flag, unsigned n, unsigned start)
{
    int slot = -1;
    if (threadIdx.x % 32 == 0) {
        unsigned sl = start % n;
        while (atomicCAS(&flag[sl], 0u, 1u) != 0u)
            sl = sl + 1 == n ? 0u : sl + 1;
        slot = (int)sl;
    }
    return __shfl_sync(0xffffffffu, slot, 0);
}

/* After the warp's last access of the slot. */
__device__ __forceinline__ void give_pool_slot(unsigned *flag, int slot)
{
    __syncwarp();
    if (threadIdx.x % 32 == 0 && slot >= 0) {
        __threadfence(); /* (the warp's reads and writes of the slot before it is free) */
        atomicExch(&flag[slot], 0u);
    }
}

__device__ __forceinline__ unsigned sm_id()
{
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    return sm;
}

struct x_pool {
    float *ws;      /* fwd_args::ws_x */
    unsigned *flag; /* fwd_args::ws_x_flag */
    int n;          /* plan.x_slots */
};

/* A warp's X. Its slot's index (-1: none taken, X empty) is held through
 * the walk in a register (kAt = x_in_reg) or in a word of the kernel's
 * dynamic shared memory, one a warp from byte kAt (4 bytes a warp at the end
 * of its layout, fwd_cfg::kSmemXAt), whichever cost its tile loop less
 * (ptxas -v: in a register on sm_90, in shared memory on sm_80). In
 * shared memory every lane of the warp writes the same value and reads its
 * own write back, so no lane waits on another (volatile: not held in a
 * register across the loop). The lane's values are addressed from the index
 * where used. */
constexpr size_t x_in_reg = ~(size_t)0;
template <int kMT, int kDB, size_t kAt = x_in_reg> struct x_slot {
    static constexpr int kO = kMT * kDB * 4; /* the lane's o values, then m and l of its 2 kMT rows */
    static_assert(kO + 4 * kMT <= FAD_X_LANE_FLOATS, "FAD_X_LANE_FLOATS holds a lane's X");
    static_assert(kAt == x_in_reg || kAt % 4 == 0, "aligned words");
    int reg = -1; /* (kAt == x_in_reg) */
    __device__ __forceinline__ static volatile int &word()
    {
        extern __shared__ __align__(16) unsigned char fad_x_smem[];
        return reinterpret_cast<volatile int *>(fad_x_smem + kAt)[threadIdx.x / 32];
    }
    __device__ __forceinline__ int slot() const
    {
        if constexpr (kAt == x_in_reg)
            return reg;
        else
            return word();
    }
    __device__ __forceinline__ void set(int s)
    {
        if constexpr (kAt == x_in_reg)
            reg = s;
        else
            word() = s;
    }
    __device__ __forceinline__ void give(const x_pool &pool)
    {
        give_pool_slot(pool.flag, slot());
        set(-1);
    }
    /* value i of this lane (o: i < kO; m of row r: kO + r; l: kO + 2 kMT + r) */
    struct lane_values {
        float *p;
        __device__ __forceinline__ float &at(int i) const { return p[i * 32]; }
        __device__ __forceinline__ float &m(int r) const { return at(kO + r); }
        __device__ __forceinline__ float &l(int r) const { return at(kO + 2 * kMT + r); }
    };
    __device__ __forceinline__ static lane_values values(const x_pool &pool, int slot)
    {
        return {pool.ws + (size_t)slot * 32 * FAD_X_LANE_FLOATS + threadIdx.x % 32};
    }
};

/* X <- X (+) R, R empty (taking X's slot first where it has none). Inline,
 * one row's weights and one value of X at a time: called from inside the tile
 * loops, which run at their register limit, it adds as few registers to
 * theirs as it can. (Out of line, R in registers had to go
 * through the call's stack frame, and the registers live across the call
 * through spills.) A close comes once per FAD_MERGE_GROUP splits, so its
 * serial memory round trips cost nothing a split. */
template <int kMT, int kDB, size_t kAt, class RO>
__device__ __forceinline__ void fold_group_close(float (&mR)[2 * kMT], float (&lR)[2 * kMT], const RO &R,
                                                 bool &have_R, x_slot<kMT, kDB, kAt> &X,
                                                 const x_pool &pool)
{
    int slot = X.slot();
    const bool first = slot < 0; /* X empty: X <- R (fad_outer_value copies) */
    if (first) {
        slot = take_pool_slot(pool.flag, (unsigned)pool.n, sm_id() * FAD_X_WARPS_PER_SM + threadIdx.x / 32);
        X.set(slot);
    }
    const auto x = X.values(pool, slot);
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        const fad_outer_w w = fad_outer_weights(first ? -INFINITY : x.m(r), mR[r]);
        x.l(r) = fad_outer_value(first ? 0.f : x.l(r), lR[r], w);
        x.m(r) = w.w.m;
        mR[r] = -INFINITY, lR[r] = 0.f;
        /* row r's values: e = 2 (r % 2) and the next of every n8 block of mt = r / 2 */
        const int mt = r / 2;
        auto block = [&](int nb) {
#pragma unroll
            for (int e = 2 * (r % 2); e < 2 * (r % 2) + 2; e++) {
                float &rv = R.at(mt, nb, e);
                const int i = (mt * kDB + nb) * 4 + e;
                x.at(i) = fad_outer_value(first ? 0.f : x.at(i), have_R ? rv : 0.f, w);
                if constexpr (!RO::kSmem)
                    rv = 0.f; /* (R in registers is read as it is: the empty state's o) */
            }
            __syncwarp(); /* (keeps ptxas from hoisting the loads of X ahead: one block's live at a time) */
        };
        /* R in memory: a loop, not kDB copies of the block in the tile loop's
         * code, where that spilled the loops less (ptxas -v: sm_90 yes, sm_80 no) */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
        constexpr bool kRolled = false;
#else
        constexpr bool kRolled = RO::kSmem;
#endif
        if constexpr (kRolled) {
#pragma unroll 1
            for (int nb = 0; nb < kDB; nb++)
                block(nb);
        } else {
#pragma unroll
            for (int nb = 0; nb < kDB; nb++)
                block(nb);
        }
    }
    have_R = false; /* (in memory R is read as 0 until the next fold writes it) */
}

template <int kMT, int kDB, size_t kAt>
__device__ __forceinline__ void fold_group_end(float (&acc)[kMT][kDB][4], float (&mR)[2 * kMT],
                                               float (&lR)[2 * kMT], x_slot<kMT, kDB, kAt> &X,
                                               const x_pool &pool)
{
    const int slot = X.slot();
    if (slot < 0) /* no close: X is empty, R the result (warp-uniform) */
        return;
    const auto x = X.values(pool, slot);
    fad_outer_w w[2 * kMT];
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        w[r] = fad_outer_weights(x.m(r), mR[r]);
        lR[r] = fad_outer_value(x.l(r), lR[r], w[r]);
        mR[r] = w[r].w.m;
    }
#pragma unroll
    for (int mt = 0; mt < kMT; mt++)
#pragma unroll
        for (int nb = 0; nb < kDB; nb++) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][nb][e] = fad_outer_value(x.at((mt * kDB + nb) * 4 + e), acc[mt][nb][e], w[2 * mt + e / 2]);
            __syncwarp(); /* (one n8 block's loads at a time, as in fold_split) */
        }
    X.give(pool);
}

/* Row r of this thread, merged result (acc, m, l): normalised output to o
 * (the row's D values; acc holds columns col0 ..) and, with_lse, its lse. */
template <typename T, int kMT, int kDB>
__device__ __forceinline__ void store_row(const float (&acc)[kMT][kDB][4], int r, float m, float l,
                                          T *o, float *lse, int D, int col0 = 0,
                                          bool with_lse = true, bool poison = false,
                                          float rp = 1.f)
{
    using ops = dtype_ops<T>;
    const int lane = threadIdx.x % 32;
    const float inv = poison ? __int_as_float(0x7fffffff) : fad_out_scale(l, rp);
#pragma unroll
    for (int nb = 0; nb < kDB; nb++) {
        const int col = col0 + nb * 8 + (lane % 4) * 2;
        if (col < D)
            *reinterpret_cast<uint32_t *>(o + col) =
                ops::pack(FAD_MUL(acc[r / 2][nb][2 * (r % 2)], inv),
                          FAD_MUL(acc[r / 2][nb][2 * (r % 2) + 1], inv));
    }
    if (with_lse && lane % 4 == 0)
        *lse = poison ? inv : fad_lse(m, l); /* (inv is NaN when poisoned) */
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
#endif /* FAD_FWD_TILE_CUH */
