/*
 * append.cu — flash_attn_with_kvcache's steps before attention in one
 * kernel: rotary on q and on the new keys, new keys/values written into the
 * cache (contiguous or paged). fad.h (fad_append_params) states the semantics;
 * the torch-op version in flash_attn_det/interface.py (_kvcache_append) is the
 * CPU path and the reference these bits must equal.
 *
 * Shapes: q, q_rot (B, Sq, Hq, D); k, v (B, Snew, Hkv, D);
 *         cache (kv_batch, capacity, Hkv, D) or pages (pages, page_size, Hkv, D);
 *         rotary_cos/sin (seqlen_ro, R/2).
 * One CTA per (sequence, row): the Sq query rows (when rotary is on), then the
 * Snew key rows, then the Snew value rows; its threads walk heads x D.
 */
#include <math.h>

#include "mma.cuh"

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x)
{
    return __float2bfloat16_rn(x);
}

template <typename T>
__device__ __forceinline__ float rotary_at(const fad_append_params &p, const void *table, int64_t i)
{
    return p.rotary_fp32 ? ((const float *)table)[i] : (float)((const T *)table)[i];
}

template <typename T>
__global__ void __launch_bounds__(128) append_kernel(const __grid_constant__ fad_append_params p)
{
    /* The attention kernel after us (launched early on sm_90, FAD_ATTN_PDL) may
     * start launching; it waits for this grid to end before it reads anything. */
    pdl_launch_dependents();
    const int D = p.head_dim, R = p.rotary_dim, half = R / 2;
    const int q_rows = R > 0 ? p.seqlen_q : 0, per_seq = q_rows + 2 * p.seqlen_new;
    const int b = blockIdx.x / per_seq, r = blockIdx.x % per_seq;
    const int start = p.cache_seqlens[b]; /* cache row of new row 0, and its rotary position */
    const int pos0 = start;
    if (r == 0 && threadIdx.x == 0 && p.seqlens_out)
        p.seqlens_out[b] = start + p.seqlen_new;

    const T *src;
    T *dst;
    int heads, pos = -1;
    int64_t src_hs, dst_hs;
    bool rotate = R > 0;
    if (r < q_rows) { /* query row r -> q_rot */
        src = (const T *)p.q + b * p.q_batch_stride + r * p.q_row_stride, src_hs = p.q_head_stride;
        dst = (T *)p.q_rot + ((int64_t)b * p.seqlen_q + r) * p.num_heads * D, dst_hs = D;
        heads = p.num_heads;
        pos = pos0 + (p.rotate_q_per_row ? r : 0);
    } else { /* new key or value row i -> its cache row, if it exists */
        const bool is_v = r - q_rows >= p.seqlen_new;
        const int i = (r - q_rows) % p.seqlen_new;
        const int64_t row = (int64_t)start + i;
        int64_t entry, cache_row;
        if (p.block_table) {
            const int64_t slot = row / p.capacity;
            if (row < 0 || slot >= p.max_blocks)
                return;
            entry = p.block_table[(int64_t)b * p.block_table_stride + slot];
            cache_row = row % p.capacity;
        } else {
            entry = p.cache_batch_idx ? p.cache_batch_idx[b] : b;
            cache_row = row;
            if (row < 0 || row >= p.capacity)
                return;
        }
        if (entry < 0 || entry >= p.kv_batch)
            return;
        if (is_v) {
            src = (const T *)p.v + b * p.v_batch_stride + i * p.v_row_stride, src_hs = p.v_head_stride;
            dst = (T *)p.v_cache + entry * p.vc_batch_stride + cache_row * p.vc_row_stride;
            dst_hs = p.vc_head_stride;
            rotate = false;
        } else {
            src = (const T *)p.k + b * p.k_batch_stride + i * p.k_row_stride, src_hs = p.k_head_stride;
            dst = (T *)p.k_cache + entry * p.kc_batch_stride + cache_row * p.kc_row_stride;
            dst_hs = p.kc_head_stride;
            pos = pos0 + i;
        }
        heads = p.num_heads_k;
    }
    const bool in_table = pos >= 0 && pos < p.seqlen_ro;
    for (int t = threadIdx.x; t < heads * D; t += blockDim.x) {
        const int h = t / D, e = t % D;
        const T *x = src + h * src_hs;
        float y = (float)x[e];
        if (rotate && e < R) {
            /* element e is the first (y0) or second (y1) of its pair (e0, e1), angle j */
            const bool second = p.rotary_interleaved ? (e & 1) : e >= half;
            const int j = p.rotary_interleaved ? e / 2 : (second ? e - half : e);
            const int e0 = p.rotary_interleaved ? 2 * j : j, e1 = p.rotary_interleaved ? 2 * j + 1 : j + half;
            float c = NAN, s = NAN;
            if (in_table) {
                c = rotary_at<T>(p, p.rotary_cos, (int64_t)pos * half + j);
                s = rotary_at<T>(p, p.rotary_sin, (int64_t)pos * half + j);
            }
            const float x0 = (float)x[e0], x1 = (float)x[e1];
            y = second ? __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c))
                       : __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
        }
        dst[h * dst_hs + e] = from_float<T>(y);
    }
}

/* Checks in a fixed order: sizes, pointers, rotary, then the launch. */
extern "C" fad_status fad_append_cuda(const fad_append_params *p, struct CUstream_st *stream,
                                      char *msg, size_t msg_len)
{
    if (!p)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "params: NULL");
    if (p->dtype != FAD_FLOAT16 && p->dtype != FAD_BFLOAT16)
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "dtype: expected float16 or bfloat16");
    if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_new < 0 || p->num_heads <= 0 ||
        p->num_heads_k <= 0 || p->kv_batch < 0 || p->capacity <= 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "sizes: batch, seqlen_q, seqlen_new, kv_batch >= 0 and heads, capacity > 0 "
                        "expected");
    if (p->head_dim <= 0 || p->head_dim > FAD_MAX_HEAD_DIM)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "head_dim: must be in [1, %d], got %d",
                        FAD_MAX_HEAD_DIM, p->head_dim);
    if (!p->cache_seqlens)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "cache_seqlens: NULL");
    if (p->seqlen_new > 0 && (!p->k || !p->v || !p->k_cache || !p->v_cache))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "k, v, k_cache, v_cache: NULL pointer");
    if (p->block_table && (p->max_blocks <= 0 || p->block_table_stride < p->max_blocks))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "block_table: bad shape or stride");
    if (p->rotary_dim < 0 || p->rotary_dim % 2 || p->rotary_dim > p->head_dim)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "rotary_dim: must be even and in [0, head_dim = %d], got %d", p->head_dim,
                        p->rotary_dim);
    if (p->rotary_dim > 0 && (!p->rotary_cos || !p->rotary_sin || p->seqlen_ro <= 0))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rotary_cos, rotary_sin: missing or empty");
    if (p->rotary_dim > 0 && p->seqlen_q > 0 && !p->q_rot)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "q_rot: NULL with rotary on");
    const int q_rows = p->rotary_dim > 0 ? p->seqlen_q : 0;
    const int64_t blocks = (int64_t)p->batch * (q_rows + 2 * p->seqlen_new);
    if (blocks == 0 && p->seqlens_out && p->batch > 0) /* the kernel would not write it */
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "seqlens_out: nothing is appended or rotated; keep cache_seqlens");
    if (blocks == 0)
        return FAD_OK;
    if (blocks >= ((int64_t)1 << 31))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "batch x rows: too many rows (%lld)",
                        (long long)blocks);
    if (p->dtype == FAD_BFLOAT16)
        append_kernel<__nv_bfloat16><<<(unsigned)blocks, 128, 0, stream>>>(*p);
    else
        append_kernel<__half><<<(unsigned)blocks, 128, 0, stream>>>(*p);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}
