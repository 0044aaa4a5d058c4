/*
 * rows.cu — per-row reductions for the batch-invariant blocks (fad_blocks.h):
 * SUM, DOT and LSE of each row of a (rows x cols) matrix, in fp32; the fused RMSNorm
 * and its backward, built on the DOT reduction; and the elementwise gradient of LSE /
 * cross-entropy.
 *
 * Shapes: x (rows, cols) with row stride ldx, y likewise (DOT), out (rows,) fp32.
 * Grid: one CTA of ROW_THREADS threads per row (a grid-stride loop past 2^20
 * rows). Why it is invariant: thread t always sums the columns t, t + 256, ...
 * in ascending order, and the 256 partials always meet in the same butterfly
 * (warp shuffles) and then in warp order -- the partition depends on cols alone,
 * never on rows, the grid or the SM count (docs/design.md,
 * "batch-invariant-models"). LSE, over a vocabulary's logits the widest row,
 * reads 16 bytes at a time: thread t owns the chunks of 8 columns starting at
 * 8t + 2048k, folded in column order whether a chunk is read by vector loads (a
 * 16-byte aligned row) or element by element, so neither the alignment nor the type
 * of a row (fp32 or bf16 holding the same values) changes its bits.
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

/* The chunk of ROW_VEC columns from j of row xr as floats (n of them: ROW_VEC, fewer at
 * the row's end): 16-byte loads where the row start is 16-byte aligned (vec), else
 * element by element -- the same values in the same slots either way. ROW_VEC is 8 for
 * every type: the partition must not depend on the type either, since the same values
 * held in fp32 (generate's copies of the logits) and in bf16 (a trainer's) must give the
 * same bits. */
enum { ROW_VEC = 8 };

template <typename T>
__device__ __forceinline__ int load_chunk(const T *xr, int64_t j, int64_t cols, bool vec,
                                          float (&v)[ROW_VEC])
{
    constexpr int per = 16 / sizeof(T); /* elements a 16-byte load */
    if (vec && j + ROW_VEC <= cols) {
#pragma unroll
        for (int q = 0; q < ROW_VEC / per; q++) {
            const uint4 raw = *reinterpret_cast<const uint4 *>(xr + j + q * per);
            const T *e = reinterpret_cast<const T *>(&raw);
#pragma unroll
            for (int i = 0; i < per; i++)
                v[q * per + i] = load_f(e, i);
        }
        return ROW_VEC;
    }
    const int n = cols - j < ROW_VEC ? (int)(cols - j) : ROW_VEC;
    for (int i = 0; i < n; i++)
        v[i] = load_f(xr, j + i);
    return n;
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
            /* one pass: each thread keeps its chunks' running max m and sum s of
             * exp(x - m), rescaled when m grows; then the CTA's max M and the sum of
             * s * exp(m - M). A thread that saw only -inf adds 0; a NaN it saw makes
             * the sum NaN (fmaxf drops NaN, so it is looked for). */
            constexpr int N = ROW_VEC;
            const bool vec = ((uintptr_t)xr & 15) == 0;
            float m = -INFINITY, s = 0.f;
            bool nan = false;
            for (int64_t j = (int64_t)threadIdx.x * N; j < cols; j += (int64_t)ROW_THREADS * N) {
                float v[N];
                const int n = load_chunk(xr, j, cols, vec, v);
                float cm = m;
                for (int i = 0; i < n; i++) {
                    cm = fmaxf(cm, v[i]);
                    nan |= v[i] != v[i];
                }
                if (cm == -INFINITY)
                    continue;
                if (cm > m) {
                    s = __fmul_rn(s, expf(__fsub_rn(m, cm)));
                    m = cm;
                }
                for (int i = 0; i < n; i++)
                    s = __fadd_rn(s, expf(__fsub_rn(v[i], m)));
            }
            const float M = block_reduce<true>(m, smem);
            if (isinf(M)) { /* all -inf: log(0); some +inf: +inf; NaN propagates */
                for (int64_t j = threadIdx.x; j < cols; j += ROW_THREADS)
                    acc = __fadd_rn(acc, load_f(xr, j));
                acc = block_reduce<false>(acc, smem);
                acc = acc != acc ? acc : M;
            } else {
                acc = nan ? NAN : m == -INFINITY ? 0.f : __fmul_rn(s, expf(__fsub_rn(m, M)));
                acc = block_reduce<false>(acc, smem);
                acc = __fadd_rn(M, logf(acc));
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

/* v rounded to T and back (a store and a load) */
template <typename T> __device__ __forceinline__ float round_t(float v)
{
    const T h = store_t<T>(v);
    return load_f(&h, 0);
}

/* RMSNorm's backward (fad_rmsnorm_bwd_params): one CTA a block of
 * FAD_RMSNORM_BWD_ROWS rows, taken in order. Per row: the DOT reduction's partition and
 * tree for sum_j g * x, then each thread writes dx for the columns it read and, with
 * dw_part, adds dy * round(x * s) into the block's partial sums of those columns. The
 * block's row of dw_part is this CTA's alone and each of its columns one thread's, so
 * the sums are plain loads and stores (L2-resident), in row order, with no barrier. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
rmsnorm_bwd_kernel(fad_rmsnorm_bwd_params p)
{
    __shared__ float smem[ROW_WARPS + 1];
    const T *x = (const T *)p.x, *dy = (const T *)p.dy, *w = (const T *)p.w;
    T *dx = (T *)p.dx;
    const int64_t blocks = (p.rows + FAD_RMSNORM_BWD_ROWS - 1) / FAD_RMSNORM_BWD_ROWS;
    for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
        const int64_t r0 = b * FAD_RMSNORM_BWD_ROWS;
        const int64_t r_end = r0 + FAD_RMSNORM_BWD_ROWS < p.rows ? r0 + FAD_RMSNORM_BWD_ROWS : p.rows;
        float *part = p.dw_part ? p.dw_part + b * p.cols : nullptr;
        for (int64_t r = r0; r < r_end; r++) {
            const T *xr = x + r * p.ldx, *gr = dy + r * p.lddy;
            const float s = p.s[r];
            /* g = round(dy * w): transformers' graph hands the norm's inner value the
             * gradient dy * w in x's dtype */
            auto g_of = [&](int64_t j) {
                const float d = load_f(gr, j);
                return w ? round_t<T>(__fmul_rn(d, load_f(w, j))) : d;
            };
            float acc = 0.f;
            for (int64_t j = threadIdx.x; j < p.cols; j += ROW_THREADS)
                acc = __fadd_rn(acc, __fmul_rn(g_of(j), load_f(xr, j)));
            acc = block_reduce<false>(acc, smem);
            const float c = __fdiv_rn(__fmul_rn(acc, __fmul_rn(__fmul_rn(s, s), s)), (float)p.cols);
            for (int64_t j = threadIdx.x; j < p.cols; j += ROW_THREADS) {
                const float xv = load_f(xr, j);
                dx[r * p.lddx + j] = store_t<T>(__fsub_rn(__fmul_rn(g_of(j), s), __fmul_rn(xv, c)));
                if (part) {
                    const float t = __fmul_rn(load_f(gr, j), round_t<T>(__fmul_rn(xv, s)));
                    part[j] = r == r0 ? t : __fadd_rn(part[j], t);
                }
            }
        }
    }
}

template <typename T>
static fad_status launch_rmsnorm_bwd(const fad_rmsnorm_bwd_params *p, cudaStream_t stream,
                                     char *msg, size_t msg_len)
{
    const int64_t blocks = (p->rows + FAD_RMSNORM_BWD_ROWS - 1) / FAD_RMSNORM_BWD_ROWS;
    const int64_t grid = blocks < ROW_MAX_GRID ? blocks : ROW_MAX_GRID;
    rmsnorm_bwd_kernel<T><<<(unsigned)grid, ROW_THREADS, 0, stream>>>(*p);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

extern "C" fad_status fad_rmsnorm_bwd_cuda(const fad_rmsnorm_bwd_params *p,
                                           struct CUstream_st *stream, char *msg, size_t msg_len)
{
    fad_status st = fad_rmsnorm_bwd_check(p, msg, msg_len);
    if (st != FAD_OK || p->rows == 0)
        return st;
    switch (p->etype) {
    case FAD_E_FLOAT16: return launch_rmsnorm_bwd<__half>(p, stream, msg, msg_len);
    case FAD_E_BFLOAT16: return launch_rmsnorm_bwd<__nv_bfloat16>(p, stream, msg, msg_len);
    default: return launch_rmsnorm_bwd<float>(p, stream, msg, msg_len);
    }
}

/* dx = g * exp(x - lse) - [j == target] g, per element (fad_xent_bwd_params): one CTA a
 * row (grid-stride past ROW_MAX_GRID), each thread 16-byte chunks of it (load_chunk;
 * stored as one vector where dx's row is aligned too). Elementwise, so how the row is cut
 * changes no bit. */
template <typename T>
__global__ void __launch_bounds__(ROW_THREADS)
xent_bwd_kernel(int64_t rows, int64_t cols, const T *__restrict__ x, int64_t ldx,
                const float *__restrict__ lse, const float *__restrict__ g,
                const int64_t *__restrict__ target, T *__restrict__ dx, int64_t lddx)
{
    constexpr int N = ROW_VEC;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float gr = g[r], lr = lse[r];
        const int64_t t = target ? target[r] : -1;
        const T *xr = x + r * ldx;
        T *dr = dx + r * lddx;
        const bool vec = (((uintptr_t)xr | (uintptr_t)dr) & 15) == 0;
        for (int64_t j = (int64_t)threadIdx.x * N; j < cols; j += (int64_t)ROW_THREADS * N) {
            float v[N];
            const int n = load_chunk(xr, j, cols, vec, v);
            alignas(16) T o[N];
#pragma unroll
            for (int i = 0; i < N; i++) {
                float d = __fmul_rn(gr, expf(__fsub_rn(v[i], lr)));
                if (j + i == t)
                    d = __fsub_rn(d, gr);
                o[i] = store_t<T>(d);
            }
            if (n == N && vec) {
                constexpr int per = 16 / sizeof(T);
#pragma unroll
                for (int q = 0; q < N / per; q++)
                    *reinterpret_cast<uint4 *>(dr + j + q * per) =
                        *reinterpret_cast<const uint4 *>(o + q * per);
            } else
                for (int i = 0; i < n; i++)
                    dr[j + i] = o[i];
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
    const int64_t grid = p->rows < ROW_MAX_GRID ? p->rows : ROW_MAX_GRID;
    xent_bwd_kernel<T><<<(unsigned)grid, ROW_THREADS, 0, stream>>>(p->rows, p->cols, (const T *)p->x, p->ldx,
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
