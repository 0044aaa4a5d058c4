/*
 * fad_seq.h — where sequence b of a call lives: the one place that knows the
 * difference between a padded (B, S, H, D) batch and a variable-length batch
 * (cu_seqlens). Shared by the CPU path, the kernels and the plan.
 *
 * Every per-row array (softmax_lse, the workspace partials) is addressed by a
 * flat row index lse_index(seq, h, i) = seq.row0 + h * head_stride + i:
 *   padded: row0 = b * H * Sq, head_stride = Sq       -> lse (B, H, Sq)
 *   varlen: row0 = cu_seqlens_q[b], head_stride = total_q -> lse (H, total_q)
 * A KV cache (cache_seqlens set) keeps the padded layout for q/out and moves
 * sequence b's keys to cache entry cache_batch_idx[b], rows [leftpad, end):
 * key positions count from leftpad, so capacity and placement change no bit.
 */
#ifndef FAD_SEQ_H
#define FAD_SEQ_H

#include <stdint.h>

#include "fad.h"
#include "fad_math.h"

typedef struct fad_seq {
    int64_t q_off, k_off, v_off, o_off; /* element offset of row 0, head 0 in q, k, v, out */
    int64_t row0;                       /* flat row of (h = 0, i = 0) in lse / partials */
    int len_q, len_k;
    int valid; /* 0: its cu_seqlens point outside q or k (varlen on the GPU only) */
    /* paged cache: this sequence's block_table row and the cache position of its key 0
     * (leftpad); k_off/v_off are 0 then, and fad_kv_row gives a key row's offset */
    const int32_t *pages;
    int k_start;
} fad_seq;

/* Paged: key row r of sequence s is row *row of page *pg; returns whether that
 * page lies inside the cache ([0, kv_batch)). */
FAD_HD int fad_kv_page(const fad_fwd_params *p, const fad_seq *s, int r, int *pg, int *row)
{
    const int x = s->k_start + r;
    *pg = s->pages[x / p->page_size];
    *row = x % p->page_size;
    return *pg >= 0 && *pg < p->kv_batch;
}

/* Element offsets (into k and v) of key row r of sequence s, r in [0, len_k).
 * Contiguous: k_off + r * row_stride. Paged: through the block table; returns 0
 * (and offsets 0) when the page index lies outside [0, kv_batch). */
FAD_HD int fad_kv_row(const fad_fwd_params *p, const fad_seq *s, int r, int64_t *k_off,
                      int64_t *v_off)
{
    if (!s->pages) {
        *k_off = s->k_off + (int64_t)r * p->k_row_stride;
        *v_off = s->v_off + (int64_t)r * p->v_row_stride;
        return 1;
    }
    int pg, row;
    const int ok = fad_kv_page(p, s, r, &pg, &row);
    *k_off = ok ? pg * p->k_batch_stride + (int64_t)row * p->k_row_stride : 0;
    *v_off = ok ? pg * p->v_batch_stride + (int64_t)row * p->v_row_stride : 0;
    return ok;
}

/* ALiBi slope of head h of sequence b in log2 units, 0 without ALiBi: every
 * path (CPU, forward, backward) looks it up here. */
FAD_HD float fad_alibi_slope_log2(const fad_fwd_params *p, int b, int h)
{
    return p->alibi_slopes ? FAD_MUL(p->alibi_slopes[b * p->alibi_batch_stride + h], FAD_LOG2E) : 0.f;
}

/* Sequence b's dropout (fad_math.h): every path derives it here from the params, so this
 * is the only reader of dropout_seed_offset (the pair a captured CUDA graph redraws on each
 * replay, fad.h) and no path can take the host seed where the pair was given. */
FAD_HD fad_dropout fad_dropout_of(const fad_fwd_params *p, int b)
{
    const int64_t *so = p->dropout_seed_offset;
    const uint64_t seed = so ? (uint64_t)so[0] : p->dropout_seed;
    const uint64_t offset = so ? (uint64_t)so[1] : p->dropout_offset;
    fad_dropout d = fad_make_dropout(p->dropout_p, seed, offset);
    d.seq_id = p->dropout_seq_ids ? (uint32_t)p->dropout_seq_ids[b] : 0u;
    return d;
}

/* Rows per head in the flat row space, and rows in all. */
FAD_HD int64_t fad_lse_head_stride(const fad_fwd_params *p)
{
    return p->cu_seqlens_q ? p->total_q : p->seqlen_q;
}
FAD_HD int64_t fad_flat_rows(const fad_fwd_params *p)
{
    return p->cu_seqlens_q ? (int64_t)p->num_heads * p->total_q
                           : (int64_t)p->batch * p->num_heads * p->seqlen_q;
}

FAD_HD fad_seq fad_get_seq(const fad_fwd_params *p, int b)
{
    fad_seq s;
    if (!p->cu_seqlens_q) {
        s.q_off = b * p->q_batch_stride, s.o_off = b * p->out_batch_stride;
        s.row0 = (int64_t)b * p->num_heads * p->seqlen_q;
        s.len_q = p->seqlen_q, s.len_k = p->seqlen_k, s.valid = 1;
        s.pages = NULL, s.k_start = 0;
        int kb = b, start = 0;
        if (p->cache_seqlens) { /* a KV cache: entry kb, rows [start, end) */
            kb = p->block_table ? 0 : p->cache_batch_idx ? p->cache_batch_idx[b] : b;
            start = p->cache_leftpad ? p->cache_leftpad[b] : 0;
            const int end = p->cache_seqlens[b];
            /* paged: end <= seqlen_k = max_blocks * page_size keeps every slot in the table */
            s.valid = (p->block_table || (kb >= 0 && kb < p->kv_batch)) && start >= 0 &&
                      start <= end && end <= p->seqlen_k;
            s.len_k = s.valid ? end - start : 0;
            s.len_q = s.valid ? p->seqlen_q : 0;
            if (!s.valid)
                kb = 0, start = 0;
            if (p->block_table) {
                s.pages = p->block_table + (int64_t)b * p->block_table_stride;
                s.k_start = start;
                s.k_off = s.v_off = 0;
                return s;
            }
        }
        s.k_off = kb * p->k_batch_stride + (int64_t)start * p->k_row_stride;
        s.v_off = kb * p->v_batch_stride + (int64_t)start * p->v_row_stride;
        return s;
    }
    const int q0 = p->cu_seqlens_q[b], q1 = p->cu_seqlens_q[b + 1];
    const int k0 = p->cu_seqlens_k[b], k1 = p->cu_seqlens_k[b + 1];
    int len_k = k1 - k0;
    if (p->seqused_k && p->seqused_k[b] < len_k)
        len_k = p->seqused_k[b];
    /* Lengths beyond the max_seqlen the grid was sized for, or rows outside
     * the tensors, make the sequence invalid: it is never read or computed. */
    /* paged (block_table): cu_seqlens_k only gives lengths; key j of sequence b is
     * found through its table row, and seqlen_k is the table's capacity */
    s.valid = q0 >= 0 && q1 >= q0 && q1 <= p->total_q && q1 - q0 <= p->seqlen_q && k0 >= 0 &&
              k1 >= k0 && (p->block_table || k1 <= p->total_k) && len_k >= 0 &&
              len_k <= p->seqlen_k;
    s.q_off = (int64_t)q0 * p->q_row_stride, s.o_off = (int64_t)q0 * p->out_row_stride;
    s.k_off = (int64_t)k0 * p->k_row_stride, s.v_off = (int64_t)k0 * p->v_row_stride;
    s.row0 = q0;
    s.pages = NULL, s.k_start = 0;
    if (p->block_table) {
        s.pages = p->block_table + (int64_t)b * p->block_table_stride;
        s.k_off = s.v_off = 0;
    }
    s.len_q = s.valid ? q1 - q0 : 0;
    s.len_k = s.valid ? len_k : 0;
    return s;
}

#endif /* FAD_SEQ_H */
