/*
 * fad_core.c — argument checks, the split plan and the public entry points
 * that do not depend on where the math runs.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fad_internal.h"
#include "fad_math.h"
#include "fad_seq.h"

fad_status fad_fail(fad_status st, char *msg, size_t msg_len, const char *fmt, ...)
{
    if (msg && msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, msg_len, fmt, ap);
        va_end(ap);
    }
    return st;
}

const char *fad_status_string(fad_status s)
{
    switch (s) {
    case FAD_OK: return "ok";
    case FAD_ERR_DTYPE: return "wrong dtype";
    case FAD_ERR_VALUE: return "bad shape, stride or value";
    case FAD_ERR_ALIGNMENT: return "misaligned pointer or stride";
    case FAD_ERR_UNSUPPORTED: return "not supported";
    case FAD_ERR_WORKSPACE: return "workspace missing or too small";
    case FAD_ERR_NO_CUDA: return "built without CUDA";
    case FAD_ERR_CUDA: return "CUDA error";
    }
    return "unknown status";
}

void fad_fwd_params_init(fad_fwd_params *p)
{
    memset(p, 0, sizeof(*p));
    p->dtype = FAD_BFLOAT16;
    p->window_left = -1;
    p->window_right = -1;
    p->deterministic = 1;
    p->split_size = FAD_DEFAULT_SPLIT_SIZE;
    p->schedule = FAD_SCHEDULE_AUTO;
}

/* Checks in a fixed order: sizes, head dim, pointers, strides, options. */
fad_status fad_fwd_check(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    if (!p)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "params: NULL");
    if (p->dtype != FAD_FLOAT16 && p->dtype != FAD_BFLOAT16)
        return fad_fail(FAD_ERR_DTYPE, msg, msg_len, "dtype: expected float16 or bfloat16");
    if (p->batch < 0 || p->seqlen_q < 0 || p->seqlen_k < 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "batch, seqlen_q, seqlen_k: must be >= 0 (got %d, %d, %d)",
                        p->batch, p->seqlen_q, p->seqlen_k);
    if (p->num_heads <= 0 || p->num_heads_k <= 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "num_heads, num_heads_k: must be > 0 (got %d, %d)",
                        p->num_heads, p->num_heads_k);
    if (p->num_heads % p->num_heads_k)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "num_heads_k: query heads (%d) must be a multiple of key/value heads (%d)",
                        p->num_heads, p->num_heads_k);
    if (p->head_dim > FAD_MAX_HEAD_DIM) /* (its own message: the Python API pads the rest) */
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "head_dim: must be at most %d (got %d)",
                        FAD_MAX_HEAD_DIM, p->head_dim);
    if (p->head_dim <= 0 || p->head_dim % 8)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "head_dim: must be a multiple of 8 in [8, %d] (got %d)", FAD_MAX_HEAD_DIM,
                        p->head_dim);
    if (!(p->softmax_scale >= 0.f) || !isfinite(p->softmax_scale))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "softmax_scale: must be finite and >= 0 (0 = 1/sqrt(head_dim)), got %g",
                        (double)p->softmax_scale);
    if (!(p->softcap >= 0.f) || !isfinite(p->softcap))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "softcap: must be finite and >= 0 (got %g)",
                        (double)p->softcap);
    if (!(p->dropout_p >= 0.f && p->dropout_p < 1.f))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "dropout_p: must be in [0, 1) (got %g)",
                        (double)p->dropout_p);
    if (p->dropout_p > 0.f && p->block_table)
        return fad_fail(FAD_ERR_UNSUPPORTED, msg, msg_len,
                        "dropout_p: dropout is not supported with block_table (paged KV)");
    if (p->window_left < -1 || p->window_right < -1)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "window_size: entries must be -1 (unbounded) or >= 0 (got (%d, %d))",
                        p->window_left, p->window_right);
    if (p->causal && p->window_right != 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "causal: requires window_right == 0 (causal is window_size=(left, 0))");
    if (p->alibi_batch_stride != 0 && p->alibi_batch_stride < p->num_heads)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "alibi_slopes: batch stride %lld < num_heads %d",
                        (long long)p->alibi_batch_stride, p->num_heads);
    if (!p->cu_seqlens_q != !p->cu_seqlens_k)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "cu_seqlens_q, cu_seqlens_k: give both (variable-length batch) or neither");
    if ((p->cache_batch_idx || p->cache_leftpad) && !p->cache_seqlens)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "cache_batch_idx, cache_leftpad: need cache_seqlens");
    if (p->cache_seqlens && p->cu_seqlens_q)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "cache_seqlens: a KV cache takes a padded batch, not cu_seqlens");
    if (p->cache_seqlens && p->kv_batch < 0)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "kv_batch: must be >= 0 (got %d)", p->kv_batch);
    if (p->block_table && !p->cache_seqlens && !p->cu_seqlens_k)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "block_table: needs cache_seqlens (a KV cache) or cu_seqlens_k (varlen)");
    if (p->block_table && p->cache_batch_idx)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "block_table: cannot be combined with cache_batch_idx");
    if (p->block_table && (p->page_size <= 0 || p->page_size % 16 || p->seqlen_k % p->page_size))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "page_size: must be a positive multiple of 16 dividing seqlen_k = "
                        "max_blocks * page_size (got %d, seqlen_k %d)", p->page_size, p->seqlen_k);
    if (p->block_table && p->batch > 1 && p->block_table_stride < p->seqlen_k / p->page_size)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "block_table_stride: must be >= max_blocks = %d (got %d)",
                        p->seqlen_k / p->page_size, p->block_table_stride);
    if (p->seqused_k && !p->cu_seqlens_k)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "seqused_k: needs cu_seqlens_k");
    if (p->cu_seqlens_q && (p->total_q < 0 || p->total_k < 0))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "total_q, total_k: must be >= 0 (got %d, %d)",
                        p->total_q, p->total_k);
    if (p->split_size <= 0 || p->split_size % FAD_SPLIT_QUANTUM || p->split_size > FAD_MAX_SPLIT_SIZE)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "split_size: must be a positive multiple of %d, at most %d (got %d)",
                        FAD_SPLIT_QUANTUM, FAD_MAX_SPLIT_SIZE, p->split_size);
    if (p->schedule < FAD_SCHEDULE_AUTO || p->schedule > FAD_SCHEDULE_CTA_PER_SPLIT)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "schedule: unknown value %d", (int)p->schedule);
    return FAD_OK;
}

int fad_fwd_is_empty(const fad_fwd_params *p)
{
    return p->batch == 0 || p->seqlen_q == 0 || (p->cu_seqlens_q && p->total_q == 0);
}

/* The run entries need real tensors; the workspace query does not. */
static fad_status check_pointers(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    if (fad_fwd_is_empty(p))
        return FAD_OK; /* empty tensors may have NULL data */
    if (!p->q || !p->out)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "q, out: NULL pointer");
    if ((p->cu_seqlens_k ? p->total_k : p->seqlen_k) > 0 && (!p->k || !p->v))
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "k, v: NULL pointer");
    return FAD_OK;
}

fad_status fad_fwd_check_run(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    fad_status st = fad_fwd_check(p, msg, msg_len);
    return st != FAD_OK ? st : check_pointers(p, msg, msg_len);
}

/* The default softmax scale, head_dim ** -0.5 as Python computes it (in double, then
 * rounded once to float when it crosses into the params), so that a C caller asking for
 * the default gets the bits a Python caller gets. 1/sqrtf in float is off by one ulp at
 * D = 24, 72, 96, ... ; sqrt and / in double are IEEE-exact (correctly rounded), so this
 * is the same float on every platform; it equals float(D ** -0.5) (glibc's pow) at
 * every D from 1 to 4096, and tests/test_capi.py compares the forward's bits. */
float fad_default_softmax_scale(int head_dim)
{
    return (float)(1.0 / sqrt((double)head_dim));
}

fad_fwd_params fad_fwd_resolve(const fad_fwd_params *p)
{
    fad_fwd_params r = *p;
    if (r.softmax_scale == 0.f)
        r.softmax_scale = fad_default_softmax_scale(r.head_dim);
    return r;
}

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

/* Which forward kernel runs. The packed kernel (GQA heads packed into M)
 * gives every row the bits the prefill kernel gives it -- same tiles, same
 * order, same code (cuda/fwd_tile.cuh) -- so it may be chosen from the shapes alone.
 * It runs query blocks of at most FAD_PACKED_MAX_SQ rows (decode, speculative
 * and short chunks): there it reads a kv head's K/V ceil(Sq*G/16) <= G times
 * where the prefill kernel reads it G times (once per query head), and its MMAs
 * cover ceil(Sq*G/16) 16-row tiles per kv head instead of G tiles of
 * fad_block_m rows. Only shapes enter (seqlen_q, heads): the choice, and with
 * it the workspace size, never depends on lengths or contents.
 * FLASH_ATTN_DET_FWD_KERNEL=packed|prefill in the environment (read per call)
 * pins the kernel, so that tests can compare the two on the same call. */
static int use_packed_kernel(const fad_fwd_params *p)
{
    const long long rows = (long long)p->seqlen_q * (p->num_heads / p->num_heads_k);
    if (rows > (1LL << 30)) /* the packed kernel indexes rows with int */
        return 0;
    if (p->dropout_p > 0.f) /* dropout runs on the prefill kernels only */
        return 0;
    const char *force = getenv("FLASH_ATTN_DET_FWD_KERNEL");
    if (force && !strcmp(force, "packed"))
        return 1;
    if (force && !strcmp(force, "prefill"))
        return 0;
    return p->seqlen_q <= FAD_PACKED_MAX_SQ;
}

void fad_make_plan(const fad_fwd_params *p, int num_sms, fad_plan *plan)
{
    memset(plan, 0, sizeof(*plan));
    long long ctas;
    plan->packed = use_packed_kernel(p);
    if (plan->packed) {
        const long long rows = (long long)p->seqlen_q * (p->num_heads / p->num_heads_k);
        plan->m_blocks = (int)((rows + fad_packed_block_m() - 1) / fad_packed_block_m());
        ctas = (long long)p->batch * p->num_heads_k * plan->m_blocks;
    } else {
        const int block_m = fad_block_m(p->head_dim);
        plan->m_blocks = (p->seqlen_q + block_m - 1) / block_m;
        ctas = (long long)p->batch * p->num_heads * plan->m_blocks;
    }
    int len_k = p->seqlen_k > 0 ? p->seqlen_k : 1;

    if (p->deterministic) {
        /* The plan is split_size, full stop: nothing about the batch enters it. */
        plan->split_size = p->split_size;
    } else if (num_sms <= 0 || ctas <= 0 || ctas >= num_sms) {
        /* Fast mode with a full grid: one split per row, no merges at all. */
        plan->split_size = round_up(len_k, FAD_SPLIT_QUANTUM);
    } else if (plan->packed) {
        /* Fast-mode decode with idle SMs: it streams K/V at memory speed only
         * with many CTAs in flight, so about 8 per SM, in splits of at least
         * 512 keys and at most 32 of them (each is a partial the combine folds,
         * one after the other). Two waves, as below, left B8 at 81% of the copy
         * bandwidth where deterministic mode's 512-key plan reaches 91%. */
        long long want = (8LL * num_sms + ctas - 1) / ctas;
        long long most = (len_k + 511) / 512;
        if (most > 32) most = 32;
        if (want > most) want = most;
        plan->split_size = round_up((int)((len_k + want - 1) / want), FAD_SPLIT_QUANTUM);
    } else {
        /* Fast-mode prefill with idle SMs: about two waves of split CTAs. */
        int want = (int)((2LL * num_sms + ctas - 1) / ctas);
        int most = (len_k + FAD_SPLIT_QUANTUM - 1) / FAD_SPLIT_QUANTUM;
        if (want > most) want = most;
        if (want > 128) want = 128;
        plan->split_size = round_up((len_k + want - 1) / want, FAD_SPLIT_QUANTUM);
    }
    plan->num_splits = fad_num_splits(p->seqlen_k, plan->split_size);

    size_t rows = (size_t)fad_flat_rows(p);
    size_t o_bytes = (size_t)plan->num_splits * rows * p->head_dim * sizeof(float);
    size_t ml_bytes = (size_t)plan->num_splits * rows * 2 * sizeof(float);

    switch (p->schedule) {
    case FAD_SCHEDULE_ONE_CTA: plan->cta_per_split = 0; break;
    case FAD_SCHEDULE_CTA_PER_SPLIT: plan->cta_per_split = plan->num_splits > 0; break;
    default: {
        /* Spreading splits over CTAs never changes bits; do it when the grid
         * would leave SMs idle and the partials stay small. The packed (decode)
         * kernel streams K/V and its CTAs fit two an SM, so a grid of one to
         * two CTAs an SM leaves some SMs with two and others with one: split
         * below 1.9 CTAs an SM, where a CTA per split measured 1.07-1.18x the
         * one-CTA schedule at 136-192 CTAs (H100, 132 SMs) and 0.95-0.97x at
         * 256-512 (docs/design.md, "split-plan").
         * One CTA per kv head also wins for same-length batches from 0.8 to 1
         * CTA an SM, where its grid lands one CTA an SM and each walks a whole
         * row at the bandwidth of a copy (deterministic mode, H200, num_splits
         * = 1 against the CTA per split: 1.03-1.11x at 0.85-0.97 CTAs an SM,
         * 0.76-0.94x at 0.61-0.73). With mixed lengths a long sequence's splits
         * would queue in one CTA (0.59-0.60x), so only a call whose shapes give
         * every length (no cache_seqlens, cu_seqlens_k or seqused_k: every
         * sequence has seqlen_k keys) gets it; num_splits = 1 asks for it on
         * any call (docs/design.md, "split-plan"). */
        const long long split_below = plan->packed ? (long long)num_sms * 19 / 10 : num_sms;
        const int lengths_known = !p->cache_seqlens && !p->cu_seqlens_k && !p->seqused_k;
        const int one_cta_even = p->deterministic && plan->packed && lengths_known &&
                                 ctas * 5 >= (long long)num_sms * 4 && ctas <= num_sms;
        plan->cta_per_split = num_sms > 0 && plan->num_splits > 1 && ctas < split_below && !one_cta_even &&
                              o_bytes + ml_bytes <= FAD_MAX_WORKSPACE_BYTES;
    }
    }
    /* A ready flag per split CTA (grid x: at most m_blocks x B x Hq), for
     * a combine that folds each split as soon as its CTA is done. */
    size_t flag_bytes = (size_t)plan->num_splits * plan->m_blocks * p->batch * p->num_heads * sizeof(int);
    /* A row of more than FAD_MERGE_GROUP splits is folded in two levels
     * (docs/design.md, "merge-groups"), which the combine runs and, of the
     * one-CTA walks, only fwd_kernel's kGroups variant (its X slots; the
     * others' tile loops stay free of group logic). Such a plan takes a CTA
     * per split where asked, or, asked for nothing, where its partials stay
     * within FAD_GROUPS_CTA_MAX_WORKSPACE; else (num_splits = 1, a forced
     * one-CTA schedule, a long prefill) that variant, on the prefill kernel's
     * row blocks. Every schedule folds in the same order: no bit changes. */
    if (plan->num_splits > FAD_MERGE_GROUP) {
        if (p->schedule == FAD_SCHEDULE_AUTO)
            plan->cta_per_split = /* (+ 512: the offsets' alignment below) */
                o_bytes + ml_bytes + flag_bytes + 512 <= FAD_GROUPS_CTA_MAX_WORKSPACE;
        if (!plan->cta_per_split) {
            if (plan->packed) {
                plan->packed = 0;
                plan->m_blocks = (p->seqlen_q + fad_block_m(p->head_dim) - 1) / fad_block_m(p->head_dim);
            }
            /* a slot for every warp that can be resident; none on the CPU path */
            plan->x_slots = num_sms > 0 ? FAD_X_WARPS_PER_SM * num_sms : 0;
            plan->workspace_bytes = fad_x_flag_offset(plan->x_slots) + (size_t)plan->x_slots * sizeof(unsigned);
        }
    }
    if (plan->cta_per_split) {
        plan->ws_o_offset = 0;
        plan->ws_ml_offset = (o_bytes + 255) / 256 * 256;
        plan->ws_flag_offset = (plan->ws_ml_offset + ml_bytes + 255) / 256 * 256;
        plan->workspace_bytes = plan->ws_flag_offset + flag_bytes;
    }
}

/* FLASH_ATTN_DET_FWD_WS=0 in the environment (read once) runs fwd_kernel's
 * wgmma variant where the warp-specialized kernel would run at D64 and
 * mma.sync at D128 and D256 (so that fwd_kernel's D128 wgmma variant is not
 * compiled for an A/B alone): an A/B knob, like FLASH_ATTN_DET_WGMMA; the
 * bits are the same. */
static int ws_allowed(void)
{
    static int env = -1;
    if (env < 0) {
        const char *e = getenv("FLASH_ATTN_DET_FWD_WS");
        env = !(e && e[0] == '0');
    }
    return env;
}

/* The kernel a GPU forward runs (fad_plan.kernel), decided here once; fwd_launch.cu
 * follows it and refuses a kernel its variant does not build.
 *   - a one-CTA plan past FAD_MERGE_GROUP splits (X slots): fwd_kernel's kGroups variant;
 *   - the packed kernel where fad_make_plan packed the rows;
 *   - else the prefill kernels. Softcap/ALiBi and paged KV stay on mma.sync: their wgmma
 *     builds spilled 8-16 B at D128, and spills around in-flight wgmma are the suspect in
 *     the D64 failure (docs/design.md, "wgmma-limits"); so does D 192. A paged cache's
 *     prefill at D128 without dropout runs the warp-specialized kernel (FAD_WS_PAGED: its
 *     producer looks the rows up; the consumers' code is the same). Where the sm_90a
 *     kernels run (fad_use_wgmma), D128 and D256 take the warp-specialized kernel, D64 from
 *     FAD_WS_D64_MIN_SK keys (FAD_WS_D64_MIN_SK_FULL where no mask bounds rows on the right)
 *     and fwd_kernel's wgmma variant below; its shape by the longest sequence's keys:
 *     D128's narrow one up to FAD_WS_NARROW_MAX_SK (a CTA's prologue and epilogue weigh
 *     against few tiles), D64's lean one up to FAD_WS_D64_LEAN_MAX_SK, D256's long one from
 *     FAD_WS_D256_LONG_MIN_SK (rows fold often). Every kernel and shape gives each row the
 *     same bits. */
static fad_status plan_kernel(const fad_fwd_params *p, fad_plan *plan, char *msg, size_t msg_len)
{
    plan->kernel = FAD_FWD_MMA;
    if (plan->x_slots) {
        plan->kernel = FAD_FWD_GROUPS;
        return FAD_OK;
    }
    if (plan->packed) {
        plan->kernel = FAD_FWD_PACKED;
        return FAD_OK;
    }
    const int dim = fad_fwd_head_dim_bound(p->head_dim);
    const int plain = !fad_scores_modded(p) && !p->block_table;
    const int has_wg = plain && dim <= 128;               /* fwd_kernel's wgmma variant exists */
    const int ws256 = plain && dim == 256 && FAD_WG_WS && FAD_WS_D256;
    /* (paged: D128's warp-specialized kernel, without dropout, FAD_WS_PAGED) */
    const int ws_paged = !fad_scores_modded(p) && p->block_table && dim == 128 && !(p->dropout_p > 0.f) &&
                         FAD_WG_WS && FAD_WS_PAGED;
    const int ws = (has_wg && FAD_WG_WS && (dim == 128 || (dim == 64 && FAD_WS_D64_CONSUMERS))) || ws256 || ws_paged;
    if (!has_wg && !ws256 && !ws_paged)
        return FAD_OK;
    int wgmma = 0;
    const fad_status st = fad_use_wgmma(&wgmma, msg, msg_len);
    if (st != FAD_OK || !wgmma)
        return st;
    if (!ws) {
        plan->kernel = FAD_FWD_WGMMA;
        return FAD_OK;
    }
    const int sk = p->seqlen_k;
    if (!ws_allowed() || (dim == 64 && sk < (p->window_right >= 0 ? FAD_WS_D64_MIN_SK : FAD_WS_D64_MIN_SK_FULL))) {
        plan->kernel = dim == 64 ? FAD_FWD_WGMMA : FAD_FWD_MMA;
        return FAD_OK;
    }
    plan->kernel = FAD_FWD_WS_MAIN;
    if (dim == 128 && FAD_WS_NARROW_MAX_SK > 0 && sk <= FAD_WS_NARROW_MAX_SK)
        plan->kernel = FAD_FWD_WS_NARROW;
    else if (dim == 64 && FAD_WS_D64_LEAN_MAX_SK > 0 && sk <= FAD_WS_D64_LEAN_MAX_SK)
        plan->kernel = FAD_FWD_WS_LEAN;
    else if (dim == 256 && FAD_WS_D256_CONSUMERS > 1 && FAD_WS_D256_LONG_MIN_SK > 0 && sk >= FAD_WS_D256_LONG_MIN_SK)
        plan->kernel = FAD_FWD_WS_LONG;
    return FAD_OK;
}

/* A GPU call's plan: fad_make_plan on the current device, its kernel
 * (plan_kernel), and the pool of R slots of Hopper's D256 prefill kernel,
 * which keeps each consumer warp's merged result R in a slot of global memory
 * (one slot for every consumer warp that can be resident: one CTA an SM),
 * where that kernel runs a one-CTA plan. The workspace query and the call
 * both plan here, so they agree. */
static fad_status make_gpu_plan(const fad_fwd_params *p, fad_plan *plan, char *msg, size_t msg_len)
{
    int num_sms = 0;
    fad_status st = fad_cuda_num_sms(&num_sms, msg, msg_len);
    if (st != FAD_OK)
        return st;
    fad_make_plan(p, num_sms, plan);
    /* fwd_kernel's kGroups variant is built without dropout (fwd_prefill.cu, fwd_prefill_groups.cu):
     * refused by name before anything is allocated or written */
    if (plan->x_slots && p->dropout_p > 0.f)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "dropout_p: dropout over more than %d splits (seqlen_k %d > %lld keys at split_size %d) "
                        "runs on the CTA-per-split schedule only (num_splits > 1, or the automatic one where "
                        "its partials fit in %llu bytes), not on the one-CTA walk this call's plan takes; "
                        "use a larger split_size or no dropout",
                        FAD_MERGE_GROUP, p->seqlen_k, (long long)FAD_MERGE_GROUP * plan->split_size,
                        plan->split_size, (unsigned long long)FAD_GROUPS_CTA_MAX_WORKSPACE);
    st = plan_kernel(p, plan, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* D256's warp-specialized kernel folds into R slots (one a consumer warp, every
     * warp that can be resident: one CTA an SM), but not where each split CTA writes
     * its partial */
    const int ws = plan->kernel >= FAD_FWD_WS_MAIN;
    if (ws && fad_fwd_head_dim_bound(p->head_dim) == 256 && FAD_WS_D256_CONSUMERS > 1 && !plan->cta_per_split) {
        plan->r_slots = 4 * FAD_WS_D256_CONSUMERS * num_sms;
        plan->ws_r_offset = (plan->workspace_bytes + 255) / 256 * 256;
        plan->ws_r_flag_offset = plan->ws_r_offset + (size_t)plan->r_slots * FAD_WS_R_SLOT_FLOATS * sizeof(float);
        plan->workspace_bytes = plan->ws_r_flag_offset + (size_t)plan->r_slots * sizeof(unsigned);
    }
    return st;
}

fad_status fad_fwd_workspace_size(const fad_fwd_params *p, size_t *bytes, char *msg,
                                  size_t msg_len)
{
    fad_plan plan;
    fad_status st = fad_fwd_check(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (!bytes)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "bytes: NULL");
    st = make_gpu_plan(p, &plan, msg, msg_len);
    if (st != FAD_OK)
        return st;
    *bytes = plan.workspace_bytes;
    return FAD_OK;
}

/* The kernels move 16-byte chunks: every row of every tensor starts on one. */
static fad_status check_alignment(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    const void *ptrs[4] = {p->q, p->k, p->v, p->out};
    /* the stride of a dim of size 1 is never used */
    const int kv_batch = p->cache_seqlens || p->block_table ? p->kv_batch : p->batch;
    const int kv_rows = p->block_table ? p->page_size : p->seqlen_k; /* k/v dim 1 */
    const int sizes[4][3] = {{p->batch, p->seqlen_q, p->num_heads},
                             {kv_batch, kv_rows, p->num_heads_k},
                             {kv_batch, kv_rows, p->num_heads_k},
                             {p->batch, p->seqlen_q, p->num_heads}};
    const int64_t strides[4][3] = {
        {p->q_batch_stride, p->q_row_stride, p->q_head_stride},
        {p->k_batch_stride, p->k_row_stride, p->k_head_stride},
        {p->v_batch_stride, p->v_row_stride, p->v_head_stride},
        {p->out_batch_stride, p->out_row_stride, p->out_head_stride}};
    static const char *names[4] = {"q", "k", "v", "out"};
    for (int t = 0; t < 4; t++) {
        if ((uintptr_t)ptrs[t] % 16)
            return fad_fail(FAD_ERR_ALIGNMENT, msg, msg_len,
                            "%s: data pointer must be 16-byte aligned", names[t]);
        /* the kernels index inside a tile with 32-bit offsets (row * row_stride, row < 256) */
        if (sizes[t][1] > 1 && (strides[t][1] >= ((int64_t)1 << 23) || strides[t][1] < 0))
            return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                            "%s: row stride %lld is too large (limit 2^23 elements)", names[t],
                            (long long)strides[t][1]);
        for (int d = 0; d < 3; d++)
            if (sizes[t][d] > 1 && strides[t][d] % 8)
                return fad_fail(FAD_ERR_ALIGNMENT, msg, msg_len,
                                "%s: strides must be multiples of 8 elements (got %lld)", names[t],
                                (long long)strides[t][d]);
    }
    return FAD_OK;
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

fad_status fad_fwd_check_call(const fad_fwd_params *p, int on_gpu, char *msg, size_t msg_len)
{
    fad_status st = fad_fwd_check_run(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (on_gpu) {
        st = check_alignment(p, msg, msg_len);
        return st != FAD_OK || !p->check_indices ? st : fad_check_indices_cuda(p, msg, msg_len);
    }
    const fad_fwd_params resolved = fad_fwd_resolve(p);
    return fad_check_seqlens_host(&resolved, msg, msg_len);
}

fad_status fad_fwd_cuda(const fad_fwd_params *p, void *workspace, size_t workspace_bytes,
                        struct CUstream_st *stream, char *msg, size_t msg_len)
{
    fad_plan plan;
    fad_status st = fad_fwd_check_call(p, 1, msg, msg_len);
    if (st != FAD_OK)
        return st;
    st = make_gpu_plan(p, &plan, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (plan.workspace_bytes && (!workspace || workspace_bytes < plan.workspace_bytes))
        return fad_fail(FAD_ERR_WORKSPACE, msg, msg_len,
                        "workspace: needs %zu bytes, got %zu (ask fad_fwd_workspace_size)",
                        plan.workspace_bytes, workspace ? workspace_bytes : (size_t)0);
    if (fad_fwd_is_empty(p))
        return FAD_OK;
    const fad_fwd_params resolved = fad_fwd_resolve(p);
    return fad_fwd_cuda_launch(&resolved, &plan, workspace, stream, msg, msg_len);
}

/* ------------------------------------------------------------------------ */
/* Backward on the GPU                                                        */
/* ------------------------------------------------------------------------ */

/* The backward's workspace: the row sums (one fp32 per flat row), then what
 * the CUDA dispatch adds after them (the dQ accumulator and its semaphores
 * where FLASH_ATTN_DET_BWD_DQ=reduce applies, cuda/bwd_launch.cu). */
static fad_status bwd_workspace_need(const fad_bwd_params *p, size_t *bytes, char *msg, size_t msg_len)
{
    const size_t dsum = (size_t)fad_flat_rows(&p->fwd) * sizeof(float);
    size_t extra = 0;
    const fad_status st = fad_bwd_cuda_extra_bytes(p, dsum, &extra, msg, msg_len);
    *bytes = dsum + extra;
    return st;
}

fad_status fad_bwd_workspace_size(const fad_bwd_params *p, size_t *bytes, char *msg,
                                  size_t msg_len)
{
    if (!p || !bytes)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "params, bytes: NULL");
    fad_status st = fad_fwd_check(&p->fwd, msg, msg_len);
    if (st != FAD_OK)
        return st;
    return bwd_workspace_need(p, bytes, msg, msg_len);
}

/* The backward's checks on both paths: the forward's, what the backward does
 * not support, then the gradients' pointers (a call with no query row needs none). */
fad_status fad_bwd_check_run(const fad_bwd_params *bp, char *msg, size_t msg_len)
{
    if (!bp)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "params: NULL");
    const fad_fwd_params *p = &bp->fwd;
    fad_status st = fad_fwd_check_run(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (p->cache_seqlens || p->block_table)
        return fad_fail(FAD_ERR_UNSUPPORTED, msg, msg_len,
                        "cache_seqlens, block_table: the backward of a KV-cache or paged call is "
                        "not supported");
    if (fad_fwd_is_empty(p))
        return FAD_OK;
    if (!p->softmax_lse)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "softmax_lse: NULL pointer (the backward needs the forward's)");
    if (bp->part != FAD_BWD_ALL && bp->part != FAD_BWD_DQ && bp->part != FAD_BWD_DKDV)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "part: expected FAD_BWD_ALL, FAD_BWD_DQ or "
                        "FAD_BWD_DKDV, got %d", (int)bp->part);
    const int has_keys = (p->cu_seqlens_k ? p->total_k : p->seqlen_k) > 0;
    const void *grads[4] = {bp->dout, bp->dq, bp->dk, bp->dv};
    static const char *names[4] = {"dout", "dq", "dk", "dv"};
    /* the pointers of the part not computed are never read */
    const int wanted[4] = {1, bp->part != FAD_BWD_DKDV, bp->part != FAD_BWD_DQ && has_keys,
                           bp->part != FAD_BWD_DQ && has_keys};
    for (int t = 0; t < 4; t++)
        if (!grads[t] && wanted[t])
            return fad_fail(FAD_ERR_VALUE, msg, msg_len, "%s: NULL pointer", names[t]);
    return FAD_OK;
}

fad_status fad_bwd_cuda(const fad_bwd_params *bp, void *workspace, size_t workspace_bytes,
                        struct CUstream_st *stream, char *msg, size_t msg_len)
{
    fad_status st = fad_bwd_check_run(bp, msg, msg_len);
    if (st != FAD_OK)
        return st;
    const fad_fwd_params *p = &bp->fwd;
    st = check_alignment(p, msg, msg_len);
    if (st == FAD_OK && p->check_indices)
        st = fad_check_indices_cuda(p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (fad_fwd_is_empty(p))
        return FAD_OK;
    const void *grads[4] = {bp->dout, bp->dq, bp->dk, bp->dv};
    static const char *names[4] = {"dout", "dq", "dk", "dv"};
    for (int t = 0; t < 4; t++) /* they share the strides of out, q, k, v */
        if ((uintptr_t)grads[t] % 16)
            return fad_fail(FAD_ERR_ALIGNMENT, msg, msg_len,
                            "%s: data pointer must be 16-byte aligned", names[t]);
    size_t need = 0;
    st = bwd_workspace_need(bp, &need, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (!workspace || workspace_bytes < need || (uintptr_t)workspace % 16)
        return fad_fail(FAD_ERR_WORKSPACE, msg, msg_len,
                        "workspace: needs %zu bytes, 16-byte aligned, got %zu (ask "
                        "fad_bwd_workspace_size)", need, workspace ? workspace_bytes : (size_t)0);
    fad_bwd_params resolved = *bp;
    resolved.fwd = fad_fwd_resolve(p);
    return fad_bwd_cuda_launch(&resolved, workspace, stream, msg, msg_len);
}
