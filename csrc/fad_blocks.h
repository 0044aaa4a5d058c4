/*
 * fad_blocks.h — batch-invariant building blocks around the attention: a matrix
 * product for linear layers and per-row reductions (sum, dot, log-sum-exp) for
 * norms and log-softmax. Public C API, usable with no Python (docs/design.md,
 * "batch-invariant-models").
 *
 * The promise is the attention's, carried to the rest of a model: the bits of one
 * output row depend on that row's inputs and the fixed operand (the weight), never
 * on how many rows share the call. The means are the attention's too: the
 * reduction order of every row is fixed by the reduction length alone.
 *   - gemm on the GPU: cuBLASLt with one algorithm pinned per (dtype, ops, fixed
 *     dims), chosen once from a reference row count, split-K off: every row is
 *     reduced by one tile over the whole K in the algorithm's order, whatever the
 *     number of rows (cuBLAS itself picks other kernels, split-K among them, by
 *     the row count). On the CPU: a fixed ascending-k loop per output element.
 *     A weight gradient (trans_a: summed over the rows, so only its run-to-run
 *     bits matter) may also split K, its fp32 partials added in a fixed order.
 *   - row reductions: one CTA (GPU) or one loop (CPU) per row, the same
 *     partition (fixed by the number of columns alone, never by their type or
 *     alignment) and the same fixed tree whatever the number of rows.
 */
#ifndef FAD_BLOCKS_H
#define FAD_BLOCKS_H

#include <stddef.h>
#include <stdint.h>

#include "fad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Element types of the blocks (the attention's fad_dtype plus float32). */
typedef enum fad_etype { FAD_E_FLOAT16 = 0, FAD_E_BFLOAT16 = 1, FAD_E_FLOAT32 = 2 } fad_etype;

/* C[m, n] = sum_k A'[m, k] * B'[k, n] (+ bias[n]), all row-major with unit
 * column stride, fp32 accumulation, C in the operands' type.
 *   A' = A (m x k, lda) or, with trans_a, A^T where A is (k x m, lda);
 *   B' = B (k x n, ldb) or, with trans_b, B^T where B is (n x k, ldb).
 * A linear layer y = x w^T is (x, w, trans_b); its dx = dy w is (dy, w); its
 * dw = dy^T x is (dy, x, trans_a). Row invariance holds in m for !trans_a: the
 * plan is fixed by (etype, trans_a, trans_b, n, k, bias) on the GPU. With trans_a
 * (a weight gradient, reduced over the rows) the plan is fixed by (m, n) and the
 * result is the same bits run to run. */
typedef struct fad_gemm_params {
    fad_etype etype;
    int trans_a, trans_b;
    int64_t m, n, k;
    const void *a;
    int64_t lda;
    const void *b;
    int64_t ldb;
    const void *bias; /* NULL or n elements of etype; only without trans_a */
    void *c;
    int64_t ldc;
} fad_gemm_params;

/* Row reductions of x (rows x cols, row stride ldx), one fp32 result a row:
 *   SUM  out[r] = sum_j x[r, j]
 *   DOT  out[r] = sum_j x[r, j] * y[r, j]     (y: its own etype and row stride)
 *   LSE  out[r] = max_j x + log(sum_j exp(x[r, j] - max_j x))   (-inf for an
 *        all -inf row, NaN propagates)
 * In fp32 whatever the inputs' type; cols > 0. */
typedef enum fad_row_op { FAD_ROW_SUM = 0, FAD_ROW_DOT = 1, FAD_ROW_LSE = 2 } fad_row_op;

typedef struct fad_row_params {
    fad_row_op op;
    int64_t rows, cols;
    fad_etype x_type;
    const void *x;
    int64_t ldx;
    fad_etype y_type; /* DOT only */
    const void *y;
    int64_t ldy;
    float *out; /* rows floats, contiguous */
} fad_row_params;

/* RMSNorm of each row (transformers' Llama/Qwen2 roundings), all of etype:
 *   s[r] = 1 / sqrt(sum_j x[r, j]^2 / cols + eps)          (fp32, the DOT reduction's order)
 *   y[r, j] = round(w[j] * round(x[r, j] * s[r]))           (round: to etype)
 * w NULL: no scale. s (rows floats) is written for the backward. */
typedef struct fad_rmsnorm_params {
    int64_t rows, cols;
    fad_etype etype;
    const void *x;
    int64_t ldx;
    const void *w;
    void *y;
    int64_t ldy;
    float *s;
    float eps;
} fad_rmsnorm_params;

/* RMSNorm's backward, for the forward above (x, w and s as it had them); x, dy, w and dx of
 * etype:
 *   g[r, j]  = w ? round(dy[r, j] * w[j]) : dy[r, j]
 *   c[r]     = (sum_j g[r, j] * x[r, j]) * (s[r] * s[r] * s[r]) / cols   (the DOT order)
 *   dx[r, j] = round(g[r, j] * s[r] - x[r, j] * c[r])
 * (transformers' graph, op by op: dx of a row depends on that row alone), and with dw_part
 * (w non-NULL) the weight gradient's partial sums, fp32, one row per block of
 * FAD_RMSNORM_BWD_ROWS rows, each summed over its rows in order:
 *   dw_part[b, j] = sum_{r in block b} dy[r, j] * round(x[r, j] * s[r])
 * dw is their sum over b, in order (the caller's): the same bits run to run. */
#define FAD_RMSNORM_BWD_ROWS 16
typedef struct fad_rmsnorm_bwd_params {
    int64_t rows, cols;
    fad_etype etype;
    const void *x;
    int64_t ldx;
    const void *dy;
    int64_t lddy;
    const void *w;
    const float *s;
    void *dx;
    int64_t lddx;
    float *dw_part; /* NULL, or ceil(rows / FAD_RMSNORM_BWD_ROWS) x cols floats, contiguous */
} fad_rmsnorm_bwd_params;

/* The gradient of log-sum-exp (and of cross-entropy) with respect to the logits:
 *   dx[r, j] = g[r] * exp(x[r, j] - lse[r]) - (j == target[r] ? g[r] : 0)
 * x and dx of etype, lse and g fp32 (rows,), target NULL or int64 (rows,) (a negative
 * target: no term). Elementwise: each element's bits depend on its row alone. */
typedef struct fad_xent_bwd_params {
    int64_t rows, cols;
    fad_etype etype;
    const void *x;
    int64_t ldx;
    const float *lse, *g;
    const int64_t *target;
    void *dx;
    int64_t lddx;
} fad_xent_bwd_params;

/* Checks p's sizes and pointers (every entry runs it first). */
fad_status fad_gemm_check(const fad_gemm_params *p, char *msg, size_t msg_len);
fad_status fad_row_check(const fad_row_params *p, char *msg, size_t msg_len);

fad_status fad_gemm_cpu(const fad_gemm_params *p, char *msg, size_t msg_len);
fad_status fad_row_reduce_cpu(const fad_row_params *p, char *msg, size_t msg_len);
fad_status fad_rmsnorm_check(const fad_rmsnorm_params *p, char *msg, size_t msg_len);
fad_status fad_rmsnorm_cpu(const fad_rmsnorm_params *p, char *msg, size_t msg_len);
fad_status fad_rmsnorm_bwd_check(const fad_rmsnorm_bwd_params *p, char *msg, size_t msg_len);
fad_status fad_rmsnorm_bwd_cpu(const fad_rmsnorm_bwd_params *p, char *msg, size_t msg_len);
fad_status fad_xent_bwd_check(const fad_xent_bwd_params *p, char *msg, size_t msg_len);
fad_status fad_xent_bwd_cpu(const fad_xent_bwd_params *p, char *msg, size_t msg_len);

/* On the device current on the calling thread, on stream. The GEMM loads
 * cuBLASLt at the first call (the library of the process's CUDA toolkit: the one
 * torch loaded, else libcublasLt.so.13 / .12 from the loader's path, or the file
 * FLASH_ATTN_DET_CUBLASLT names) and keeps one plan per fixed shape; a plan whose
 * algorithm needs scratch shares one 32 MiB buffer a device, allocated with the first such
 * plan: calls are CUDA-graph capturable once their plans exist, and calls on several
 * streams of one device at once must not both use scratch. */
fad_status fad_gemm_cuda(const fad_gemm_params *p, struct CUstream_st *stream, char *msg,
                         size_t msg_len);
fad_status fad_row_reduce_cuda(const fad_row_params *p, struct CUstream_st *stream, char *msg,
                               size_t msg_len);
fad_status fad_rmsnorm_cuda(const fad_rmsnorm_params *p, struct CUstream_st *stream, char *msg,
                            size_t msg_len);
fad_status fad_rmsnorm_bwd_cuda(const fad_rmsnorm_bwd_params *p, struct CUstream_st *stream,
                                char *msg, size_t msg_len);
fad_status fad_xent_bwd_cuda(const fad_xent_bwd_params *p, struct CUstream_st *stream, char *msg,
                             size_t msg_len);

#ifdef __cplusplus
}
#endif

#endif /* FAD_BLOCKS_H */
