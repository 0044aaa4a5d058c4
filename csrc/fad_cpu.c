/*
 * fad_cpu.c — the forward pass on the CPU, in plain C, on the same split plan
 * as the kernels: per row, splits at absolute key positions, FAD_CPU_TILE-key
 * tiles inside a split with a fresh online-softmax state, splits merged left
 * to right with fad_merge_*. fp32 accumulation; fp16/bf16 in and out.
 *
 * It is the reference for the semantics in CI and the path a user without a
 * GPU gets. Work is cut into items of (sequence, kv head, block of query
 * positions), every query head of the kv head's group in one item so that a
 * key tile is converted to fp32 once for all of them; threads take items
 * (cpu/threads.c). A row's bits come from its own chain of tiles and splits
 * alone (docs/design.md, "cpu-path"): they depend neither on the batch, nor on
 * the item it falls in, nor on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
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


/* --- the forward's work items ------------------------------------------- */

/* Query positions per item: about 64 rows with the group's heads, so that a
 * converted key tile serves many rows (1 at decode: the group's heads only). */
#define FWD_ROWS 64
/* The most a thread spends on one (sequence, kv head)'s keys in fp32. */
#define FWD_CACHE_BYTES ((int64_t)64 << 20)

typedef struct fwd_ctx {
    const fad_fwd_params *p;
    const fad_cpu_kernels *k;
    fad_score_mod mod;
    int split_size, D, Dp, group, bq, q_blocks, bf16;
    int cache_keys; /* > 0: each thread keeps its last (sequence, kv head)'s keys in fp32 */
    int64_t lse_head_stride;
} fwd_ctx;

/* One thread's scratch, carved from its block (fwd_carve). */
typedef struct fwd_scratch {
    int64_t *held;      /* 1 + the (sequence, kv head) whose tiles kc/vc hold, 0: none */
    float *kc, *vc;     /* cache_keys keys: per tile transposed (Dp x T) / rows (T x Dp) */
    unsigned char *done; /* per tile: converted */
    float *q, *s, *os, *orow, *ox, *krows, *kt, *vrows; /* rows x Dp, rows x T, .. */
    float *ms, *ls, *mr, *lr, *mx, *lx;                 /* per row */
    fad_key_range *range;
    int *first, *end;
    const uint16_t **qrows; /* where each row's q lives */
} fwd_scratch;

static size_t fwd_carve(const fwd_ctx *c, char *base, fwd_scratch *w)
{
    const size_t R = (size_t)fad_cpu_pad_rows(c->group * c->bq), Dp = (size_t)c->Dp,
                 T = FAD_CPU_TILE;
    size_t at = 0;
#define CARVE_(field, type, n) FAD_CPU_CARVE(w, base, at, field, type, n)
    CARVE_(held, int64_t, 1); /* (first: the header fad_cpu_parallel zeroes) */
    CARVE_(kc, float, (size_t)c->cache_keys * Dp);
    CARVE_(vc, float, (size_t)c->cache_keys * Dp);
    CARVE_(done, unsigned char, (size_t)c->cache_keys / T);
    CARVE_(q, float, R * Dp);
    CARVE_(s, float, R * T);
    CARVE_(os, float, R * Dp);
    CARVE_(orow, float, R * Dp);
    CARVE_(ox, float, R * Dp);
    CARVE_(krows, float, T * Dp);
    CARVE_(kt, float, T * Dp);
    CARVE_(vrows, float, T * Dp);
    CARVE_(ms, float, R);
    CARVE_(ls, float, R);
    CARVE_(mr, float, R);
    CARVE_(lr, float, R);
    CARVE_(mx, float, R);
    CARVE_(lx, float, R);
    CARVE_(range, fad_key_range, R);
    CARVE_(first, int, R);
    CARVE_(end, int, R);
    CARVE_(qrows, const uint16_t *, R);
#undef CARVE_
    return at;
}

/* Key rows [t0, t1) of kv head hk in fp32: vt (T x Dp, zero past t1) and kt,
 * the keys transposed (Dp x T). */
static void load_kv_tile(const fwd_ctx *c, const fad_seq *seq, int hk, int t0, int t1,
                         const fwd_scratch *w, float *kt, float *vt)
{
    const fad_fwd_params *p = c->p;
    const uint16_t *K = (const uint16_t *)p->k + hk * p->k_head_stride;
    const uint16_t *V = (const uint16_t *)p->v + hk * p->v_head_stride;
    const uint16_t *kr[FAD_CPU_TILE], *vr[FAD_CPU_TILE];
    for (int j = 0; j < FAD_CPU_TILE; j++) {
        int64_t ko = 0, vo = 0; /* pages were checked (fad_check_seqlens_host) */
        if (t0 + j < t1)
            fad_kv_row(p, seq, t0 + j, &ko, &vo);
        kr[j] = t0 + j < t1 ? K + ko : NULL;
        vr[j] = t0 + j < t1 ? V + vo : NULL;
    }
    c->k->load_rows(kr, FAD_CPU_TILE, c->D, c->Dp, c->bf16, w->krows, c->Dp);
    c->k->load_rows(vr, FAD_CPU_TILE, c->D, c->Dp, c->bf16, vt, c->Dp);
    c->k->transpose(w->krows, c->Dp, kt);
}

/* Row r's scores of the tile [t0, t1) -> its probabilities (in place) and its
 * online-softmax step; a row the tile does not concern gets zeros (skipped by
 * acc_rows). */
static void row_tile(const fwd_ctx *c, const fwd_scratch *w, const fad_dropout *drop, int b,
                     int h, int i, int len_q, int len_k, int r, int t0, int t1)
{
    const fad_fwd_params *p = c->p;
    const fad_key_range kr = w->range[r];
    float *s = w->s + (int64_t)r * FAD_CPU_TILE;
    const int lo = kr.lo > t0 ? kr.lo - t0 : 0, hi = kr.hi < t1 ? kr.hi - t0 : t1 - t0;
    for (int j = 0; j < lo; j++) /* masked keys: -inf, the identity of the step */
        s[j] = -INFINITY;
    for (int j = hi; j < FAD_CPU_TILE; j++)
        s[j] = -INFINITY;
    if (c->mod.has_mod) {
        const float slope_log2 = fad_alibi_slope_log2(p, b, h);
        for (int j = lo; j < hi; j++) {
            s[j] = fad_logit(&c->mod, s[j]);
            if (p->alibi_slopes)
                s[j] = FAD_ADD(s[j], fad_alibi_log2(slope_log2, i, t0 + j, len_q, len_k));
        }
    }
    const float es = c->mod.exp_scale, mt = c->k->tile_max(s);
    float mnew, scale = fad_rescale(w->ms[r], FAD_MUL(mt, es), &mnew);
    const float psum = c->k->probs(s, es, fad_exp_base(mnew));
    /* (l sums every p: dropout only thins what reaches o) */
    for (int j = lo; drop->on && j < hi; j++)
        if (s[j] != 0.f && !fad_dropout_keep(drop, h, i + len_k - len_q, t0 + j))
            s[j] = 0.f;
    if (scale != 1.f) {
        float *o = w->os + (int64_t)r * c->Dp;
        for (int d = 0; d < c->D; d++)
            o[d] = FAD_MUL(o[d], scale);
    }
    w->ls[r] = FAD_FMA(w->ls[r], scale, psum);
    w->ms[r] = mnew;
}

/* A row's merged result in the two-level order of its splits (fad_math.h,
 * FAD_MERGE_GROUP; docs/design.md, "merge-groups"): R (m, l, o) the current
 * group's chain, X the chain of the groups before it. */
typedef struct row_fold {
    float *m, *l, *o;    /* R */
    float *mx, *lx, *ox; /* X */
} row_fold;

static void row_fold_start(row_fold f, int Dp)
{
    *f.m = *f.mx = -INFINITY, *f.l = *f.lx = 0.f;
    memset(f.o, 0, sizeof(float) * Dp);
    memset(f.ox, 0, sizeof(float) * Dp);
}

/* dst <- X (+) R (fad_outer_*); dst is X or R */
static void row_fold_outer(row_fold f, float *m, float *l, float *o, int Dp)
{
    const fad_outer_w w = fad_outer_weights(*f.mx, *f.m);
    for (int d = 0; d < Dp; d++)
        o[d] = fad_outer_value(f.ox[d], f.o[d], w);
    *l = fad_outer_value(*f.lx, *f.l, w);
    *m = w.w.m;
}

/* R <- R (+) split sp (its state ms, ls, os), the merge every path shares; where
 * sp closes its group and the row's splits go on (to end), X <- X (+) R and R
 * starts empty. */
static void row_fold_split(const fad_cpu_kernels *k, row_fold f, float ms, float ls,
                           const float *os, int sp, int end, int Dp)
{
    const fad_merge_w mw = fad_merge_weights(*f.m, ms);
    k->merge(f.o, os, mw.wa, mw.wb, Dp);
    *f.l = fad_merge_value(*f.l, ls, mw);
    *f.m = mw.m;
    if (fad_group_closes(sp) && sp + 1 < end) {
        row_fold_outer(f, f.mx, f.lx, f.ox, Dp);
        *f.m = -INFINITY, *f.l = 0.f;
        memset(f.o, 0, sizeof(float) * Dp);
    }
}

/* The row's splits are all folded: R <- X (+) R, its result (R itself while
 * X is empty: a row within one group). */
static void row_fold_end(row_fold f, int Dp)
{
    if (*f.mx != -INFINITY)
        row_fold_outer(f, f.m, f.l, f.o, Dp);
}

static row_fold row_fold_of(const fwd_scratch *w, int r, int Dp)
{
    const row_fold f = {w->mr + r, w->lr + r, w->orow + (int64_t)r * Dp,
                        w->mx + r, w->lx + r, w->ox + (int64_t)r * Dp};
    return f;
}

/* Item: sequence b, kv head hk, query positions [i0, i0 + bq) of every head of
 * the group; row r = g * nb + (i - i0) for head hk * group + g. */
static void fwd_item(void *ctx, int64_t item, void *scratch)
{
    const fwd_ctx *c = (const fwd_ctx *)ctx;
    const fad_fwd_params *p = c->p;
    /* the heaviest causal blocks (the last positions) first */
    const int qb = c->q_blocks - 1 - (int)(item % c->q_blocks);
    const int hk = (int)(item / c->q_blocks % p->num_heads_k);
    const int b = (int)(item / c->q_blocks / p->num_heads_k);
    const fad_seq seq = fad_get_seq(p, b);
    const int i0 = qb * c->bq, len_q = seq.len_q, len_k = seq.len_k, D = c->D, Dp = c->Dp;
    if (i0 >= len_q)
        return;
    const int nb = i0 + c->bq < len_q ? c->bq : len_q - i0, nrows = c->group * nb;
    const int R = fad_cpu_pad_rows(nrows), T = FAD_CPU_TILE, S = c->split_size;
    const fad_dropout drop = fad_dropout_of(p, b);
    fwd_scratch w = {0};
    fwd_carve(c, (char *)scratch, &w);

    const uint16_t **qr = w.qrows, *Q = (const uint16_t *)p->q;
    int sp_lo = 0, sp_hi = 0;
    for (int r = 0; r < R; r++) {
        const int g = r / nb, i = i0 + r % nb, h = hk * c->group + g;
        qr[r] = r < nrows ? Q + seq.q_off + i * p->q_row_stride + h * p->q_head_stride : NULL;
        if (r >= nrows)
            continue;
        w.range[r] = fad_row_keys(i, len_q, len_k, p->window_left, p->window_right);
        w.first[r] = fad_first_split(w.range[r], S);
        w.end[r] = fad_end_split(w.range[r], S);
        row_fold_start(row_fold_of(&w, r, Dp), Dp);
        sp_lo = r == 0 || w.first[r] < sp_lo ? w.first[r] : sp_lo;
        sp_hi = r == 0 || w.end[r] > sp_hi ? w.end[r] : sp_hi;
    }
    c->k->load_rows(qr, R, D, Dp, c->bf16, w.q, Dp);

    for (int sp = sp_lo; sp < sp_hi; sp++) {
        /* Fresh state for every split of every row it concerns. */
        int ulo = len_k, uhi = 0;
        for (int r = 0; r < nrows; r++) {
            if (sp < w.first[r] || sp >= w.end[r])
                continue;
            w.ms[r] = -INFINITY, w.ls[r] = 0.f;
            memset(w.os + (int64_t)r * Dp, 0, sizeof(float) * Dp);
            ulo = w.range[r].lo < ulo ? w.range[r].lo : ulo;
            uhi = w.range[r].hi > uhi ? w.range[r].hi : uhi;
        }
        const fad_key_range keys = fad_split_keys(sp, S);
        const int k1 = keys.hi < len_k ? keys.hi : len_k;
        for (int t0 = keys.lo; t0 < k1; t0 += T) {
            const int t1 = t0 + T < k1 ? t0 + T : k1;
            if (t1 <= ulo || t0 >= uhi) /* no row sees a key of it */
                continue;
            float *kt = w.kt, *vt = w.vrows;
            if (c->cache_keys) { /* converted once per thread for all the head's items */
                const int64_t tile = t0 / T, held = item / c->q_blocks + 1;
                if (*w.held != held) {
                    memset(w.done, 0, (size_t)c->cache_keys / T);
                    *w.held = held;
                }
                kt = w.kc + tile * T * Dp, vt = w.vc + tile * T * Dp;
                if (!w.done[tile])
                    load_kv_tile(c, &seq, hk, t0, t1, &w, kt, vt);
                w.done[tile] = 1;
            } else {
                load_kv_tile(c, &seq, hk, t0, t1, &w, kt, vt);
            }
            c->k->dots(w.q, Dp, R, kt, D, w.s);
            for (int r = 0; r < R; r++) {
                const int in = r < nrows && sp >= w.first[r] && sp < w.end[r] &&
                               t1 > w.range[r].lo && t0 < w.range[r].hi;
                if (!in) { /* fully masked for this row: the identity */
                    memset(w.s + (int64_t)r * T, 0, sizeof(float) * T);
                    continue;
                }
                row_tile(c, &w, &drop, b, hk * c->group + r / nb, i0 + r % nb, len_q, len_k, r,
                         t0, t1);
            }
            c->k->acc_rows(w.s, R, t1 - t0, vt, Dp, Dp, w.os, Dp);
        }
        for (int r = 0; r < nrows; r++)
            if (sp >= w.first[r] && sp < w.end[r])
                row_fold_split(c->k, row_fold_of(&w, r, Dp), w.ms[r], w.ls[r],
                               w.os + (int64_t)r * Dp, sp, w.end[r], Dp);
    }
    for (int r = 0; r < nrows; r++)
        row_fold_end(row_fold_of(&w, r, Dp), Dp);

    uint16_t *O = (uint16_t *)p->out;
    for (int r = 0; r < nrows; r++) {
        const int h = hk * c->group + r / nb, i = i0 + r % nb;
        c->k->store_scaled(w.orow + (int64_t)r * Dp, fad_out_scale(w.lr[r], drop.rp), D, c->bf16,
                           O + seq.o_off + i * p->out_row_stride + h * p->out_head_stride);
        if (p->softmax_lse)
            p->softmax_lse[seq.row0 + h * c->lse_head_stride + i] = fad_lse(w.mr[r], w.lr[r]);
    }
}

fad_status fad_cpu_fold_splits(const float *m, const float *l, const float *o, int first, int n,
                               int D, float *out, char *msg, size_t msg_len)
{
    if (n < 0 || first < 0 || first > 0x7fffffff - n || D <= 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "first, n, D: splits [%d, %d + %d) of %d values",
                        first, first, n, D);
    const int Dp = fad_cpu_pad_d(D);
    float *buf = (float *)calloc((size_t)3 * Dp + 4, sizeof(float));
    if (!buf)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "out of host memory");
    float *os = buf + 2 * Dp, *ml = buf + 3 * Dp;
    const row_fold f = {ml, ml + 1, buf, ml + 2, ml + 3, buf + Dp};
    const fad_cpu_kernels *k = fad_cpu_kernels_get();
    row_fold_start(f, Dp);
    for (int s = 0; s < n; s++) {
        memcpy(os, o + (int64_t)s * D, sizeof(float) * D);
        row_fold_split(k, f, m[s], l[s], os, first + s, first + n, Dp);
    }
    row_fold_end(f, Dp);
    out[0] = *f.m, out[1] = *f.l;
    memcpy(out + 2, f.o, sizeof(float) * D);
    free(buf);
    return FAD_OK;
}

fad_status fad_fwd_cpu(const fad_fwd_params *params, char *msg, size_t msg_len)
{
    fad_plan plan;
    fad_status st = fad_fwd_check_call(params, 0, msg, msg_len);
    if (st != FAD_OK || fad_fwd_is_empty(params))
        return st;
    const fad_fwd_params resolved = fad_fwd_resolve(params), *p = &resolved;
    fad_make_plan(p, 0, &plan);

    fwd_ctx c;
    c.p = p;
    c.k = fad_cpu_kernels_get();
    c.mod = fad_make_score_mod(p->softmax_scale, p->softcap, p->alibi_slopes != NULL);
    c.split_size = plan.split_size;
    c.D = p->head_dim, c.Dp = fad_cpu_pad_d(p->head_dim);
    c.group = p->num_heads / p->num_heads_k;
    c.bq = c.group >= FWD_ROWS ? 1 : FWD_ROWS / c.group;
    if (c.bq > p->seqlen_q)
        c.bq = p->seqlen_q > 0 ? p->seqlen_q : 1;
    c.q_blocks = (p->seqlen_q + c.bq - 1) / c.bq;
    c.bf16 = p->dtype == FAD_BFLOAT16;
    c.lse_head_stride = fad_lse_head_stride(p);
    /* Items of one (sequence, kv head) follow each other: a thread that takes
     * several reuses its converted keys, where they fit in FWD_CACHE_BYTES. */
    const int64_t cache_keys = ((int64_t)p->seqlen_k + FAD_CPU_TILE - 1) / FAD_CPU_TILE * FAD_CPU_TILE;
    c.cache_keys = c.q_blocks > 1 && cache_keys * c.Dp * 2 * (int64_t)sizeof(float) <= FWD_CACHE_BYTES
                       ? (int)cache_keys : 0;
    const int64_t items = (int64_t)p->batch * p->num_heads_k * c.q_blocks;
    if (fad_cpu_parallel(p->num_threads, items, fwd_carve(&c, NULL, NULL), fwd_item, &c))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "out of host memory for the CPU forward");
    return FAD_OK;
}
