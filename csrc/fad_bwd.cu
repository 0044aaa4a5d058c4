/*
 * fad_bwd.cu — the backward pass on the GPU: three kernels, no atomics, every
 * accumulation order fixed by positions inside the sequence.
 *
 * Shapes (flash_attn layout, strides from fad_fwd_params; dout/dq/dk/dv share
 * the strides of out/q/k/v; fad_seq.h says where sequence b lives):
 *   padded: q, out, dout, dq (B, Sq, Hq, D)    k, v, dk, dv (B, Sk, Hkv, D)
 *   varlen: q, out, dout, dq (total_q, Hq, D)  k, v, dk, dv (total_k, Hkv, D)
 *   softmax_lse and dsum (the workspace): fp32, one value per flat row (fad_seq.h)
 *
 * For query row i and key j of one (sequence, head), in log2 units:
 *   p_ij  = exp2(s_ij - lse_i * log2 e)        s_ij the forward's logit
 *   D_i   = dout_i . out_i                      (dsum_kernel)
 *   dp_ij = dout_i . v_j,  ds_ij = p_ij (dp_ij - D_i) d(score)/d(q.k)
 *   dv_j += p_ij dout_i,   dk_j += ds_ij q_i    (dkdv_kernel: M = keys)
 *   dq_i += ds_ij k_j                           (dq_kernel:   M = queries)
 *
 * Determinism and batch invariance: dK/dV of a key tile are summed by one CTA
 * in registers, over the group's query heads in increasing order, then query
 * tiles (aligned to the sequence's row 0) in increasing order, then the 16
 * rows of each MMA k-step in the tensor core's fixed order. dQ of a row tile is
 * summed by one CTA over key tiles (aligned to key 0) in increasing order. So
 * nothing depends on the batch, the grid or the SM count, and no atomics are
 * needed: the price is that S and dP are computed twice (once per kernel),
 * 7 matmuls per tile pair instead of FA2's 5 (above D=128, where dkdv_kernel
 * splits dK/dV into two column slices, 9).
 *
 * Tensor cores: mma.sync.m16n8k16, operands from XOR-swizzled shared memory
 * via ldmatrix (.trans where the contraction runs over the tile's rows), P and
 * dS fed from the accumulators straight back as A operands. On sm_90 (from an
 * sm_90a build) D <= 128 without softcap/ALiBi runs the wgmma variants of the
 * two matmul kernels instead (fad_bwd_wgmma.cuh): the same chains, the same
 * bits, 1.7-1.8x faster on the H100 (benchmarks/NOTES.md, "Backward v2").
 */
#include "fad_mma.cuh"
#include "fad_seq.h"

struct bwd_args {
    fad_fwd_params p;  /* the forward's tensors and options (resolved) */
    const void *dout;  /* like out */
    void *dq, *dk, *dv; /* like q, k, v */
    float *dsum;       /* one fp32 per flat row: D_i */
    int n_blocks;      /* key tiles per (sequence, kv head) in dkdv_kernel's grid */
    int m_blocks;      /* row tiles per (sequence, head) in dq_kernel's grid */
};

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

/* ------------------------------------------------------------------------ */
/* D_i = dout_i . out_i: one warp per row, a fixed-order reduction             */
/* ------------------------------------------------------------------------ */

template <typename T>
__global__ void __launch_bounds__(128) dsum_kernel(const __grid_constant__ bwd_args a)
{
    const fad_fwd_params &p = a.p;
    const int lane = threadIdx.x % 32, D = p.head_dim;
    const int q_blocks = (p.seqlen_q + 3) / 4; /* blocks of 4 rows per (batch, head) */
    const int bh = blockIdx.x / q_blocks, b = bh / p.num_heads, h = bh % p.num_heads;
    const int i = (blockIdx.x % q_blocks) * 4 + threadIdx.x / 32;
    const fad_seq seq = fad_get_seq(&p, b);
    if (i >= seq.len_q)
        return;
    const int64_t at = seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride;
    const T *o = (const T *)p.out + at, *g = (const T *)a.dout + at;
    float s = 0.f;
    for (int c = lane * 8; c < D; c += 256) { /* 16-byte chunks, 8 elements each */
        const uint4 ov = *reinterpret_cast<const uint4 *>(o + c);
        const uint4 gv = *reinterpret_cast<const uint4 *>(g + c);
        const T *oe = reinterpret_cast<const T *>(&ov), *ge = reinterpret_cast<const T *>(&gv);
#pragma unroll
        for (int e = 0; e < 8; e++)
            s = FAD_FMA((float)oe[e], (float)ge[e], s);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2)
        s = FAD_ADD(s, __shfl_xor_sync(0xffffffffu, s, off));
    if (lane == 0)
        a.dsum[seq.row0 + h * fad_lse_head_stride(&p) + i] = s;
}

/* ------------------------------------------------------------------------ */
/* dK, dV: one CTA per (sequence, kv head, kKeys keys)                         */
/* ------------------------------------------------------------------------ */

/* First row i in [0, len_q) with pred(i), for a predicate monotone in i
 * (false...false true...true); len_q when none. */
template <typename Pred> __device__ __forceinline__ int first_row(int len_q, Pred pred)
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
__device__ __forceinline__ void dkdv_row_tiles(int len_q, int len_k, int wl, int wr, int n0,
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

/* dQ rows i0 + 8r (r = 0, 1) of this thread, those below len_q. */
template <typename T, int kDB>
__device__ __forceinline__ void store_dq(const float (&dq)[kDB][4], const bwd_args &a,
                                         const fad_seq &seq, int h, int i0)
{
    const fad_fwd_params &p = a.p;
    T *rows[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = i0 + 8 * r;
        rows[r] = i < seq.len_q ? (T *)a.dq + seq.q_off + (int64_t)i * p.q_row_stride + h * p.q_head_stride
                                : nullptr;
    }
    store_acc_rows<T>(dq, rows, 0, p.head_dim);
}

/* The work of one dq CTA: query head h (kv head hk) of sequence b, rows
 * [m0, m0 + kM), and the key tiles [t_first, t_last) of kN keys (aligned to
 * key 0) that its rows see; first, last: the key ranges of its first and
 * last row. Returns false when the CTA has no row. */
struct dq_work {
    fad_seq seq;
    int b, h, hk, m0, t_first, t_last;
    fad_key_range first, last;
};
template <int kM, int kN> __device__ __forceinline__ bool dq_work_of_cta(const bwd_args &a, dq_work *w)
{
    const fad_fwd_params &p = a.p;
    const int m_block = blockIdx.x % a.m_blocks, bh = blockIdx.x / a.m_blocks;
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
template <int kN, int kM>
__device__ __forceinline__ bool dkdv_work_of_cta(const bwd_args &a, int col_split, int col_width,
                                                 dkdv_work *w)
{
    const fad_fwd_params &p = a.p;
    const int n_block = blockIdx.x % a.n_blocks, bh = blockIdx.x / a.n_blocks / col_split;
    w->col0 = blockIdx.x / a.n_blocks % col_split * col_width;
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

template <typename T, int kHeadDim, bool kMod>
__global__ void __launch_bounds__(bwd_cfg<kHeadDim>::kThreads, bwd_cfg<kHeadDim>::kMinBlocks)
dkdv_kernel(const __grid_constant__ bwd_args a)
{
    using C = bwd_cfg<kHeadDim>;
    using ops = dtype_ops<T>;
    constexpr int kN = C::kKeys, kM = C::kStepM, kDB = C::kDCols / 8, kMB = kM / 8;
    const fad_fwd_params &p = a.p;
    /* grid: (column slice, kv head, sequence) outside key tiles */
    dkdv_work w;
    if (!dkdv_work_of_cta<kN, kM>(a, C::kColSplit, C::kDCols, &w))
        return;
    const fad_seq &seq = w.seq;
    const int b = w.b, hk = w.hk, group = w.group, n0 = w.n0, col0 = w.col0;
    const int mt_first = w.mt_first, mt_count = w.mt_count;
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int wl = p.window_left, wr = p.window_right, D = p.head_dim;
    const int steps = group * mt_count; /* step = (group head g, row tile): g outer */

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sK = reinterpret_cast<T *>(smem_raw), *sV = sK + kN * kHeadDim;
    T *sQ = sV + kN * kHeadDim; /* stage st: + st * kStepElems; sdO follows sQ */
    float *sL = reinterpret_cast<float *>(sQ + 2 * C::kStepElems); /* [stage][kM] lse2, then dsum */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const T *q_g = (const T *)p.q + seq.q_off, *do_g = (const T *)a.dout + seq.o_off;
    const int64_t lse_hs = fad_lse_head_stride(&p);

    auto load_step = [&](int step, int st) {
        const int h = hk * group + step / mt_count, m0 = (mt_first + step % mt_count) * kM;
        T *q_s = sQ + st * C::kStepElems;
        load_tile<T, kHeadDim, kM, C::kThreads>(
            q_s, q_g + (int64_t)m0 * p.q_row_stride + h * p.q_head_stride, (int)p.q_row_stride,
            len_q - m0, D);
        load_tile<T, kHeadDim, kM, C::kThreads>(
            q_s + kM * kHeadDim, do_g + (int64_t)m0 * p.out_row_stride + h * p.out_head_stride,
            (int)p.out_row_stride, len_q - m0, D);
        for (int t = tid; t < kM; t += C::kThreads) {
            const int64_t flat = seq.row0 + h * lse_hs + m0 + t;
            const bool exists = m0 + t < len_q;
            sL[st * 2 * kM + t] = lse_log2(p, flat, exists);
            sL[st * 2 * kM + kM + t] = exists ? a.dsum[flat] : 0.f;
        }
    };

    /* Prologue: K, V and the first step's tiles in flight. */
    load_tile<T, kHeadDim, kN, C::kThreads>(sK, (const T *)p.k + seq.k_off + (int64_t)n0 * p.k_row_stride +
                                                    hk * p.k_head_stride,
                                            (int)p.k_row_stride, len_k - n0, D);
    load_tile<T, kHeadDim, kN, C::kThreads>(sV, (const T *)p.v + seq.v_off + (int64_t)n0 * p.v_row_stride +
                                                    hk * p.v_head_stride,
                                            (int)p.v_row_stride, len_k - n0, D);
    if (steps > 0)
        load_step(0, 0);
    cp_async_commit();

    /* ldmatrix bases (see fwd): A operands (K, V rows of this warp) read
     * chunk 2kk + lane/16 of row lane % 16; non-transposed B operands (Q, dO
     * rows = the n dim) chunk 2kk + (lane/8) % 2 of row lane % 8 + 8 (lane/16);
     * transposed B operands (Q, dO rows = the k dim) chunk 2j + lane/16 of row
     * lane % 8 + 8 ((lane/8) % 2). */
    const lds_base<kHeadDim> k_a(sK, warp * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> v_a(sV, warp * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> q_b0(sQ, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> do_b0(sQ + kM * kHeadDim, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> q_t0(sQ, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
    const lds_base<kHeadDim> do_t0(sQ + kM * kHeadDim, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);

    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL);
    /* This thread's keys: n0 + key_row + 8r, r = e / 2. */
    const int key_row = warp * 16 + lane / 4;
    float dk[kDB][4] = {}, dv[kDB][4] = {};

    for (int step = 0, st = 0; step < steps; step++, st ^= 1) {
        cp_async_wait_all();
        __syncthreads(); /* step's tiles landed; every warp is done with the other stage */
        if (step + 1 < steps)
            load_step(step + 1, st ^ 1);
        cp_async_commit();

        const int h = hk * group + step / mt_count, m0 = (mt_first + step % mt_count) * kM;
        const float slope_log2 =
            p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] * FAD_LOG2E : 0.f;
        const uint32_t stage_bytes = st * C::kStepElems * 2;
        const lds_base<kHeadDim> q_b = q_b0.reload(stage_bytes), do_b = do_b0.reload(stage_bytes);
        /* (a whole number of 64-column swizzle groups: the slice just shifts the bases) */
        const lds_base<kHeadDim> q_t = q_t0.reload(stage_bytes + col0 * 2);
        const lds_base<kHeadDim> do_t = do_t0.reload(stage_bytes + col0 * 2);
        const float *lse2 = sL + st * 2 * kM, *dsum = lse2 + kM;

        /* S^T = K Q^T: this warp's 16 keys x kM rows. */
        float pt[kMB][4] = {};
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; kk++) {
            uint32_t af[4];
            ldmatrix_x4(af, k_a.at(0, kk));
#pragma unroll
            for (int j = 0; j < kM / 16; j++) {
                uint32_t bf[4];
                ldmatrix_x4(bf, q_b.at(j * 16, kk));
                ops::mma(pt[2 * j], af, bf[0], bf[1]);
                ops::mma(pt[2 * j + 1], af, bf[2], bf[3]);
            }
        }
        /* P^T: element (nb, e) is key n0 + key_row + 8 (e/2), row m0 + 8 nb + 2 (lane%4) + e%2. */
        const fad_key_range first = fad_row_keys(m0, len_q, len_k, wl, wr);
        const fad_key_range last = fad_row_keys(min(m0 + kM, len_q) - 1, len_q, len_k, wl, wr);
        const bool need_mask = n0 < last.lo || n0 + kN > first.hi;
        float grad[kMod ? kMB : 1][4];
#pragma unroll
        for (int nb = 0; nb < kMB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2, i = m0 + i_loc;
                const int j = n0 + key_row + 8 * (e / 2);
                bool masked = false;
                if (need_mask) {
                    const fad_key_range r = fad_row_keys(i, len_q, len_k, wl, wr);
                    masked = j < r.lo || j >= r.hi;
                }
                float g;
                const float x = bwd_score<kMod>(pt[nb][e], mod, p.softmax_scale, slope_log2, i, j,
                                                len_q, len_k, masked, &g);
                grad[kMod ? nb : 0][e] = g;
                pt[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[i_loc]);
            }

        /* dV += P^T dO: P^T from the accumulators as A fragments. */
#pragma unroll
        for (int kk = 0; kk < kM / 16; kk++) {
            uint32_t pf[4];
            p_fragment<T>(pt, kk, pf);
#pragma unroll
            for (int j = 0; j < C::kDCols / 16; j++) {
                uint32_t bf[4];
                ldmatrix_x4_trans(bf, do_t.at(kk * 16, j));
                ops::mma(dv[2 * j], pf, bf[0], bf[1]);
                ops::mma(dv[2 * j + 1], pf, bf[2], bf[3]);
            }
        }

        /* dP^T = V dO^T, then dS^T = P^T (dP^T - D) grad in place. */
        float ds[kMB][4] = {};
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; kk++) {
            uint32_t af[4];
            ldmatrix_x4(af, v_a.at(0, kk));
#pragma unroll
            for (int j = 0; j < kM / 16; j++) {
                uint32_t bf[4];
                ldmatrix_x4(bf, do_b.at(j * 16, kk));
                ops::mma(ds[2 * j], af, bf[0], bf[1]);
                ops::mma(ds[2 * j + 1], af, bf[2], bf[3]);
            }
        }
#pragma unroll
        for (int nb = 0; nb < kMB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2;
                const float g = kMod ? grad[kMod ? nb : 0][e] : p.softmax_scale;
                ds[nb][e] = FAD_MUL(FAD_MUL(pt[nb][e], FAD_ADD(ds[nb][e], -dsum[i_loc])), g);
            }

        /* dK += dS^T Q. */
#pragma unroll
        for (int kk = 0; kk < kM / 16; kk++) {
            uint32_t sf[4];
            p_fragment<T>(ds, kk, sf);
#pragma unroll
            for (int j = 0; j < C::kDCols / 16; j++) {
                uint32_t bf[4];
                ldmatrix_x4_trans(bf, q_t.at(kk * 16, j));
                ops::mma(dk[2 * j], sf, bf[0], bf[1]);
                ops::mma(dk[2 * j + 1], sf, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait_all();

    store_dkdv<T>(dk, dv, a, seq, hk, n0 + key_row, col0);
}

/* ------------------------------------------------------------------------ */
/* dQ: one CTA per (sequence, query head, kRows rows)                           */
/* ------------------------------------------------------------------------ */

template <typename T, int kHeadDim, bool kMod>
__global__ void __launch_bounds__(bwd_cfg<kHeadDim>::kThreads, bwd_cfg<kHeadDim>::kMinBlocks)
dq_kernel(const __grid_constant__ bwd_args a)
{
    using C = bwd_cfg<kHeadDim>;
    using ops = dtype_ops<T>;
    constexpr int kM = C::kRows, kN = C::kTileN, kDB = C::kDBlocks, kNB = kN / 8;
    const fad_fwd_params &p = a.p;
    dq_work w;
    if (!dq_work_of_cta<kM, kN>(a, &w))
        return;
    const fad_seq &seq = w.seq;
    const int b = w.b, h = w.h, hk = w.hk, m0 = w.m0, t_first = w.t_first, t_last = w.t_last;
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int D = p.head_dim;

    extern __shared__ __align__(128) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw), *sdO = sQ + kM * kHeadDim;
    T *sK = sdO + kM * kHeadDim, *sV = sK + kN * kHeadDim; /* stage st: + st * kKvElems */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;
    auto load_kv = [&](int t0, int st) {
        load_tile<T, kHeadDim, kN, C::kThreads>(sK + st * C::kKvElems, k_g + (int64_t)t0 * p.k_row_stride,
                                                (int)p.k_row_stride, len_k - t0, D);
        load_tile<T, kHeadDim, kN, C::kThreads>(sV + st * C::kKvElems, v_g + (int64_t)t0 * p.v_row_stride,
                                                (int)p.v_row_stride, len_k - t0, D);
    };
    load_q_do<T, kHeadDim, kM, C::kThreads>(sQ, sdO, a, seq, h, m0);
    if (t_first < t_last)
        load_kv(t_first, 0);
    cp_async_commit();

    /* This thread's rows: m0 + row0 + 8r. */
    const int row0 = warp * 16 + lane / 4;
    float lse2[2], dsum[2];
    fad_key_range rk[2];
    dq_row_state(a, seq, h, m0 + row0, lse2, dsum, rk);
    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL);
    const float slope_log2 =
        p.alibi_slopes ? p.alibi_slopes[b * p.alibi_batch_stride + h] * FAD_LOG2E : 0.f;

    const lds_base<kHeadDim> q_a(sQ, warp * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> do_a(sdO, warp * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> k_b0(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> v_b0(sV, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> k_t0(sK, lane % 8 + ((lane / 8) % 2) * 8, lane / 16);
    float dq[kDB][4] = {};

    for (int t0 = t_first, st = 0; t0 < t_last; t0 += kN, st ^= 1) {
        cp_async_wait_all();
        __syncthreads();
        if (t0 + kN < t_last)
            load_kv(t0 + kN, st ^ 1);
        cp_async_commit();
        const uint32_t stage_bytes = st * C::kKvElems * 2;
        const lds_base<kHeadDim> k_b = k_b0.reload(stage_bytes), v_b = v_b0.reload(stage_bytes);
        const lds_base<kHeadDim> k_t = k_t0.reload(stage_bytes);

        /* S = Q K^T and dP = dO V^T: this warp's 16 rows x kN keys. */
        float pr[kNB][4] = {}, ds[kNB][4] = {};
#pragma unroll
        for (int kk = 0; kk < kHeadDim / 16; kk++) {
            uint32_t qf[4], dof[4];
            ldmatrix_x4(qf, q_a.at(0, kk));
            ldmatrix_x4(dof, do_a.at(0, kk));
#pragma unroll
            for (int j = 0; j < kN / 16; j++) {
                uint32_t kf[4], vf[4];
                ldmatrix_x4(kf, k_b.at(j * 16, kk));
                ops::mma(pr[2 * j], qf, kf[0], kf[1]);
                ops::mma(pr[2 * j + 1], qf, kf[2], kf[3]);
                ldmatrix_x4(vf, v_b.at(j * 16, kk));
                ops::mma(ds[2 * j], dof, vf[0], vf[1]);
                ops::mma(ds[2 * j + 1], dof, vf[2], vf[3]);
            }
        }
        /* P and dS: element (nb, e) is row m0 + row0 + 8 (e/2), key t0 + 8 nb + 2 (lane%4) + e%2. */
        const bool need_mask = t0 < w.last.lo || t0 + kN > w.first.hi;
#pragma unroll
        for (int nb = 0; nb < kNB; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e / 2, i = m0 + row0 + 8 * r, j = t0 + nb * 8 + (lane % 4) * 2 + e % 2;
                const bool masked = need_mask && (j < rk[r].lo || j >= rk[r].hi);
                float g;
                const float x = bwd_score<kMod>(pr[nb][e], mod, p.softmax_scale, slope_log2, i, j,
                                                len_q, len_k, masked, &g);
                const float pij = fad_exp_score(x, mod.exp_scale, lse2[r]);
                ds[nb][e] = FAD_MUL(FAD_MUL(pij, FAD_ADD(ds[nb][e], -dsum[r])), g);
            }

        /* dQ += dS K. */
#pragma unroll
        for (int kk = 0; kk < kN / 16; kk++) {
            uint32_t sf[4];
            p_fragment<T>(ds, kk, sf);
#pragma unroll
            for (int j = 0; j < kHeadDim / 16; j++) {
                uint32_t bf[4];
                ldmatrix_x4_trans(bf, k_t.at(kk * 16, j));
                ops::mma(dq[2 * j], sf, bf[0], bf[1]);
                ops::mma(dq[2 * j + 1], sf, bf[2], bf[3]);
            }
        }
    }
    cp_async_wait_all();

    store_dq<T>(dq, a, seq, h, m0 + row0);
}

#include "fad_bwd_wgmma.cuh" /* the sm_90a variants of dkdv_kernel and dq_kernel */

/* ------------------------------------------------------------------------ */
/* host side: the one dispatch point                                          */
/* ------------------------------------------------------------------------ */

/* The sm_90a variants (fad_bwd_wgmma.cuh): D 64 and 128 without a score mod,
 * where fad_use_wgmma allows them; the same bits as the mma.sync kernels, so
 * which one runs may depend on anything, the grid size included. Their CTAs
 * are twice as large (128 keys for dK/dV), so on a grid of fewer dK/dV CTAs
 * than SMs the mma.sync kernels run instead (measured: a B8 L256 training
 * step, benchmarks/NOTES.md, "Backward v2"), unless forced. */
template <typename T, int kHeadDim, bool kMod>
static fad_status launch_bwd_wgmma(bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    if constexpr (kHeadDim <= 128 && !kMod) {
        using C = bwd_wg_cfg<kHeadDim>;
        static int dkdv_set[FAD_MAX_DEVICES], dq_set[FAD_MAX_DEVICES];
        fad_status st = allow_smem(dkdv_wgmma_kernel<T, kHeadDim>, dkdv_set, C::kDkdvSmem, msg, msg_len);
        if (st == FAD_OK)
            st = allow_smem(dq_wgmma_kernel<T, kHeadDim>, dq_set, C::kDqSmem, msg, msg_len);
        if (st != FAD_OK)
            return st;
        const fad_fwd_params &p = a.p;
        a.n_blocks = (p.seqlen_k + C::kKeys - 1) / C::kKeys;
        a.m_blocks = (p.seqlen_q + C::kRows - 1) / C::kRows;
        const int64_t dkdv_ctas = (int64_t)a.n_blocks * p.batch * p.num_heads_k;
        const int64_t dq_ctas = (int64_t)a.m_blocks * p.batch * p.num_heads;
        if (dkdv_ctas > 0) {
            dkdv_wgmma_kernel<T, kHeadDim><<<(unsigned)dkdv_ctas, C::kDkdvThreads, C::kDkdvSmem, stream>>>(a);
            CUDA_TRY(cudaGetLastError());
        }
        if (dq_ctas > 0) {
            dq_wgmma_kernel<T, kHeadDim><<<(unsigned)dq_ctas, C::kDqThreads, C::kDqSmem, stream>>>(a);
            CUDA_TRY(cudaGetLastError());
        }
        return FAD_OK;
    } else {
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma backward for D %d", kHeadDim);
    }
}

template <typename T, int kHeadDim, bool kMod>
static fad_status launch_bwd(bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = bwd_cfg<kHeadDim>;
    static int dkdv_set[FAD_MAX_DEVICES], dq_set[FAD_MAX_DEVICES];
    fad_status st = allow_smem(dkdv_kernel<T, kHeadDim, kMod>, dkdv_set, C::kDkdvSmem, msg, msg_len);
    if (st == FAD_OK)
        st = allow_smem(dq_kernel<T, kHeadDim, kMod>, dq_set, C::kDqSmem, msg, msg_len);
    int wgmma = 0;
    if (st == FAD_OK && kHeadDim <= 128 && !kMod)
        st = fad_use_wgmma(&wgmma, msg, msg_len);
    const fad_fwd_params &p = a.p;
    if constexpr (kHeadDim <= 128 && !kMod) {
        int sms = 0;
        if (st == FAD_OK && wgmma == 1)
            st = fad_cuda_num_sms(&sms, msg, msg_len);
        const int64_t ctas = (int64_t)((p.seqlen_k + bwd_wg_cfg<kHeadDim>::kKeys - 1) /
                                       bwd_wg_cfg<kHeadDim>::kKeys) * p.batch * p.num_heads_k;
        if (wgmma == 1 && ctas < sms)
            wgmma = 0;
    }
    if (st != FAD_OK)
        return st;
    const int64_t rows4 = (int64_t)(p.seqlen_q + 3) / 4 * p.batch * p.num_heads;
    dsum_kernel<T><<<(unsigned)rows4, 128, 0, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    if (wgmma)
        return launch_bwd_wgmma<T, kHeadDim, kMod>(a, stream, msg, msg_len);
    a.n_blocks = (p.seqlen_k + C::kKeys - 1) / C::kKeys;
    a.m_blocks = (p.seqlen_q + C::kRows - 1) / C::kRows;
    const int64_t dkdv_ctas = (int64_t)a.n_blocks * C::kColSplit * p.batch * p.num_heads_k;
    const int64_t dq_ctas = (int64_t)a.m_blocks * p.batch * p.num_heads;
    if (dkdv_ctas > 0) {
        dkdv_kernel<T, kHeadDim, kMod><<<(unsigned)dkdv_ctas, C::kThreads, C::kDkdvSmem, stream>>>(a);
        CUDA_TRY(cudaGetLastError());
    }
    dq_kernel<T, kHeadDim, kMod><<<(unsigned)dq_ctas, C::kThreads, C::kDqSmem, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

template <typename T, bool kMod>
static fad_status bwd_dispatch_head_dim(bwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (a.p.head_dim <= 64)
        return launch_bwd<T, 64, kMod>(a, s, msg, msg_len);
    if (a.p.head_dim <= 128)
        return launch_bwd<T, 128, kMod>(a, s, msg, msg_len);
    return launch_bwd<T, 256, kMod>(a, s, msg, msg_len);
}

/* The one place the backward picks its compile-time variant: dtype x head
 * dim x whether scores carry a mod (softcap/ALiBi). */
extern "C" fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, float *dsum,
                                          struct CUstream_st *stream, char *msg, size_t msg_len)
{
    bwd_args a;
    a.p = bp->fwd;
    a.dout = bp->dout, a.dq = bp->dq, a.dk = bp->dk, a.dv = bp->dv;
    a.dsum = dsum;
    a.n_blocks = a.m_blocks = 0;
    const bool mod = a.p.softcap > 0.f || a.p.alibi_slopes;
    if (a.p.dtype == FAD_BFLOAT16)
        return mod ? bwd_dispatch_head_dim<__nv_bfloat16, true>(a, stream, msg, msg_len)
                   : bwd_dispatch_head_dim<__nv_bfloat16, false>(a, stream, msg, msg_len);
    return mod ? bwd_dispatch_head_dim<__half, true>(a, stream, msg, msg_len)
               : bwd_dispatch_head_dim<__half, false>(a, stream, msg, msg_len);
}
