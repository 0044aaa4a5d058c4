/*
 * fad_bwd_cpu.c — the backward pass on the CPU, in plain C, fp32 accumulation.
 *
 * For one (sequence, query head h, row i) with its keys [lo, hi) (fad_row_keys):
 *   p_ij  = exp2(s_ij - lse_i * log2 e)        s_ij: the forward's log2 logit
 *   z_ij  = rp if dropout keeps (i, j), else 0  (1 without dropout)
 *   Delta = sum_d dout_i[d] * out_i[d]         (= sum_j p_ij dp_ij, dropout or not)
 *   dp_ij = z_ij (dout_i . v_j),   ds_ij = p_ij (dp_ij - Delta) d(score)/d(q.k)
 *   dq_i += ds_ij k_j,      dk_j += ds_ij q_i,      dv_j += z_ij p_ij dout_i
 * Orders are fixed by position: keys increasing for dq_i; for dk/dv of a kv
 * head, the query heads of its group increasing, then rows increasing. Nothing
 * depends on the rest of the batch, so gradients are batch-invariant.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fad_internal.h"
#include "fad_math.h"
#include "fad_seq.h"

typedef struct bwd_ctx {
    const fad_bwd_params *bp;
    const fad_score_mod *mod;
    const fad_dropout *drop;
    load_fn load;
    fad_seq seq;
    int hk;           /* kv head */
    const float *kf, *vf; /* (len_k, D) fp32 keys/values of this (sequence, kv head) */
    float *dk, *dv;   /* (len_k, D) fp32 accumulators of this (sequence, kv head) */
} bwd_ctx;

/* Loads D elements of a half-precision row into fp32. */
static void load_row(const bwd_ctx *c, const uint16_t *src, float *dst, int D)
{
    for (int d = 0; d < D; d++)
        dst[d] = c->load(src[d]);
}

static float dot(const float *a, const float *b, int D)
{
    float s = 0.f;
    for (int d = 0; d < D; d++)
        s = FAD_FMA(a[d], b[d], s);
    return s;
}

/* One query row: accumulates into c->dk / c->dv and writes dq_i (unless only dK/dV are asked). */
static void row_backward(const bwd_ctx *c, int b, int h, int i)
{
    const fad_fwd_params *p = &c->bp->fwd;
    const int D = p->head_dim;
    const fad_seq *seq = &c->seq;
    const int64_t q_at = seq->q_off + i * p->q_row_stride + h * p->q_head_stride;
    const int64_t o_at = seq->o_off + i * p->out_row_stride + h * p->out_head_stride;
    float q[FAD_MAX_HEAD_DIM], dout[FAD_MAX_HEAD_DIM], o[FAD_MAX_HEAD_DIM];
    float dq[FAD_MAX_HEAD_DIM];

    load_row(c, (const uint16_t *)p->q + q_at, q, D);
    load_row(c, (const uint16_t *)c->bp->dout + o_at, dout, D);
    load_row(c, (const uint16_t *)p->out + o_at, o, D);
    memset(dq, 0, sizeof(float) * D);

    const float lse = p->softmax_lse[seq->row0 + h * fad_lse_head_stride(p) + i];
    const fad_key_range r = fad_row_keys(i, seq->len_q, seq->len_k, p->window_left, p->window_right);
    if (lse != -INFINITY) { /* a row that saw no key has no gradient */
        const float lse2 = FAD_MUL(lse, FAD_LOG2E), delta = dot(dout, o, D);
        const float slope_log2 = fad_alibi_slope_log2(p, b, h);
        for (int j = r.lo; j < r.hi; j++) {
            const float *kj = c->kf + (int64_t)j * D, *vj = c->vf + (int64_t)j * D;
            const float qk = dot(q, kj, D);
            float s2 = FAD_MUL(qk, c->mod->scale_log2);
            if (c->mod->has_mod) {
                s2 = fad_logit(c->mod, qk);
                if (p->alibi_slopes)
                    s2 = FAD_ADD(s2, fad_alibi_log2(slope_log2, i, j, seq->len_q, seq->len_k));
            }
            const float pij = fad_exp2(s2 - lse2);
            float dp = dot(dout, vj, D), pv = pij; /* pv: what dv_j sees of p_ij */
            if (c->drop->on) {
                const int kept = fad_dropout_keep(c->drop, h, i + seq->len_k - seq->len_q, j);
                dp = kept ? FAD_MUL(dp, c->drop->rp) : 0.f;
                pv = kept ? FAD_MUL(pij, c->drop->rp) : 0.f;
            }
            const float ds = fad_ds(pij, dp, delta, fad_logit_grad(c->mod, p->softmax_scale, qk));
            float *dkj = c->dk + (int64_t)(j)*D, *dvj = c->dv + (int64_t)(j)*D;
            for (int d = 0; d < D; d++) {
                dq[d] = FAD_FMA(ds, kj[d], dq[d]);
                dkj[d] = FAD_FMA(ds, q[d], dkj[d]);
                dvj[d] = FAD_FMA(pv, dout[d], dvj[d]);
            }
        }
    }
    if (c->bp->part == FAD_BWD_DKDV) /* (the CPU computes both parts; it writes one) */
        return;
    uint16_t *dst = (uint16_t *)c->bp->dq + q_at;
    for (int d = 0; d < D; d++)
        dst[d] = p->dtype == FAD_BFLOAT16 ? fad_float_to_bf16(dq[d]) : fad_float_to_fp16(dq[d]);
}

static void store_rows(const fad_fwd_params *p, uint16_t *dst, int64_t row_stride,
                       const float *src, int rows)
{
    const int D = p->head_dim;
    for (int j = 0; j < rows; j++)
        for (int d = 0; d < D; d++) {
            const float x = src[(int64_t)j * D + d];
            dst[(int64_t)j * row_stride + d] =
                p->dtype == FAD_BFLOAT16 ? fad_float_to_bf16(x) : fad_float_to_fp16(x);
        }
}

fad_status fad_bwd_cpu(const fad_bwd_params *bp, char *msg, size_t msg_len)
{
    fad_status st = fad_bwd_check_run(bp, msg, msg_len);
    if (st != FAD_OK || fad_fwd_is_empty(&bp->fwd))
        return st;
    fad_fwd_params fwd = fad_fwd_resolve(&bp->fwd);
    st = fad_check_seqlens_host(&fwd, msg, msg_len);
    if (st != FAD_OK)
        return st;
    fad_bwd_params rp = *bp;
    rp.fwd = fwd;
    const fad_fwd_params *p = &rp.fwd;

    const fad_score_mod mod = fad_make_score_mod(p->softmax_scale, p->softcap, p->alibi_slopes != NULL);
    fad_dropout drop = {0}; /* sequence b's, set per sequence below (its seq_id) */
    const int D = p->head_dim, group = p->num_heads / p->num_heads_k;
    float *acc = malloc(sizeof(float) * 2 * (size_t)(p->seqlen_k > 0 ? p->seqlen_k : 1) * D);
    float *kv = fad_kv_buffer(p);
    if (!acc || !kv) {
        free(acc), free(kv);
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "seqlen_k: out of host memory for the backward");
    }
    bwd_ctx c = {.bp = &rp, .mod = &mod, .drop = &drop,
                 .load = p->dtype == FAD_BFLOAT16 ? fad_bf16_to_float : fad_fp16_to_float};
    for (int b = 0; b < p->batch; b++) {
        c.seq = fad_get_seq(p, b);
        drop = fad_dropout_of(p, b);
        for (c.hk = 0; c.hk < p->num_heads_k; c.hk++) {
            c.dk = acc, c.dv = acc + (size_t)c.seq.len_k * D;
            c.kf = kv, c.vf = kv + (size_t)c.seq.len_k * D;
            fad_load_kv_head(p, &c.seq, c.hk, c.load, kv, kv + (size_t)c.seq.len_k * D);
            memset(acc, 0, sizeof(float) * 2 * (size_t)c.seq.len_k * D);
            for (int h = c.hk * group; h < (c.hk + 1) * group; h++)
                for (int i = 0; i < c.seq.len_q; i++)
                    row_backward(&c, b, h, i);
            if (rp.part == FAD_BWD_DQ)
                continue;
            store_rows(p, (uint16_t *)rp.dk + c.seq.k_off + c.hk * p->k_head_stride, p->k_row_stride,
                       c.dk, c.seq.len_k);
            store_rows(p, (uint16_t *)rp.dv + c.seq.v_off + c.hk * p->v_head_stride, p->v_row_stride,
                       c.dv, c.seq.len_k);
        }
    }
    free(acc), free(kv);
    return FAD_OK;
}
