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
 * two matmul kernels instead (fad_bwd_wgmma.cuh): the same chains, the same
 * bits, 1.7-1.8x faster on the H100 (docs/design.md, "wgmma-bits").
 */
#include "bwd_block.cuh"

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

template <typename T>
fad_status launch_dsum(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len)
{
    dsum_kernel<T><<<(unsigned)ctas, 128, 0, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

template fad_status launch_dsum<__half>(const bwd_args &, int64_t, cudaStream_t, char *, size_t);
template fad_status launch_dsum<__nv_bfloat16>(const bwd_args &, int64_t, cudaStream_t, char *, size_t);
