/*
 * fad_cpu.c — the forward pass on the CPU, in plain C, on the same split plan
 * as the kernels: per row, splits at absolute key positions, FAD_BLOCK_N-key
 * tiles inside a split with a fresh online-softmax state, splits merged left
 * to right with fad_merge_*. fp32 accumulation; fp16/bf16 in and out.
 *
 * It is the reference for the semantics in CI and the path a user without a
 * GPU gets. Each row is computed alone, so its bits cannot depend on the batch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fad_internal.h"
#include "fad_math.h"
#include "fad_seq.h"

/* --- fp16 / bf16 <-> fp32, round to nearest even ------------------------- */

float fad_bf16_to_float(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fad_float_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it quiet */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fad_fp16_to_float(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man) { /* subnormal: value = man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t fad_float_to_fp16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00u;               /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00u;              /* rounds to inf */
    if (a < 0x38800000u) {                                    /* fp16 subnormal or zero */
        float af;
        memcpy(&af, &a, 4);
        return sign | (uint16_t)lrintf(af * 16777216.0f);     /* units of 2^-24, RNE */
    }
    uint32_t r = a + 0x0fffu + ((a >> 13) & 1u);              /* RNE at bit 13 */
    return sign | (uint16_t)((r - 0x38000000u) >> 13);
}


/* --- one row ------------------------------------------------------------- */

typedef struct row_ctx {
    const fad_fwd_params *p;
    const fad_score_mod *mod;
    const fad_dropout *drop;
    load_fn load;
    int split_size;
    int len_q, len_k; /* the current sequence's */
} row_ctx;

/* Runs the plan for query row i of (b, h) and writes out/lse. q holds the row
 * in fp32; kf/vf hold the sequence's keys/values of the row's kv head in fp32,
 * (len_k, D) row-major (converted once per head: conversions are exact, so this
 * changes no bit, only the time). */
static void attend_row(const row_ctx *c, int b, int h, int i, const float *q, const float *kf,
                       const float *vf, uint16_t *out, float *lse)
{
    const fad_fwd_params *p = c->p;
    const int D = p->head_dim;
    const float slope_log2 = fad_alibi_slope_log2(p, b, h);

    fad_key_range r = fad_row_keys(i, c->len_q, c->len_k, p->window_left, p->window_right);
    float mr = -INFINITY, lr = 0.f, orow[FAD_MAX_HEAD_DIM]; /* merged state R */
    float os[FAD_MAX_HEAD_DIM], s[FAD_BLOCK_N];
    memset(orow, 0, sizeof(float) * D);

    int s_end = fad_end_split(r, c->split_size);
    for (int sp = fad_first_split(r, c->split_size); sp < s_end; sp++) {
        /* Fresh state for every split. */
        float ms = -INFINITY, ls = 0.f;
        memset(os, 0, sizeof(float) * D);
        const fad_key_range keys = fad_split_keys(sp, c->split_size);
        const int k0 = keys.lo, k1 = keys.hi < c->len_k ? keys.hi : c->len_k;
        for (int t0 = k0; t0 < k1; t0 += FAD_BLOCK_N) {
            int t1 = t0 + FAD_BLOCK_N < k1 ? t0 + FAD_BLOCK_N : k1;
            if (t1 <= r.lo || t0 >= r.hi) /* fully masked tile: the identity */
                continue;
            float mt = -INFINITY;
            for (int j = t0; j < t1; j++) {
                float x = -INFINITY;
                if (j >= r.lo && j < r.hi) {
                    const float *kr = kf + (int64_t)j * D;
                    float dot = 0.f;
                    for (int d = 0; d < D; d++)
                        dot = FAD_FMA(q[d], kr[d], dot);
                    x = dot;
                    if (c->mod->has_mod) {
                        x = fad_logit(c->mod, dot);
                        if (p->alibi_slopes)
                            x = FAD_ADD(x, fad_alibi_log2(slope_log2, i, j, c->len_q, c->len_k));
                    }
                }
                s[j - t0] = x;
                mt = fmaxf(mt, x);
            }
            const float es = c->mod->exp_scale;
            float mnew, scale = fad_rescale(ms, FAD_MUL(mt, es), &mnew), base = fad_exp_base(mnew);
            float psum = 0.f;
            for (int d = 0; d < D; d++)
                os[d] = FAD_MUL(os[d], scale);
            for (int j = t0; j < t1; j++) {
                float pj = fad_exp_score(s[j - t0], es, base);
                psum += pj; /* (l sums every p: dropout only thins what reaches o) */
                if (pj == 0.f)
                    continue;
                if (c->drop->on && !fad_dropout_keep(c->drop, h, i + c->len_k - c->len_q, j))
                    continue;
                const float *vr = vf + (int64_t)j * D;
                for (int d = 0; d < D; d++)
                    os[d] = FAD_FMA(pj, vr[d], os[d]);
            }
            ls = FAD_FMA(ls, scale, psum);
            ms = mnew;
        }
        /* R <- R (+) split, the merge every path shares. */
        fad_merge_w w = fad_merge_weights(mr, ms);
        for (int d = 0; d < D; d++)
            orow[d] = fad_merge_value(orow[d], os[d], w);
        lr = fad_merge_value(lr, ls, w);
        mr = w.m;
    }

    float inv = fad_out_scale(lr, c->drop->rp);
    int bf16 = p->dtype == FAD_BFLOAT16;
    for (int d = 0; d < D; d++) {
        float y = FAD_MUL(orow[d], inv);
        out[d] = bf16 ? fad_float_to_bf16(y) : fad_float_to_fp16(y);
    }
    if (lse)
        *lse = fad_lse(mr, lr);
}

float *fad_kv_buffer(const fad_fwd_params *p)
{
    const size_t rows = p->seqlen_k > 0 ? (size_t)p->seqlen_k : 1;
    return malloc(sizeof(float) * 2 * rows * p->head_dim);
}

void fad_load_kv_head(const fad_fwd_params *p, const fad_seq *seq, int hk, load_fn load,
                      float *kf, float *vf)
{
    const int D = p->head_dim;
    const uint16_t *K = (const uint16_t *)p->k + hk * p->k_head_stride;
    const uint16_t *V = (const uint16_t *)p->v + hk * p->v_head_stride;
    for (int j = 0; j < seq->len_k; j++) {
        int64_t ko, vo; /* pages were checked (fad_check_seqlens_host) */
        fad_kv_row(p, seq, j, &ko, &vo);
        for (int d = 0; d < D; d++) {
            kf[(int64_t)j * D + d] = load(K[ko + d]);
            vf[(int64_t)j * D + d] = load(V[vo + d]);
        }
    }
}

/* Paged: every page holding one of sequence b's cache rows [start, end) must exist. */
static fad_status check_pages(const fad_fwd_params *p, int b, int start, int end, char *msg,
                              size_t msg_len)
{
    for (int x = start / p->page_size * p->page_size; x < end; x += p->page_size) {
        const int pg = p->block_table[(int64_t)b * p->block_table_stride + x / p->page_size];
        if (pg < 0 || pg >= p->kv_batch)
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "block_table: sequence %d names block %d (slot %d), outside the "
                            "cache's %d", b, pg, x / p->page_size, p->kv_batch);
    }
    return FAD_OK;
}

/* Host-side cu_seqlens are checked in full (on the GPU they are trusted, and a
 * sequence that points outside the tensors is skipped, see fad_seq.h). */
fad_status fad_check_seqlens_host(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    for (int b = 0; p->cache_seqlens && b < p->batch; b++) {
        const int kb = p->block_table ? 0 : p->cache_batch_idx ? p->cache_batch_idx[b] : b;
        const int start = p->cache_leftpad ? p->cache_leftpad[b] : 0, end = p->cache_seqlens[b];
        if (!p->block_table && (kb < 0 || kb >= p->kv_batch))
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "cache_batch_idx: sequence %d names cache entry %d of %d", b, kb,
                            p->kv_batch);
        if (end < 0 || end > p->seqlen_k)
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "cache_seqlens: sequence %d ends at %d, outside the cache's %d rows", b,
                            end, p->seqlen_k);
        if (start < 0 || start > end)
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "cache_leftpad: sequence %d starts at %d, must be in [0, %d]", b, start,
                            end);
        if (p->block_table && check_pages(p, b, start, end, msg, msg_len) != FAD_OK)
            return FAD_ERR_VALUE;
    }
    if (!p->cu_seqlens_q)
        return FAD_OK;
    if (p->cu_seqlens_q[0] != 0 || p->cu_seqlens_k[0] != 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "cu_seqlens_q, cu_seqlens_k: must start at 0");
    for (int b = 0; b < p->batch; b++) {
        const int32_t *cq = p->cu_seqlens_q + b, *ck = p->cu_seqlens_k + b;
        if (cq[1] < cq[0] || cq[1] > p->total_q || cq[1] - cq[0] > p->seqlen_q)
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "cu_seqlens_q: sequence %d has rows [%d, %d): must be increasing, within "
                            "q's %d rows and at most max_seqlen_q=%d long",
                            b, cq[0], cq[1], p->total_q, p->seqlen_q);
        if (ck[1] < ck[0] || (!p->block_table && ck[1] > p->total_k) ||
            ck[1] - ck[0] > p->seqlen_k)
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "cu_seqlens_k: sequence %d has rows [%d, %d): must be increasing, within "
                            "k's %d rows and at most %s=%d long", b, ck[0], ck[1], p->total_k,
                            p->block_table ? "the block table's capacity" : "max_seqlen_k",
                            p->seqlen_k);
        if (p->seqused_k && (p->seqused_k[b] < 0 || p->seqused_k[b] > ck[1] - ck[0]))
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "seqused_k: sequence %d uses %d keys, must be in [0, %d]", b,
                            p->seqused_k[b], ck[1] - ck[0]);
        const int used = p->seqused_k ? p->seqused_k[b] : ck[1] - ck[0];
        if (p->block_table && check_pages(p, b, 0, used, msg, msg_len) != FAD_OK)
            return FAD_ERR_VALUE;
    }
    return FAD_OK;
}

fad_status fad_fwd_cpu(const fad_fwd_params *params, char *msg, size_t msg_len)
{
    fad_plan plan;
    fad_status st = fad_fwd_check_call(params, 0, msg, msg_len);
    if (st != FAD_OK)
        return st;
    const fad_fwd_params resolved = fad_fwd_resolve(params), *p = &resolved;
    fad_make_plan(p, 0, &plan);

    fad_score_mod mod = fad_make_score_mod(p->softmax_scale, p->softcap, p->alibi_slopes != NULL);
    fad_dropout drop = {0}; /* sequence b's, set per sequence below (its seq_id) */
    row_ctx c = {p, &mod, &drop, p->dtype == FAD_BFLOAT16 ? fad_bf16_to_float : fad_fp16_to_float,
                 plan.split_size, 0, 0};
    const int D = p->head_dim, group = p->num_heads / p->num_heads_k;
    const int64_t lse_head_stride = fad_lse_head_stride(p);
    const uint16_t *Q = (const uint16_t *)p->q;
    uint16_t *O = (uint16_t *)p->out;
    float q[FAD_MAX_HEAD_DIM];
    float *kv = fad_kv_buffer(p);
    if (!kv)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "seqlen_k: out of host memory");

    for (int b = 0; b < p->batch; b++) {
        const fad_seq seq = fad_get_seq(p, b);
        drop = fad_dropout_of(p, b);
        c.len_q = seq.len_q, c.len_k = seq.len_k;
        for (int hk = 0; hk < p->num_heads_k; hk++) {
            float *kf = kv, *vf = kv + (size_t)seq.len_k * D;
            fad_load_kv_head(p, &seq, hk, c.load, kf, vf);
            for (int h = hk * group; h < (hk + 1) * group; h++)
                for (int i = 0; i < seq.len_q; i++) {
                    const uint16_t *qr = Q + seq.q_off + i * p->q_row_stride + h * p->q_head_stride;
                    for (int d = 0; d < D; d++)
                        q[d] = c.load(qr[d]);
                    attend_row(&c, b, h, i, q, kf, vf,
                               O + seq.o_off + i * p->out_row_stride + h * p->out_head_stride,
                               p->softmax_lse ? p->softmax_lse + seq.row0 + h * lse_head_stride + i
                                              : NULL);
                }
        }
    }
    free(kv);
    return FAD_OK;
}
