/*
 * rows.cu — per-row reductions for the batch-invariant blocks (fad_blocks.h):
 * SUM, DOT and LSE of each row of a (rows x cols) matrix, in fp32; the fused RMSNorm
 * built on the DOT reduction; and the elementwise gradient of LSE / cross-entropy.
 *
 * Shapes: x (rows, cols) with row stride ldx, y likewise (DOT), out (rows,) fp32.
 * Grid: one CTA of ROW_THREADS threads per row (a grid-stride loop past 2^20
 * rows). Why it is invariant: thread t always sums the columns t, t + 256, ...
 * in ascending order, and the 256 partials always meet in the same butterfly
 * (warp shuffles) and then in warp order -- the partition depends on cols alone,
 * never on rows, the grid or the SM count (docs/design.md,
 * "batch-invariant-models").
 */
#include <math.h>

#include "fad_blocks.h"
#include "mma.cuh"

enum { ROW_THREADS = 256, ROW_WARPS = ROW_THREADS / 32, ROW_MAX_GRID = 1 << 20 };

template <typename T> __device__ __forceinline__ float load_f(const T *p, int64_t i);
template <> __device__ __forceinline__ float load_f<float>(const float *p, int64_t i) { return p[i]; }
template <> __device__ __forceinline__ float load_f<__half>(const __half *p, int64_t i)
{
    return __half2float(p[i]);
}
template <> __device__ __forceinline__ float load_f<__nv_bfloat16>(const __nv_bfloat16 *p, int64_t i)
{
    return __bfloat162float(p[i]);
}

/* The CTA's 256 partials -> one value in every thread, in a fixed order: an xor
 * butterfly inside each warp, then warp 0's lanes 0..7 in the same butterfly. */
template <bool kMax>
__device__ __forceinline__ float block_reduce(float v, float *smem)
{
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float o = __shfl_xor_sync(0xffffffffu, v, off);
        v = kMax ? fmaxf(v, o) : __fadd_rn(v, o);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __syncthreads(); /* smem is reused by the next reduction of the same row */
    if (lane == 0)
        smem[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < ROW_WARPS ? smem[lane] : (kMax ? -INFINITY : 0.f);
#pragma unroll
        for (int off = ROW_WARPS / 2; off > 0; off >>= 1) {
            const float o = __shfl_xor_sync(0xffffffffu, v, off);
            v = kMax ? fmaxf(v, o) : __fadd_rn(v, o);
        }
        if (lane == 0)
            smem[ROW_WARPS] = v;
    }
    __syncthreads();
    return smem[ROW_WARPS];
}

template <typename TX, typename TY>
__global__ void __launch_bounds__(ROW_THREADS)
row_reduce_kernel(fad_row_op op, int64_t rows, int64_t cols, const TX *__restrict__ x, int64_t ldx,
                  const TY *__restrict__ y, int64_t ldy, float *__restrict__ out)
{
    __shared__ float smem[ROW_WARPS + 1];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const TX *xr = x + r * ldx;
        float acc = 0.f;
        if (op == FAD_ROW_SUM) {
            for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                acc = __fadd_rn(acc, load_f(xr, j));
            acc = block_reduce<false>(acc, smem);
        } else if (op == FAD_ROW_DOT) {
            const TY *yr = y + r * ldy;
            for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                acc = __fadd_rn(acc, __fmul_rn(load_f(xr, j), load_f(yr, j)));
            acc = block_reduce<false>(acc, smem);
        } else {
            float m = -INFINITY;
            for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                m = fmaxf(m, load_f(xr, j));
            m = block_reduce<true>(m, smem);
            if (isinf(m)) { /* all -inf: log(0); some +inf: +inf; fmaxf drops NaN, so look */
                for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                    acc = __fadd_rn(acc, load_f(xr, j));
                acc = block_reduce<false>(acc, smem);
                acc = acc != acc ? acc : m;
            } else {
                for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                    acc = __fadd_rn(acc, expf(__fsub_rn(load_f(xr, j), m)));
                acc = block_reduce<false>(acc, smem);
                acc = __fadd_rn(m, logf(acc));
            }
        }
        if (threadIdx.x == 0)
            out[r] = acc;
    }
}

template <typename T> __device__ __forceinline__ T store_t(float v);
template <> __device__ __forceinline__ float store_t<float>(float v) { return v; }
template <> __device__ __forceinline__ __half store_t<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 store_t<__nv_bfloat16>(float v)
{
    return __float2bfloat16_rn(v);
}

/* RMSNorm (fad_rmsnorm_params): the DOT reduction's partition and tree for the sum of
 * squares, then each thread writes the columns it read. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
rmsnorm_kernel(int64_t rows, int64_t cols, const T *__restrict__ x, int64_t ldx,
               const T *__restrict__ w, T *__restrict__ y, int64_t ldy, float *__restrict__ s_out,
               float eps)
{
    __shared__ float smem[ROW_WARPS + 1];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *xr = x + r * ldx;
        float acc = 0.f;
        for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS) {
            const float v = load_f(xr, j);
            acc = __fadd_rn(acc, __fmul_rn(v, v));
        }
        acc = block_reduce<false>(acc, smem);
        const float s = __frcp_rn(__fsqrt_rn(__fadd_rn(__fdiv_rn(acc, (float)cols), eps)));
        if (threadIdx.x == 0)
            s_out[r] = s;
        for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS) {
            const T h = store_t<T>(__fmul_rn(load_f(xr, j), s));
            y[r * ldy + j] = w ? store_t<T>(__fmul_rn(load_f(w, j), load_f(&h, 0))) : h;
        }
    }
}

/* dx = g * exp(x - lse) - [j == target] g, per element (fad_xent_bwd_params): a 2-D
 * grid, x over columns (256 a CTA), y over rows. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
xent_bwd_kernel(int64_t rows, int64_t cols, const T *__restrict__ x, int64_t ldx,
                const float *__restrict__ lse, const float *__restrict__ g,
                const int64_t *__restrict__ target, T *__restrict__ dx, int64_t lddx)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float gr = g[r], lr = lse[r];
        const int64_t t = target ? target[r] : -1;
        for (int64_t j = blockIdx.x * (int64_t)ROW_THREADS + threadIdx.x; j < cols;
             j += (int64_t)gridDim.x * ROW_THREADS) {
            float v = __fmul_rn(gr, expf(__fsub_rn(load_f(x + r * ldx, j), lr)));
            if (j == t)
                v = __fsub_rn(v, gr);
            dx[r * lddx + j] = store_t<T>(v);
        }
    }
}

template <typename T>
static fad_status launch_rmsnorm(const fad_rmsnorm_params *p, cudaStream_t stream, char *msg,
                                 size_t msg_len)
{
    const int64_t grid = p->rows < ROW_MAX_GRID ? p->rows : ROW_MAX_GRID;
    rmsnorm_kernel<T><<<(unsigned)grid, ROW_THREADS, 0, stream>>>(
        p->rows, p->cols, (const T *)p->x, p->ldx, (const T *)p->w, (T *)p->y, p->ldy, p->s, p->eps);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

extern "C" fad_status fad_rmsnorm_cuda(const fad_rmsnorm_params *p, struct CUstream_st *stream,
                                       char *msg, size_t msg_len)
{
    fad_status st = fad_rmsnorm_check(p, msg, msg_len);
    if (st != FAD_OK || p->rows == 0)
        return st;
    switch (p->etype) {
    case FAD_E_FLOAT16: return launch_rmsnorm<__half>(p, stream, msg, msg_len);
    case FAD_E_BFLOAT16: return launch_rmsnorm<__nv_bfloat16>(p, stream, msg, msg_len);
    default: return launch_rmsnorm<float>(p, stream, msg, msg_len);
    }
}

template <typename T>
static fad_status launch_xent_bwd(const fad_xent_bwd_params *p, cudaStream_t stream, char *msg,
                                  size_t msg_len)
{
    const int64_t gx = (p->cols + ROW_THREADS - 1) / ROW_THREADS;
    const dim3 grid((unsigned)(gx < 1024 ? gx : 1024), (unsigned)(p->rows < 65535 ? p->rows : 65535));
    xent_bwd_kernel<T><<<grid, ROW_THREADS, 0, stream>>>(p->rows, p->cols, (const T *)p->x, p->ldx,
                                                          p->lse, p->g, p->target, (T *)p->dx, p->lddx);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

extern "C" fad_status fad_xent_bwd_cuda(const fad_xent_bwd_params *p, struct CUstream_st *stream,
                                        char *msg, size_t msg_len)
{
    fad_status st = fad_xent_bwd_check(p, msg, msg_len);
    if (st != FAD_OK || p->rows == 0)
        return st;
    switch (p->etype) {
    case FAD_E_FLOAT16: return launch_xent_bwd<__half>(p, stream, msg, msg_len);
    case FAD_E_BFLOAT16: return launch_xent_bwd<__nv_bfloat16>(p, stream, msg, msg_len);
    default: return launch_xent_bwd<float>(p, stream, msg, msg_len);
    }
}

template <typename TX, typename TY>
static fad_status launch_rows(const fad_row_params *p, cudaStream_t stream, char *msg, size_t msg_len)
{
    const int64_t grid = p->rows < ROW_MAX_GRID ? p->rows : ROW_MAX_GRID;
    row_reduce_kernel<TX, TY><<<(unsigned)grid, ROW_THREADS, 0, stream>>>(
        p->op, p->rows, p->cols, (const TX *)p->x, p->ldx, (const TY *)p->y, p->ldy, p->out);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

template <typename TX>
static fad_status dispatch_y(const fad_row_params *p, cudaStream_t s, char *msg, size_t msg_len)
{
    if (p->op != FAD_ROW_DOT)
        return launch_rows<TX, TX>(p, s, msg, msg_len);
    switch (p->y_type) {
    case FAD_E_FLOAT16: return launch_rows<TX, __half>(p, s, msg, msg_len);
    case FAD_E_BFLOAT16: return launch_rows<TX, __nv_bfloat16>(p, s, msg, msg_len);
    default: return launch_rows<TX, float>(p, s, msg, msg_len);
    }
}

extern "C" fad_status fad_row_reduce_cuda(const fad_row_params *p, struct CUstream_st *stream,
                                          char *msg, size_t msg_len)
{
    fad_status st = fad_row_check(p, msg, msg_len);
    if (st != FAD_OK || p->rows == 0)
        return st;
    switch (p->x_type) {
    case FAD_E_FLOAT16: return dispatch_y<__half>(p, stream, msg, msg_len);
    case FAD_E_BFLOAT16: return dispatch_y<__nv_bfloat16>(p, stream, msg, msg_len);
    default: return dispatch_y<float>(p, stream, msg, msg_len);
    }
}
