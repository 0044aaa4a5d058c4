/*
 * bwd_dsum.cu — the backward's first kernel, D_i = dout_i . out_i. The header
 * of the whole backward: three kernels, no atomics, every accumulation order
 * fixed by positions inside the sequence.
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
 * two matmul kernels instead (bwd_dkdv_wgmma.cu, bwd_dq_wgmma.cu): the same chains, the same
 * bits, 1.7-1.8x faster on the H100 (docs/design.md, "wgmma-bits").
 */
#include "bwd_block.cuh"

/* ------------------------------------------------------------------------ */
/* D_i = dout_i . out_i: a fixed-order reduction per row                        */
/* ------------------------------------------------------------------------ */

/* The CTA's rows: kDsumRows consecutive query rows of one (sequence, head). */
constexpr int kDsumRows = 64, kDsumWarps = 8;

/* Row i's sum is taken by a group of kL lanes, lane l of it holding the 16-byte
 * chunk of 8 elements at column 8 l (kL: 8, 16 or 32, the first that covers the
 * head dim's chunks; none where 8 l >= D), so a warp sums 32 / kL rows at once and
 * a CTA kDsumRows, its loads issued before any sum. The order: each lane's FMA
 * chain over its chunk, then, with kL < 32, a + 0 (the first steps of a
 * 32-lane xor tree whose other lanes hold +0: the kernel's bits before it
 * took one warp per row; only -0 changes), then the xor tree over the group. */
template <typename T, int kL>
__global__ void __launch_bounds__(kDsumWarps * 32) dsum_kernel(const __grid_constant__ bwd_args a)
{
    constexpr int kGroups = kDsumWarps * 32 / kL;   /* rows a pass */
    constexpr int kPasses = kDsumRows / kGroups;
    const fad_fwd_params &p = a.p;
    const int lane = threadIdx.x % 32, D = p.head_dim;
    const int q_blocks = (p.seqlen_q + kDsumRows - 1) / kDsumRows;
    const int bh = blockIdx.x / q_blocks, b = bh / p.num_heads, h = bh % p.num_heads;
    const fad_seq seq = fad_get_seq(&p, b);
    const int i0 = (blockIdx.x % q_blocks) * kDsumRows + threadIdx.x / kL, c = (lane % kL) * 8;
    const int64_t at = seq.o_off + h * p.out_head_stride + c;
    const T *o = (const T *)p.out + at, *g = (const T *)a.dout + at;
    uint4 ov[kPasses], gv[kPasses];
#pragma unroll
    for (int k = 0; k < kPasses; k++) {
        const int i = i0 + k * kGroups;
        if (i < seq.len_q && c < D) {
            ov[k] = *reinterpret_cast<const uint4 *>(o + (int64_t)i * p.out_row_stride);
            gv[k] = *reinterpret_cast<const uint4 *>(g + (int64_t)i * p.out_row_stride);
        } else {
            ov[k] = gv[k] = make_uint4(0u, 0u, 0u, 0u); /* (+0: the sum a lane without a chunk holds) */
        }
    }
    float *dsum = a.dsum + seq.row0 + h * fad_lse_head_stride(&p);
#pragma unroll
    for (int k = 0; k < kPasses; k++) {
        const T *oe = reinterpret_cast<const T *>(&ov[k]), *ge = reinterpret_cast<const T *>(&gv[k]);
        float s = 0.f;
        if (c < D)
#pragma unroll
            for (int e = 0; e < 8; e++)
                s = FAD_FMA((float)oe[e], (float)ge[e], s);
        if (kL < 32)
            s = FAD_ADD(s, 0.f);
#pragma unroll
        for (int off = kL / 2; off > 0; off /= 2)
            s = FAD_ADD(s, __shfl_xor_sync(0xffffffffu, s, off));
        const int i = i0 + k * kGroups;
        if (lane % kL == 0 && i < seq.len_q)
            dsum[i] = s;
    }
}

template <typename T>
fad_status launch_dsum(const bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    const fad_fwd_params &p = a.p;
    const int64_t ctas = (int64_t)(p.seqlen_q + kDsumRows - 1) / kDsumRows * p.batch * p.num_heads;
    if (ctas == 0)
        return FAD_OK;
    void (*kernel)(bwd_args) = p.head_dim <= 64 ? dsum_kernel<T, 8> : p.head_dim <= 128 ? dsum_kernel<T, 16>
                                                                                          : dsum_kernel<T, 32>;
    kernel<<<(unsigned)ctas, kDsumWarps * 32, 0, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

template fad_status launch_dsum<__half>(const bwd_args &, cudaStream_t, char *, size_t);
template fad_status launch_dsum<__nv_bfloat16>(const bwd_args &, cudaStream_t, char *, size_t);
