/*
 * bwd_dq.cu — dQ on mma.sync: one CTA per (sequence, query head, kRows rows);
 * bwd_dsum.cu's header has the math and the order.
 */
#include "bwd_block.cuh"

template <typename T, int kHeadDim, bool kMod, bool kDrop = false>
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
    /* (kMod's code makes log2 logits of every score: bwd_dkdv.cu says why the
     * flag reads so) */
    const fad_score_mod mod =
        fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL || (kMod && kDrop));
    const float slope_log2 = fad_alibi_slope_log2(&p, b, h);
    fad_dropout drop = {}; /* (bwd_dsum.cu's header has the math) */
    if constexpr (kDrop)
        drop = fad_dropout_of(&p, b);

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
        /* Dropout: dP of a kept element times rp, of a dropped one 0. */
        if constexpr (kDrop) {
            const int i_pos[2] = {m0 + row0 + len_k - len_q, m0 + row0 + 8 + len_k - len_q};
            dropout_walk<2, kNB>(drop, h, i_pos, t0, [&](int r, int nb, int e, bool kept) {
                float &x = ds[nb][2 * r + e];
                x = kept ? FAD_MUL(x, drop.rp) : 0.f;
            });
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
                ds[nb][e] = fad_ds(pij, ds[nb][e], dsum[r], g);
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

template <typename T, int kHeadDim, bool kMod>
fad_status launch_dq(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len)
{
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES];
    void (*kernel)(bwd_args) = dq_kernel<T, kHeadDim, kMod>;
    int *set = smem_set;
    if (a.p.dropout_p > 0.f) /* dropout: its own variant, with or without a score mod */
        kernel = dq_kernel<T, kHeadDim, kMod, true>, set = smem_set_drop;
    fad_status st = allow_smem(kernel, set, bwd_cfg<kHeadDim>::kDqSmem, msg, msg_len);
    if (st != FAD_OK)
        return st;
    kernel<<<(unsigned)ctas, bwd_cfg<kHeadDim>::kThreads, bwd_cfg<kHeadDim>::kDqSmem, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

#define FAD_INST(T, D, MOD) \
    template fad_status launch_dq<T, D, MOD>(const bwd_args &, int64_t, cudaStream_t, char *, size_t);
FAD_BWD_VARIANTS(FAD_INST)
