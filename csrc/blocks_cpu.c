/*
 * blocks_cpu.c — the batch-invariant building blocks (fad_blocks.h) on the CPU,
 * and the argument checks every device's entry runs first.
 *
 * The CPU reference of each: one output element is one ascending loop over the
 * reduction index in fp32, multiply then add (the module is built with
 * -ffp-contract=off, so no fused multiply-add changes the rounding), so a row's
 * bits cannot depend on the other rows of the call.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "fad_blocks.h"
#include "fad_internal.h"

static float load_elem(fad_etype t, const void *base, int64_t i)
{
    if (t == FAD_E_FLOAT32)
        return ((const float *)base)[i];
    const uint16_t h = ((const uint16_t *)base)[i];
    return t == FAD_E_BFLOAT16 ? fad_bf16_to_float(h) : fad_fp16_to_float(h);
}

static void store_elem(fad_etype t, void *base, int64_t i, float v)
{
    if (t == FAD_E_FLOAT32)
        ((float *)base)[i] = v;
    else
        ((uint16_t *)base)[i] = t == FAD_E_BFLOAT16 ? fad_float_to_bf16(v) : fad_float_to_fp16(v);
}

/* v rounded to t and back (what a store and a load give) */
static float round_elem(fad_etype t, float v)
{
    if (t == FAD_E_FLOAT32)
        return v;
    return t == FAD_E_BFLOAT16 ? fad_bf16_to_float(fad_float_to_bf16(v))
                               : fad_fp16_to_float(fad_float_to_fp16(v));
}

static int bad_etype(fad_etype t) { return t != FAD_E_FLOAT16 && t != FAD_E_BFLOAT16 && t != FAD_E_FLOAT32; }

fad_status fad_gemm_check(const fad_gemm_params *p, char *msg, size_t msg_len)
{
    if (bad_etype(p->etype))
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "gemm: unknown element type %d", (int)p->etype);
    if (p->m < 0 || p->n <= 0 || p->k <= 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "gemm: sizes m >= 0, n > 0, k > 0 expected, got m=%lld n=%lld k=%lld",
                        (long long)p->m, (long long)p->n, (long long)p->k);
    /* leading dimensions cover a row of the stored matrix */
    const int64_t a_cols = p->trans_a ? p->m : p->k, b_cols = p->trans_b ? p->k : p->n;
    if (p->lda < (a_cols > 0 ? a_cols : 1) || p->ldb < b_cols || p->ldc < p->n)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "gemm: a row stride is shorter than its row (lda=%lld, ldb=%lld, "
                        "ldc=%lld)", (long long)p->lda, (long long)p->ldb, (long long)p->ldc);
    if (p->bias && p->trans_a)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "gemm: bias only without trans_a");
    if (p->m > 0 && (!p->a || !p->b || !p->c))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "gemm: a NULL operand");
    return FAD_OK;
}

fad_status fad_row_check(const fad_row_params *p, char *msg, size_t msg_len)
{
    if (p->op != FAD_ROW_SUM && p->op != FAD_ROW_DOT && p->op != FAD_ROW_LSE)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "row_reduce: unknown op %d", (int)p->op);
    if (bad_etype(p->x_type) || (p->op == FAD_ROW_DOT && bad_etype(p->y_type)))
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "row_reduce: unknown element type");
    if (p->rows < 0 || p->cols <= 0 || p->ldx < p->cols ||
        (p->op == FAD_ROW_DOT && p->ldy < p->cols))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "row_reduce: rows >= 0, cols > 0 and row strides >= cols expected "
                        "(rows=%lld cols=%lld)", (long long)p->rows, (long long)p->cols);
    if (p->rows > 0 && (!p->x || !p->out || (p->op == FAD_ROW_DOT && !p->y)))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "row_reduce: a NULL operand");
    return FAD_OK;
}

/* B' as fp32, row-major (k x nb) for the output columns [n0, n0 + nb): the panel
 * each output row of the block reads, converted once. */
static void load_b_panel(const fad_gemm_params *p, int64_t n0, int64_t nb, float *panel)
{
    for (int64_t kk = 0; kk < p->k; kk++)
        for (int64_t j = 0; j < nb; j++) {
            const int64_t i = p->trans_b ? (n0 + j) * p->ldb + kk : kk * p->ldb + n0 + j;
            panel[kk * nb + j] = load_elem(p->etype, p->b, i);
        }
}

enum { PANEL_N = 64 };

fad_status fad_gemm_cpu(const fad_gemm_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_gemm_check(p, msg, msg_len);
    if (st != FAD_OK || p->m == 0)
        return st;
    float *panel = malloc(sizeof(float) * (size_t)p->k * PANEL_N);
    float *arow = malloc(sizeof(float) * (size_t)p->k);
    if (!panel || !arow) {
        free(panel), free(arow);
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "gemm: out of host memory");
    }
    for (int64_t n0 = 0; n0 < p->n; n0 += PANEL_N) {
        const int64_t nb = p->n - n0 < PANEL_N ? p->n - n0 : PANEL_N;
        load_b_panel(p, n0, nb, panel);
        for (int64_t r = 0; r < p->m; r++) {
            float acc[PANEL_N];
            for (int64_t kk = 0; kk < p->k; kk++)
                arow[kk] = load_elem(p->etype, p->a, p->trans_a ? kk * p->lda + r : r * p->lda + kk);
            for (int64_t j = 0; j < nb; j++)
                acc[j] = 0.f;
            /* ascending k for every output element; the j loop vectorizes without
             * reordering any one element's sum */
            for (int64_t kk = 0; kk < p->k; kk++) {
                const float a = arow[kk];
                const float *brow = panel + kk * nb;
                for (int64_t j = 0; j < nb; j++)
                    acc[j] = acc[j] + a * brow[j];
            }
            for (int64_t j = 0; j < nb; j++) {
                float v = acc[j];
                if (p->bias)
                    v = v + load_elem(p->etype, p->bias, n0 + j);
                store_elem(p->etype, p->c, r * p->ldc + n0 + j, v);
            }
        }
    }
    free(panel), free(arow);
    return FAD_OK;
}

fad_status fad_row_reduce_cpu(const fad_row_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_row_check(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    for (int64_t r = 0; r < p->rows; r++) {
        const int64_t xo = r * p->ldx;
        float acc = 0.f;
        if (p->op == FAD_ROW_SUM) {
            for (int64_t j = 0; j < p->cols; j++)
                acc = acc + load_elem(p->x_type, p->x, xo + j);
        } else if (p->op == FAD_ROW_DOT) {
            const int64_t yo = r * p->ldy;
            for (int64_t j = 0; j < p->cols; j++)
                acc = acc + load_elem(p->x_type, p->x, xo + j) * load_elem(p->y_type, p->y, yo + j);
        } else {
            float m = -INFINITY;
            for (int64_t j = 0; j < p->cols; j++)
                m = fmaxf(m, load_elem(p->x_type, p->x, xo + j));
            if (isinf(m)) { /* all -inf: log(0); some +inf: +inf; fmaxf drops NaN, so look */
                for (int64_t j = 0; j < p->cols; j++)
                    acc = acc + load_elem(p->x_type, p->x, xo + j);
                p->out[r] = acc != acc ? acc : m;
                continue;
            }
            for (int64_t j = 0; j < p->cols; j++)
                acc = acc + expf(load_elem(p->x_type, p->x, xo + j) - m);
            acc = m + logf(acc);
        }
        p->out[r] = acc;
    }
    return FAD_OK;
}

fad_status fad_rmsnorm_check(const fad_rmsnorm_params *p, char *msg, size_t msg_len)
{
    if (bad_etype(p->etype))
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "rms_norm: unknown element type");
    if (p->rows < 0 || p->cols <= 0 || p->ldx < p->cols || p->ldy < p->cols)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rms_norm: rows >= 0, cols > 0 and row "
                        "strides >= cols expected");
    if (p->rows > 0 && (!p->x || !p->y || !p->s))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rms_norm: a NULL operand");
    return FAD_OK;
}

fad_status fad_rmsnorm_cpu(const fad_rmsnorm_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_rmsnorm_check(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    for (int64_t r = 0; r < p->rows; r++) {
        const int64_t xo = r * p->ldx, yo = r * p->ldy;
        float ss = 0.f;
        for (int64_t j = 0; j < p->cols; j++) {
            const float v = load_elem(p->etype, p->x, xo + j);
            ss = ss + v * v;
        }
        const float s = 1.f / sqrtf(ss / (float)p->cols + p->eps);
        p->s[r] = s;
        for (int64_t j = 0; j < p->cols; j++) {
            /* round(x * s) to etype first, as transformers' .to(input_dtype) does */
            store_elem(p->etype, p->y, yo + j, load_elem(p->etype, p->x, xo + j) * s);
            if (p->w)
                store_elem(p->etype, p->y, yo + j,
                           load_elem(p->etype, p->w, j) * load_elem(p->etype, p->y, yo + j));
        }
    }
    return FAD_OK;
}

fad_status fad_rmsnorm_bwd_check(const fad_rmsnorm_bwd_params *p, char *msg, size_t msg_len)
{
    if (bad_etype(p->etype))
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "rms_norm_bwd: unknown element type");
    if (p->rows < 0 || p->cols <= 0 || p->ldx < p->cols || p->lddy < p->cols || p->lddx < p->cols)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rms_norm_bwd: rows >= 0, cols > 0 and row "
                        "strides >= cols expected");
    if (p->rows > 0 && (!p->x || !p->dy || !p->s || !p->dx))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rms_norm_bwd: a NULL operand");
    if (p->dw_part && !p->w)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "rms_norm_bwd: dw_part without w");
    return FAD_OK;
}

fad_status fad_rmsnorm_bwd_cpu(const fad_rmsnorm_bwd_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_rmsnorm_bwd_check(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    const fad_etype t = p->etype;
    for (int64_t r = 0; r < p->rows; r++) {
        const int64_t xo = r * p->ldx, go = r * p->lddy, dxo = r * p->lddx;
        const float s = p->s[r];
        float *part = p->dw_part ? p->dw_part + r / FAD_RMSNORM_BWD_ROWS * p->cols : NULL;
#define RMS_G(j) (p->w ? round_elem(t, load_elem(t, p->dy, go + (j)) * load_elem(t, p->w, (j))) \
                       : load_elem(t, p->dy, go + (j)))
        float dot = 0.f;
        for (int64_t j = 0; j < p->cols; j++)
            dot = dot + RMS_G(j) * load_elem(t, p->x, xo + j);
        const float c = dot * (s * s * s) / (float)p->cols;
        if (part && r % FAD_RMSNORM_BWD_ROWS == 0)
            memset(part, 0, (size_t)p->cols * sizeof *part);
        for (int64_t j = 0; j < p->cols; j++) {
            const float x = load_elem(t, p->x, xo + j);
            store_elem(t, p->dx, dxo + j, RMS_G(j) * s - x * c);
            if (part)
                part[j] = part[j] + load_elem(t, p->dy, go + j) * round_elem(t, x * s);
        }
#undef RMS_G
    }
    return FAD_OK;
}

fad_status fad_xent_bwd_check(const fad_xent_bwd_params *p, char *msg, size_t msg_len)
{
    if (bad_etype(p->etype))
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "xent_bwd: unknown element type");
    if (p->rows < 0 || p->cols <= 0 || p->ldx < p->cols || p->lddx < p->cols)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "xent_bwd: rows >= 0, cols > 0 and row "
                        "strides >= cols expected");
    if (p->rows > 0 && (!p->x || !p->lse || !p->g || !p->dx))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "xent_bwd: a NULL operand");
    return FAD_OK;
}

fad_status fad_xent_bwd_cpu(const fad_xent_bwd_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_xent_bwd_check(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    for (int64_t r = 0; r < p->rows; r++) {
        const float g = p->g[r], lse = p->lse[r];
        const int64_t t = p->target ? p->target[r] : -1;
        for (int64_t j = 0; j < p->cols; j++) {
            float v = g * expf(load_elem(p->etype, p->x, r * p->ldx + j) - lse);
            if (j == t)
                v = v - g;
            store_elem(p->etype, p->dx, r * p->lddx + j, v);
        }
    }
    return FAD_OK;
}
