/*
 * bwd_dq_post.cu — the five-product backward's last kernel: dQ from its fp32
 * accumulator (bwd_dq_accum.cuh), which the dK/dV kernel summed in key-block
 * order, rounded to the dtype (the rounding the dQ kernel's store applies,
 * store_acc_rows). dS already carries the softmax scale (fad_ds), so nothing
 * is scaled here. One CTA a tile; rows past the sequence and columns past the
 * head dim are not stored. A tile that no key block added to holds whatever
 * the workspace held (the first add copies, bwd_dq_accum.cuh): its dQ is 0.
 */
#include "bwd_dq_accum.cuh"

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(256) dq_post_kernel(const bwd_args a)
{
    using Acc = dq_accum_cfg<kHeadDim>;
    const fad_fwd_params &p = a.p;
    /* (the grid: batch x heads x the longest sequence's row tiles) */
    const int m = (int)(blockIdx.x % a.dq_m_tiles), bh = (int)(blockIdx.x / a.dq_m_tiles);
    const int b = bh / p.num_heads, h = bh % p.num_heads;
    const fad_seq seq = fad_get_seq(&p, b);
    const int m0 = m * Acc::kRows;
    if (m0 >= seq.len_q) /* (an invalid sequence has none) */
        return;
    const int64_t tile = dq_tile(a, b, seq, h, m, Acc::kRows);
    const float4 *src = reinterpret_cast<const float4 *>(a.dq_accum + tile * Acc::kTileFloats);
    /* a tile no key block added to (its semaphore still 0: its rows see no
     * key) was never written: its dQ is zero */
    const bool added = a.dq_sems[tile] != 0;
    T *dq = (T *)a.dq + seq.q_off + h * p.q_head_stride;
    /* Element i of the walk is the float4 of part w, n8 block nb, thread t of the
     * dK/dV kernel's math warpgroup, taken so that a warp's 32 consecutive i
     * are one row pair's 64 columns (nb, t % 4): its stores are two 128-byte
     * rows, its loads 8 runs of 64 bytes. */
    for (int i = threadIdx.x; i < Acc::kTileFloats / 4; i += blockDim.x) {
        const int w = i / 1024, t = (i / 32 % 32) * 4 + i % 4, nb = i / 4 % 8;
        const int col = Acc::col_of(w, nb, t);
        const int row = m0 + Acc::row_of(w, t);
        if (col >= p.head_dim)
            continue;
        const float4 v = added ? src[Acc::slot(w, nb, t)] : make_float4(0.f, 0.f, 0.f, 0.f);
        if (row < seq.len_q)
            *reinterpret_cast<uint32_t *>(dq + (int64_t)row * p.q_row_stride + col) = dtype_ops<T>::pack(v.x, v.y);
        if (row + 8 < seq.len_q)
            *reinterpret_cast<uint32_t *>(dq + (int64_t)(row + 8) * p.q_row_stride + col) = dtype_ops<T>::pack(v.z, v.w);
    }
}

template <typename T, int kHeadDim>
fad_status launch_dq_post(const bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    if constexpr (kHeadDim > 128) {
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no dQ accumulator at D %d", kHeadDim);
    } else {
        static_assert(dq_accum_cfg<kHeadDim>::kTileFloats / 4 == 2 * 1024, "slot f: two parts of 8 x 128 float4");
        const int64_t tiles = (int64_t)a.p.batch * a.p.num_heads * a.dq_m_tiles;
        if (tiles <= 0)
            return FAD_OK;
        dq_post_kernel<T, kHeadDim><<<(unsigned)tiles, 256, 0, stream>>>(a);
        CUDA_TRY(cudaGetLastError());
        return FAD_OK;
    }
}

#define FAD_INST(T, D) template fad_status launch_dq_post<T, D>(const bwd_args &, cudaStream_t, char *, size_t);
FAD_BWD_WGMMA_VARIANTS(FAD_INST)
