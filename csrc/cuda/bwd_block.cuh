/*
 * bwd_block.cuh — what the backward's kernels share (mma.sync and wgmma
 * alike): a row's lse in log2 units, the score and its gradient factor, which
 * rows and keys a CTA's block walks, where its work lives, its loads of Q/dO,
 * and the stores of dK/dV and dQ rows.
 */
#ifndef FAD_BWD_BLOCK_CUH
#define FAD_BWD_BLOCK_CUH

#include "bwd_cfg.cuh"
#include "bwd_launch.h"
#include "dropout.cuh"
#include "fad_seq.h"
#include "mma.cuh"

/* Row i's lse in log2 units; +inf for a row that saw no key or does not
 * exist, so that every p_ij = exp2(s - lse2) of it is exactly 0. */
__device__ __forceinline__ float lse_log2(const fad_fwd_params &p, int64_t flat, bool exists)
{
    const float lse = exists ? p.softmax_lse[flat] : -INFINITY;
    return lse == -INFINITY ? INFINITY : FAD_MUL(lse, FAD_LOG2E);
}

/* The score of raw dot product x for (row i, key j) in log2 units, or -inf
 * when masked; *grad receives d(score)/d(q.k) in natural units. */
template <bool kMod>
__device__ __forceinline__ float bwd_score(float x, const fad_score_mod &mod, float softmax_scale,
                                           float slope_log2, int i, int j, int len_q, int len_k,
                                           bool masked, float *grad)
{
    if (kMod) {
        *grad = fad_logit_grad(&mod, softmax_scale, x);
        x = fad_logit(&mod, x);
        if (slope_log2 != 0.f)
            x = FAD_ADD(x, fad_alibi_log2(slope_log2, i, j, len_q, len_k));
    } else {
        *grad = softmax_scale;
    }
    return masked ? -INFINITY : x;
}

/* First row i in [0, len_q) with pred(i), for a predicate monotone in i
 * (false...false true...true); len_q when none. (Host too, like
 * dkdv_row_tiles: tests/dq_turn_check.cu runs the walk on the CPU.) */
template <typename Pred> __host__ __device__ __forceinline__ int first_row(int len_q, Pred pred)
{
    int lo = 0, hi = len_q;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (pred(mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The row tiles (kM rows, aligned to row 0) a CTA owning keys [n0, n0 + kN)
 * walks: the rows that may see one of its keys (a row's key range [lo, hi)
 * only moves right as the row index grows). */
template <int kM, int kN>
__host__ __device__ __forceinline__ void dkdv_row_tiles(int len_q, int len_k, int wl, int wr, int n0,
                                               int *mt_first, int *mt_count)
{
    const int m_lo = first_row(len_q, [&](int i) { return fad_row_keys(i, len_q, len_k, wl, wr).hi > n0; });
    const int m_hi = first_row(len_q, [&](int i) { return fad_row_keys(i, len_q, len_k, wl, wr).lo >= n0 + kN; });
    *mt_first = m_lo / kM;
    *mt_count = m_lo < m_hi ? (m_hi - 1) / kM + 1 - *mt_first : 0;
}

/* Rows r = 0, 1 of this thread's 16-row accumulator fragment (rows lane/4 +
 * 8r) to rows[r] (nullptr: not stored) in the dtype, columns col0 + 8 nb +
 * 2 (lane%4) below D. */
template <typename T, int kDB>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[kDB][4], T *const (&rows)[2], int col0,
                                               int D)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (!rows[r])
            continue;
#pragma unroll
        for (int nb = 0; nb < kDB; nb++) {
            const int col = col0 + nb * 8 + (lane % 4) * 2;
            if (col < D)
                *reinterpret_cast<uint32_t *>(rows[r] + col) =
                    dtype_ops<T>::pack(acc[nb][2 * r], acc[nb][2 * r + 1]);
        }
    }
}

/* dK and dV rows key0 + 8r (r = 0, 1) of this thread, every key of the tile
 * below len_k (zeros where no row sees it). */
template <typename T, int kDB>
__device__ __forceinline__ void store_dkdv(const float (&dk)[kDB][4], const float (&dv)[kDB][4],
                                           const bwd_args &a, const fad_seq &seq, int hk, int key0,
                                           int col0)
{
    const fad_fwd_params &p = a.p;
    T *k_rows[2], *v_rows[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int j = key0 + 8 * r;
        const bool ok = j < seq.len_k;
        k_rows[r] = ok ? (T *)a.dk + seq.k_off + (int64_t)j * p.k_row_stride + hk * p.k_head_stride : nullptr;
        v_rows[r] = ok ? (T *)a.dv + seq.v_off + (int64_t)j * p.v_row_stride + hk * p.v_head_stride : nullptr;
    }
    store_acc_rows<T>(dk, k_rows, col0, p.head_dim);
    store_acc_rows<T>(dv, v_rows, col0, p.head_dim);
}

/* dQ rows i0 + 8r (r = 0, 1) of this thread, those below len_q, columns from col0. */
template <typename T, int kDB>
__device__ __forceinline__ void store_dq(const float (&dq)[kDB][4], const bwd_args &a,
                                         const fad_seq &seq, int h, int i0, int col0 = 0)
{
    const fad_fwd_params &p = a.p;
    T *rows[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + 8 * r;
        rows[r] = i < seq.len_q ? (T *)a.dq + seq.q_off + (int64_t)i * p.q_row_stride + h * p.q_head_stride
                                : nullptr;
    }
    store_acc_rows<T>(dq, rows, col0, p.head_dim);
}

/* The work of one dq CTA: query head h (kv head hk) of sequence b, rows
 * [m0, m0 + kM), and the key tiles [t_first, t_last) of kN keys (aligned to
 * key 0) that its rows see; first, last: the key ranges of its first and
 * last row. Returns false when the CTA has no row. A (sequence, head)'s row
 * blocks are dealt from the last: causal, the longest walks start first and
 * the grid's last wave holds short ones (D256 causal L4k-8k +1-2%, H200). */
struct dq_work {
    fad_seq seq;
    int b, h, hk, m0, t_first, t_last;
    fad_key_range first, last;
};
template <int kM, int kN> __device__ __forceinline__ bool dq_work_of_cta(const bwd_args &a, dq_work *w)
{
    const fad_fwd_params &p = a.p;
    const int m_block = a.m_blocks - 1 - (int)(blockIdx.x % a.m_blocks), bh = blockIdx.x / a.m_blocks;
    w->b = bh / p.num_heads, w->h = bh % p.num_heads;
    w->hk = w->h / (p.num_heads / p.num_heads_k);
    w->seq = fad_get_seq(&p, w->b);
    const int len_q = w->seq.len_q, len_k = w->seq.len_k;
    w->m0 = m_block * kM;
    if (w->m0 >= len_q)
        return false;
    const int m_end = min(w->m0 + kM, len_q);
    w->first = fad_row_keys(w->m0, len_q, len_k, p.window_left, p.window_right);
    w->last = fad_row_keys(m_end - 1, len_q, len_k, p.window_left, p.window_right);
    w->t_first = w->first.lo / kN * kN, w->t_last = min(w->last.hi, len_k);
    return true;
}

/* Rows i0 + 8r (r = 0, 1) of head h: lse in log2 units, D_i and key range. */
__device__ __forceinline__ void dq_row_state(const bwd_args &a, const fad_seq &seq, int h, int i0,
                                             float (&lse2)[2], float (&dsum)[2], fad_key_range (&rk)[2])
{
    const fad_fwd_params &p = a.p;
    const int64_t flat0 = seq.row0 + h * fad_lse_head_stride(&p) + i0;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + 8 * r;
        lse2[r] = lse_log2(p, flat0 + 8 * r, i < seq.len_q);
        dsum[r] = i < seq.len_q ? a.dsum[flat0 + 8 * r] : 0.f;
        rk[r] = fad_row_keys(i, seq.len_q, seq.len_k, p.window_left, p.window_right);
    }
}

/* The dQ prologue's copies: Q and dO rows m0 .. m0 + kM of head h into sQ
 * and sdO (cp.async, issued, not committed; kSw128: the wgmma tile layout). */
template <typename T, int kHeadDim, int kM, int kThreads, bool kSw128 = false>
__device__ __forceinline__ void load_q_do(T *sQ, T *sdO, const bwd_args &a, const fad_seq &seq,
                                          int h, int m0)
{
    const fad_fwd_params &p = a.p;
    const int rows = seq.len_q - m0;
    load_tile<T, kHeadDim, kM, kThreads, kSw128>(
        sQ, (const T *)p.q + seq.q_off + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride,
        (int)p.q_row_stride, rows, p.head_dim);
    load_tile<T, kHeadDim, kM, kThreads, kSw128>(
        sdO, (const T *)a.dout + seq.o_off + (int64_t)m0 * p.out_row_stride + h * p.out_head_stride,
        (int)p.out_row_stride, rows, p.head_dim);
}

/* The work of one dkdv CTA: kv head hk (its group of query heads) of
 * sequence b, keys [n0, n0 + kN), dK/dV columns from col0 (one of
 * col_split slices of col_width columns), and the row tiles [mt_first, mt_first +
 * mt_count) of kM rows that may see those keys. False when it has no key. */
struct dkdv_work {
    fad_seq seq;
    int b, hk, group, n0, col0, mt_first, mt_count;
};
/* Whether the five-product kernel's dQ adds go from the first key block up
 * (GQA: it walks its row tiles from the last down, the heads inner) or from
 * the last down (bwd_dq_accum.cuh's header). */
__host__ __device__ __forceinline__ bool dq_turns_from_first(int num_heads, int num_heads_k)
{
    return num_heads > num_heads_k;
}

/* The work of item `item` of a dK/dV grid. adds_in_order (the five-product
 * kernel, col_split 1): the key blocks of a (sequence, kv head) pair in item
 * order in the order in which their dQ adds land (bwd_dq_accum.cuh: from_first
 * with GQA, dq_turns_from_first, else from the last down), so that the block
 * an item waits for was taken before it. The
 * pairs go in groups of G (FAD_BWD_DQ_SPAN), the group's pairs taking turns
 * block by block: a pair's next block then starts G items later, by which time
 * the one before it has usually added the tiles they share. With one pair at
 * a time (G = 1), a short sequence's blocks start together and queue at
 * every tile (D64 L2k, full: 0.84x the speed of unordered adds;
 * docs/performance.md). */
template <int kN, int kM>
__device__ __forceinline__ bool dkdv_work_of_item(const bwd_args &a, unsigned item, int col_split, int col_width,
                                                  dkdv_work *w, bool adds_in_order, bool from_first)
{
    const fad_fwd_params &p = a.p;
    int n_block, bh;
    if (adds_in_order) {
        const int pairs = p.batch * p.num_heads_k;
        const int g = max(1, min(pairs, (FAD_BWD_DQ_SPAN + a.n_blocks - 1) / a.n_blocks));
        const int64_t per_group = (int64_t)g * a.n_blocks;
        const int group = (int)(item / per_group), r = (int)(item % per_group);
        const int in_group = min(g, pairs - group * g); /* (the last group may be smaller) */
        n_block = from_first ? r / in_group : a.n_blocks - 1 - r / in_group;
        bh = group * g + r % in_group;
        w->col0 = 0;
    } else {
        n_block = item % a.n_blocks;
        bh = item / a.n_blocks / col_split;
        w->col0 = item / a.n_blocks % col_split * col_width;
    }
    w->b = bh / p.num_heads_k, w->hk = bh % p.num_heads_k;
    w->group = p.num_heads / p.num_heads_k;
    w->seq = fad_get_seq(&p, w->b);
    w->n0 = n_block * kN;
    if (w->n0 >= w->seq.len_k)
        return false;
    dkdv_row_tiles<kM, kN>(w->seq.len_q, w->seq.len_k, p.window_left, p.window_right, w->n0,
                           &w->mt_first, &w->mt_count);
    return true;
}
/* The work of CTA blockIdx.x (the grids of one CTA an item). */
template <int kN, int kM>
__device__ __forceinline__ bool dkdv_work_of_cta(const bwd_args &a, int col_split, int col_width,
                                                 dkdv_work *w, bool adds_in_order = false,
                                                 bool from_first = false)
{
    return dkdv_work_of_item<kN, kM>(a, blockIdx.x, col_split, col_width, w, adds_in_order, from_first);
}

#endif /* FAD_BWD_BLOCK_CUH */
