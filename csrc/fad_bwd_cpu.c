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
 * head, the query heads of its group increasing, then rows increasing; terms
 * whose factor is exactly zero (keys outside [lo, hi) among them) are skipped
 * (cpu/kernels.inc). Nothing depends on the rest of the batch, so gradients
 * are batch-invariant.
 *
 * Work items are (sequence, kv head): one thread walks the group's query heads,
 * their rows in blocks of BWD_ROWS and each block's key tiles, so both orders
 * hold whichever thread runs the item (docs/design.md, "cpu-path").
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "fad_internal.h"
#include "fad_math.h"
#include "fad_seq.h"

#define BWD_ROWS 64
/* Keys per dK/dV item when the backward runs in two passes (bwd_pass). */
#define BWD_KEYS 256

typedef struct bwd_ctx {
    const fad_bwd_params *bp;
    const fad_cpu_kernels *k;
    fad_score_mod mod;
    int D, Dp, group, bf16, key_rows; /* key_rows: seqlen_k rounded up to whole tiles */
    int64_t lse_head_stride;
    /* BWD_BOTH: items (sequence, kv head), dq and dk/dv in one walk. With fewer of those
     * than threads, two passes: BWD_DKDV, items (sequence, kv head, BWD_KEYS keys), then
     * BWD_DQ, items (sequence, query head, BWD_ROWS rows). The same chains either way. */
    enum { BWD_BOTH, BWD_DKDV, BWD_DQ } pass;
    int key_blocks, row_blocks;
} bwd_ctx;

typedef struct bwd_scratch {
    int64_t *held; /* 1 + the (sequence, kv head) whose keys krows/kt/vt hold, 0: none */
    float *krows, *kt, *vt, *dk, *dv; /* the item's keys: key_rows x Dp; kt/vt per tile Dp x T */
    float *q, *dout, *dq, *s, *dp, *ds, *pv; /* a block's rows: BWD_ROWS x Dp or x T */
    float *delta, *lse2;
    fad_key_range *range;
} bwd_scratch;

static size_t bwd_carve(const bwd_ctx *c, char *base, bwd_scratch *w)
{
    const size_t K = (size_t)c->key_rows, Dp = (size_t)c->Dp, R = BWD_ROWS, T = FAD_CPU_TILE;
    size_t at = 0;
#define CARVE_(field, type, n) FAD_CPU_CARVE(w, base, at, field, type, n)
    CARVE_(held, int64_t, 1); /* (first: the header fad_cpu_parallel zeroes) */
    CARVE_(krows, float, K * Dp);
    CARVE_(kt, float, K * Dp);
    CARVE_(vt, float, K * Dp);
    CARVE_(dk, float, K * Dp);
    CARVE_(dv, float, K * Dp);
    CARVE_(q, float, R * Dp);
    CARVE_(dout, float, R * Dp);
    CARVE_(dq, float, R * Dp);
    CARVE_(s, float, R * T);
    CARVE_(dp, float, R * T);
    CARVE_(ds, float, R * T);
    CARVE_(pv, float, R * T);
    CARVE_(delta, float, R);
    CARVE_(lse2, float, R);
    CARVE_(range, fad_key_range, R);
#undef CARVE_
    return at;
}

/* Sequence b's keys and values of kv head hk in fp32: keys row by row (for dq)
 * and both transposed per tile (for S and dP); rows past len_k are zero. Kept
 * for the thread's next item of the same head. */
static void load_keys(const bwd_ctx *c, const fad_seq *seq, int b, int hk, const bwd_scratch *w)
{
    const int64_t held = (int64_t)b * c->bp->fwd.num_heads_k + hk + 1;
    if (*w->held == held)
        return;
    *w->held = held;
    const fad_fwd_params *p = &c->bp->fwd;
    const uint16_t *K = (const uint16_t *)p->k + hk * p->k_head_stride;
    const uint16_t *V = (const uint16_t *)p->v + hk * p->v_head_stride;
    const int T = FAD_CPU_TILE, Dp = c->Dp;
    for (int t0 = 0; t0 < seq->len_k; t0 += T) {
        const uint16_t *kr[FAD_CPU_TILE], *vr[FAD_CPU_TILE];
        for (int j = 0; j < T; j++) {
            int64_t ko = 0, vo = 0;
            if (t0 + j < seq->len_k)
                fad_kv_row(p, seq, t0 + j, &ko, &vo);
            kr[j] = t0 + j < seq->len_k ? K + ko : NULL;
            vr[j] = t0 + j < seq->len_k ? V + vo : NULL;
        }
        float *rows = w->krows + (int64_t)t0 * Dp;
        c->k->load_rows(kr, T, c->D, Dp, c->bf16, rows, Dp);
        c->k->transpose(rows, Dp, w->kt + (int64_t)t0 * Dp);
        c->k->load_rows(vr, T, c->D, Dp, c->bf16, w->dq, Dp); /* (dq: free until the rows) */
        c->k->transpose(w->dq, Dp, w->vt + (int64_t)t0 * Dp);
    }
}

/* dS and the P dV sees for row r of tile [t0, t1), with a score mod or dropout. */
static void row_ds_general(const bwd_ctx *c, const bwd_scratch *w, const fad_dropout *drop,
                           int b, int h, int i, const fad_seq *seq, int r, int t0, int lo, int hi)
{
    const fad_fwd_params *p = &c->bp->fwd;
    const float slope_log2 = fad_alibi_slope_log2(p, b, h);
    const float *s = w->s + (int64_t)r * FAD_CPU_TILE, *dps = w->dp + (int64_t)r * FAD_CPU_TILE;
    float *ds = w->ds + (int64_t)r * FAD_CPU_TILE, *pvs = w->pv + (int64_t)r * FAD_CPU_TILE;
    for (int jj = 0; jj < FAD_CPU_TILE; jj++) {
        if (jj < lo || jj >= hi) {
            ds[jj] = pvs[jj] = 0.f;
            continue;
        }
        const int j = t0 + jj;
        const float qk = s[jj];
        float s2 = FAD_MUL(qk, c->mod.scale_log2);
        if (c->mod.has_mod) {
            s2 = fad_logit(&c->mod, qk);
            if (p->alibi_slopes)
                s2 = FAD_ADD(s2, fad_alibi_log2(slope_log2, i, j, seq->len_q, seq->len_k));
        }
        const float pij = fad_exp2(s2 - w->lse2[r]);
        float dp = dps[jj], pv = pij;
        if (drop->on) {
            const int kept = fad_dropout_keep(drop, h, i + seq->len_k - seq->len_q, j);
            dp = kept ? FAD_MUL(dp, drop->rp) : 0.f;
            pv = kept ? FAD_MUL(pij, drop->rp) : 0.f;
        }
        ds[jj] = fad_ds(pij, dp, w->delta[r], fad_logit_grad(&c->mod, p->softmax_scale, qk));
        pvs[jj] = pv;
    }
}

static void store_rows(const bwd_ctx *c, uint16_t *dst, int64_t row_stride, const float *src,
                       int rows)
{
    for (int j = 0; j < rows; j++) /* (x * 1 is x: the rounding alone) */
        c->k->store_scaled(src + (int64_t)j * c->Dp, 1.f, c->D, c->bf16, dst + (int64_t)j * row_stride);
}

/* Rows [i0, i0 + nb) of query head h against keys [klo, khi) (klo on a tile):
 * their dq (do_dq), and their terms of dk/dv (do_dkdv). */
static void bwd_block(const bwd_ctx *c, const bwd_scratch *w, const fad_dropout *drop, int b,
                      int h, const fad_seq *seq, int i0, int nb, int klo, int khi, int do_dq,
                      int do_dkdv)
{
    const fad_bwd_params *bp = c->bp;
    const fad_fwd_params *p = &bp->fwd;
    const int D = c->D, Dp = c->Dp, R = fad_cpu_pad_rows(nb), T = FAD_CPU_TILE;
    const uint16_t *qr[BWD_ROWS], *dor[BWD_ROWS], *orr[BWD_ROWS];
    for (int r = 0; r < R; r++) {
        const int64_t q_at = seq->q_off + (int64_t)(i0 + r) * p->q_row_stride + h * p->q_head_stride;
        const int64_t o_at = seq->o_off + (int64_t)(i0 + r) * p->out_row_stride + h * p->out_head_stride;
        qr[r] = r < nb ? (const uint16_t *)p->q + q_at : NULL;
        dor[r] = r < nb ? (const uint16_t *)bp->dout + o_at : NULL;
        orr[r] = r < nb ? (const uint16_t *)p->out + o_at : NULL;
    }
    c->k->load_rows(qr, R, D, Dp, c->bf16, w->q, Dp);
    c->k->load_rows(dor, R, D, Dp, c->bf16, w->dout, Dp);
    c->k->load_rows(orr, R, D, Dp, c->bf16, w->dq, Dp); /* out, for Delta; dq is zeroed below */
    int ulo = seq->len_k, uhi = 0;
    for (int r = 0; r < nb; r++) {
        const float lse = p->softmax_lse[seq->row0 + h * c->lse_head_stride + i0 + r];
        const float *o = w->dq + (int64_t)r * Dp, *dout = w->dout + (int64_t)r * Dp;
        float delta = 0.f;
        for (int d = 0; d < D; d++)
            delta = FAD_FMA(dout[d], o[d], delta);
        w->delta[r] = delta;
        w->lse2[r] = FAD_MUL(lse, FAD_LOG2E);
        w->range[r] = fad_row_keys(i0 + r, seq->len_q, seq->len_k, p->window_left, p->window_right);
        if (lse == -INFINITY) /* a row that saw no key has no gradient */
            w->range[r].lo = w->range[r].hi = 0;
        if (w->range[r].lo < w->range[r].hi) {
            ulo = w->range[r].lo < ulo ? w->range[r].lo : ulo;
            uhi = w->range[r].hi > uhi ? w->range[r].hi : uhi;
        }
    }
    memset(w->dq, 0, sizeof(float) * (size_t)R * Dp);
    const int fast = !c->mod.has_mod && !drop->on;
    if (uhi > khi)
        uhi = khi;
    for (int t0 = ulo / T * T > klo ? ulo / T * T : klo; t0 < uhi; t0 += T) {
        const int t1 = t0 + T < seq->len_k ? t0 + T : seq->len_k;
        c->k->dots(w->q, Dp, R, w->kt + (int64_t)t0 * Dp, D, w->s);
        c->k->dots(w->dout, Dp, R, w->vt + (int64_t)t0 * Dp, D, w->dp);
        for (int r = 0; r < R; r++) {
            const fad_key_range kr = r < nb ? w->range[r] : (fad_key_range){0, 0};
            const int lo = kr.lo > t0 ? kr.lo - t0 : 0, hi = kr.hi < t1 ? kr.hi - t0 : t1 - t0;
            if (lo >= hi) {
                memset(w->ds + (int64_t)r * T, 0, sizeof(float) * T);
                memset(w->pv + (int64_t)r * T, 0, sizeof(float) * T);
            } else if (fast) {
                c->k->bwd_ds(w->s + (int64_t)r * T, w->dp + (int64_t)r * T, lo, hi,
                             c->mod.scale_log2, w->lse2[r], w->delta[r], p->softmax_scale,
                             w->ds + (int64_t)r * T, w->pv + (int64_t)r * T);
            } else {
                row_ds_general(c, w, drop, b, h, i0 + r, seq, r, t0, lo, hi);
            }
        }
        if (do_dq)
            c->k->acc_rows(w->ds, R, t1 - t0, w->krows + (int64_t)t0 * Dp, Dp, Dp, w->dq, Dp);
        if (do_dkdv) {
            c->k->acc_cols(w->ds, R, w->q, Dp, Dp, w->dk + (int64_t)t0 * Dp, Dp);
            c->k->acc_cols(w->pv, R, w->dout, Dp, Dp, w->dv + (int64_t)t0 * Dp, Dp);
        }
    }
    if (!do_dq)
        return;
    store_rows(c, (uint16_t *)bp->dq + seq->q_off + (int64_t)i0 * p->q_row_stride +
                      h * p->q_head_stride, p->q_row_stride, w->dq, nb);
}

static void bwd_item(void *ctx, int64_t item, void *scratch)
{
    const bwd_ctx *c = (const bwd_ctx *)ctx;
    const fad_bwd_params *bp = c->bp;
    const fad_fwd_params *p = &bp->fwd;
    const int Dp = c->Dp, dq = bp->part != FAD_BWD_DKDV, dkdv = bp->part != FAD_BWD_DQ;
    bwd_scratch w = {0};
    bwd_carve(c, (char *)scratch, &w);
    if (c->pass == BWD_DQ) { /* rows [i0, i0 + BWD_ROWS) of query head h */
        const int qb = (int)(item % c->row_blocks), h = (int)(item / c->row_blocks % p->num_heads);
        const int b = (int)(item / c->row_blocks / p->num_heads);
        const fad_seq seq = fad_get_seq(p, b);
        const fad_dropout drop = fad_dropout_of(p, b);
        const int i0 = qb * BWD_ROWS;
        if (i0 >= seq.len_q)
            return;
        load_keys(c, &seq, b, h / c->group, &w);
        bwd_block(c, &w, &drop, b, h, &seq, i0, seq.len_q - i0 < BWD_ROWS ? seq.len_q - i0 : BWD_ROWS,
                  0, seq.len_k, 1, 0);
        return;
    }
    /* BWD_BOTH: every key of kv head hk; BWD_DKDV: keys [k0, k1) */
    const int blocks = c->pass == BWD_DKDV ? c->key_blocks : 1;
    const int kb = (int)(item % blocks), hk = (int)(item / blocks % p->num_heads_k);
    const int b = (int)(item / blocks / p->num_heads_k);
    const fad_seq seq = fad_get_seq(p, b);
    const fad_dropout drop = fad_dropout_of(p, b);
    const int k0 = c->pass == BWD_DKDV ? kb * BWD_KEYS : 0;
    const int k1 = c->pass == BWD_DKDV && k0 + BWD_KEYS < seq.len_k ? k0 + BWD_KEYS : seq.len_k;
    if (c->pass == BWD_DKDV && k0 >= seq.len_k)
        return;
    load_keys(c, &seq, b, hk, &w);
    /* the accumulators of keys [k0, k1), to the end of their last tile */
    const int64_t zero_rows = (k1 - k0 + FAD_CPU_TILE - 1) / FAD_CPU_TILE * FAD_CPU_TILE;
    memset(w.dk + (int64_t)k0 * Dp, 0, sizeof(float) * (size_t)zero_rows * Dp);
    memset(w.dv + (int64_t)k0 * Dp, 0, sizeof(float) * (size_t)zero_rows * Dp);
    for (int h = hk * c->group; h < (hk + 1) * c->group; h++)
        for (int i0 = 0; i0 < seq.len_q; i0 += BWD_ROWS)
            bwd_block(c, &w, &drop, b, h, &seq, i0,
                      seq.len_q - i0 < BWD_ROWS ? seq.len_q - i0 : BWD_ROWS, k0, k1,
                      c->pass == BWD_BOTH && dq, dkdv);
    if (!dkdv)
        return;
    store_rows(c, (uint16_t *)bp->dk + seq.k_off + hk * p->k_head_stride + (int64_t)k0 * p->k_row_stride,
               p->k_row_stride, w.dk + (int64_t)k0 * Dp, k1 - k0);
    store_rows(c, (uint16_t *)bp->dv + seq.v_off + hk * p->v_head_stride + (int64_t)k0 * p->v_row_stride,
               p->v_row_stride, w.dv + (int64_t)k0 * Dp, k1 - k0);
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

    bwd_ctx c;
    c.bp = &rp;
    c.k = fad_cpu_kernels_get();
    c.mod = fad_make_score_mod(p->softmax_scale, p->softcap, p->alibi_slopes != NULL);
    c.D = p->head_dim, c.Dp = fad_cpu_pad_d(p->head_dim);
    c.group = p->num_heads / p->num_heads_k;
    c.bf16 = p->dtype == FAD_BFLOAT16;
    c.key_rows = (p->seqlen_k + FAD_CPU_TILE - 1) / FAD_CPU_TILE * FAD_CPU_TILE;
    if (c.key_rows == 0)
        c.key_rows = FAD_CPU_TILE;
    c.lse_head_stride = fad_lse_head_stride(p);
    c.key_blocks = (p->seqlen_k + BWD_KEYS - 1) / BWD_KEYS;
    c.row_blocks = (p->seqlen_q + BWD_ROWS - 1) / BWD_ROWS;
    const size_t scratch = bwd_carve(&c, NULL, NULL);
    const int64_t heads = (int64_t)p->batch * p->num_heads_k;
    /* Two passes cost two more products a tile pair; worth it only for idle threads. */
    const int two = heads < p->num_threads && (c.key_blocks > 1 || c.row_blocks > 1);
    int fail = 0;
    if (!two) {
        c.pass = BWD_BOTH;
        fail = fad_cpu_parallel(p->num_threads, heads, scratch, bwd_item, &c);
    } else {
        c.pass = BWD_DKDV;
        if (rp.part != FAD_BWD_DQ)
            fail = fad_cpu_parallel(p->num_threads, heads * c.key_blocks, scratch, bwd_item, &c);
        c.pass = BWD_DQ;
        if (!fail && rp.part != FAD_BWD_DKDV)
            fail = fad_cpu_parallel(p->num_threads, (int64_t)p->batch * p->num_heads * c.row_blocks,
                                    scratch, bwd_item, &c);
    }
    if (fail)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "seqlen_k: out of host memory for the CPU backward");
    return FAD_OK;
}
