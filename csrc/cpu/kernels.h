/*
 * cpu/kernels.h — what the CPU forward (fad_cpu.c) and backward (fad_bwd_cpu.c)
 * call: the vector kernels of one key tile (cpu/kernels.inc, picked for the
 * machine at the first call) and a fork-join over work items (cpu/threads.c).
 */
#ifndef FAD_CPU_KERNELS_H
#define FAD_CPU_KERNELS_H

#include <stdint.h>

#include "fad_internal.h"

/* Keys per tile of the CPU walk inside a split (it divides FAD_SPLIT_QUANTUM). */
#define FAD_CPU_TILE FAD_BLOCK_N

/* Scratch rows are padded to this many (the kernels' row blocks), and D to a
 * multiple of 16 (one vector). */
#define FAD_CPU_ROW_PAD 4
static inline int fad_cpu_pad_rows(int n) { return (n + FAD_CPU_ROW_PAD - 1) / FAD_CPU_ROW_PAD * FAD_CPU_ROW_PAD; }
static inline int fad_cpu_pad_d(int d) { return (d + 15) / 16 * 16; }

/* Every buffer is row-major fp32; w and s rows are FAD_CPU_TILE long. nrows is
 * a multiple of FAD_CPU_ROW_PAD; Dp of 16. The orders are kernels.inc's. */
typedef struct fad_cpu_kernels {
    /* s[r][j] = a[r] . bt[.][j] (bt: D x FAD_CPU_TILE, a key per column) */
    void (*dots)(const float *a, int64_t as, int nrows, const float *bt, int D, float *s);
    /* o[r] += sum_j w[r][j] x[j], j < nk */
    void (*acc_rows)(const float *w, int nrows, int nk, const float *x, int64_t xs, int Dp,
                     float *o, int64_t os);
    /* y[j] += sum_i w[i][j] z[i], i < nrows, j < FAD_CPU_TILE */
    void (*acc_cols)(const float *w, int nrows, const float *z, int64_t zs, int Dp, float *y,
                     int64_t ys);
    float (*tile_max)(const float *s);
    float (*probs)(float *s, float es, float base);
    void (*bwd_ds)(const float *qk, const float *dp, int lo, int hi, float scale_log2, float lse2,
                   float delta, float grad, float *ds, float *pv);
    void (*load_rows)(const uint16_t *const *src, int n, int D, int Dp, int bf16, float *dst,
                      int64_t ds);
    void (*transpose)(const float *rows, int Dp, float *dst);
    /* a <- fad_merge_value(a, b, w) element by element */
    void (*merge)(float *a, const float *b, float wa, float wb, int Dp);
    /* dst <- src * scale in the output dtype (fad_float_to_bf16 / _fp16) */
    void (*store_scaled)(const float *src, float scale, int D, int bf16, uint16_t *dst);
} fad_cpu_kernels;

/* The best variant this machine runs (FLASH_ATTN_DET_CPU_ISA=avx512|avx2|c pins one,
 * for tests that compare them: they give the same bits). */
const fad_cpu_kernels *fad_cpu_kernels_get(void);

/* Carving one thread's scratch into 64-byte-aligned arrays: with base NULL it only
 * counts the bytes (at), else it also points w->field at its place. */
#define FAD_CPU_CARVE(w, base, at, field, type, n)                              \
    do {                                                                        \
        if (base)                                                               \
            (w)->field = (type *)((base) + (at));                               \
        (at) += ((n) * sizeof(type) + 63) / 64 * 64;                            \
    } while (0)

/* Runs fn(ctx, item, scratch) for every item in [0, n_items) on up to
 * num_threads threads (the caller's among them); each thread gets its own
 * scratch of scratch_bytes (64-byte aligned). Items are taken in increasing
 * order by whichever thread is free: fn's results must not depend on the
 * thread. Each scratch's first 64 bytes are zero when fn first sees it (a header
 * for what fn keeps from item to item). Returns 0, or -1 when scratch could not be allocated (nothing ran). */
int fad_cpu_parallel(int num_threads, int64_t n_items, size_t scratch_bytes,
                     void (*fn)(void *ctx, int64_t item, void *scratch), void *ctx);

#endif /* FAD_CPU_KERNELS_H */
