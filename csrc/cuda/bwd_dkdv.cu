/*
 * bwd_dkdv.cu — dK, dV on mma.sync: one CTA per (sequence, kv head, kKeys keys
 * [, column slice]); bwd_dsum.cu's header has the math and the order.
 */
#include "bwd_block.cuh"

/* Shared memory of dkdv_kernel: bwd_cfg's, and with dropout the step's draws
 * after it (dropout.cuh, dropout_group_smem: the CTA's 4 warps own one 64-key
 * group, as a warpgroup of dkdv_wgmma_kernel does). */
template <int kHeadDim, bool kDrop> struct dkdv_smem {
    using C = bwd_cfg<kHeadDim>;
    static constexpr size_t kDropOffset = C::kDkdvSmem;
    static constexpr size_t kBytes = C::kDkdvSmem + (kDrop ? dropout_group_smem<C::kStepM>::kBytes : 0);
    static_assert(C::kThreads == 128 && C::kKeys == 64, "one 64-key group per CTA");
    static_assert(kBytes * C::kMinBlocks <= 227 * 1024, "shared memory");
};

template <typename T, int kHeadDim, bool kMod, bool kDrop = false>
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

    /* (kMod's code makes log2 logits of every score, so its mod must say so:
     * true at run time, since only softcap or ALiBi is sent to kMod, and a
     * compile-time true in kMod's dropout variant, whose code that keeps) */
    const fad_score_mod mod =
        fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL || (kMod && kDrop));
    fad_dropout drop = {}; /* (bwd_dsum.cu's header has the math) */
    if constexpr (kDrop)
        drop = fad_dropout_of(&p, b);
    const dropout_bytes keep(drop);
    uint32_t *s_drop = reinterpret_cast<uint32_t *>(smem_raw + dkdv_smem<kHeadDim, kDrop>::kDropOffset);
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
        const float slope_log2 = fad_alibi_slope_log2(&p, b, h);
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

        /* Dropout: bit nb * 4 + e of kept is element (nb, e) (dropout.cuh): each of
         * the step's draws made once, shared through shared memory (the step's
         * barrier above ends the reads of the last step's). */
        dropout_kept_t<kMB> kept = ~dropout_kept_t<kMB>(0);
        if constexpr (kDrop) {
            dropout_draw_group<kM>(s_drop, drop, keep, h, n0, m0, len_k - len_q, tid);
            __syncthreads();
            kept = dropout_kept_staged<kMB, kM>(s_drop, key_row);
        }

        /* dV += P^T dO (with dropout: rp P^T where kept, 0 where dropped): P^T from
         * the accumulators as A fragments. */
#pragma unroll
        for (int kk = 0; kk < kM / 16; kk++) {
            uint32_t pf[4];
            if constexpr (kDrop) {
                float pv[2][4];
#pragma unroll
                for (int n = 0; n < 2; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        pv[n][e] = kept >> ((2 * kk + n) * 4 + e) & 1u
                                       ? FAD_MUL(pt[2 * kk + n][e], drop.rp) : 0.f;
                p_fragment<T>(pv, 0, pf);
            } else {
                p_fragment<T>(pt, kk, pf);
            }
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
                float dp = ds[nb][e];
                if constexpr (kDrop) /* dropout: dP of a kept element times rp, of a dropped one 0 */
                    dp = kept >> (nb * 4 + e) & 1u ? FAD_MUL(dp, drop.rp) : 0.f;
                ds[nb][e] = fad_ds(pt[nb][e], dp, dsum[i_loc], g);
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

template <typename T, int kHeadDim, bool kMod>
fad_status launch_dkdv(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len)
{
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES];
    void (*kernel)(bwd_args) = dkdv_kernel<T, kHeadDim, kMod>;
    int *set = smem_set;
    if (a.p.dropout_p > 0.f) /* dropout: its own variant, with or without a score mod */
        kernel = dkdv_kernel<T, kHeadDim, kMod, true>, set = smem_set_drop;
    const size_t smem = a.p.dropout_p > 0.f ? dkdv_smem<kHeadDim, true>::kBytes : dkdv_smem<kHeadDim, false>::kBytes;
    fad_status st = allow_smem(kernel, set, smem, msg, msg_len);
    if (st != FAD_OK)
        return st;
    kernel<<<(unsigned)ctas, bwd_cfg<kHeadDim>::kThreads, smem, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

#define FAD_INST(T, D, MOD) \
    template fad_status launch_dkdv<T, D, MOD>(const bwd_args &, int64_t, cudaStream_t, char *, size_t);
FAD_BWD_VARIANTS(FAD_INST)
