/*
 * fad.h — flash_attn_det public C API.
 *
 * Deterministic, batch-invariant attention forward on raw pointers. Usable from
 * C or C++ with no Python and no torch: fill an fad_fwd_params, ask for the
 * workspace size, allocate it (device memory for the CUDA path), call the entry.
 *
 * Layout (flash_attn's): q (B, Sq, Hq, D), k/v (B, Sk, Hkv, D), out (B, Sq, Hq, D),
 * each with any strides for the first three dims and a contiguous last dim;
 * softmax_lse (B, Hq, Sq) float32 contiguous. Variable-length batches
 * (cu_seqlens_q/k set): q/out (total_q, Hq, D), k/v (total_k, Hkv, D), sequence b
 * at rows [cu_seqlens[b], cu_seqlens[b+1]); softmax_lse (Hq, total_q).
 *
 * The invariance contract (docs/design.md, "split-plan"): in deterministic
 * mode the bits of one query row's output depend only on that row, the
 * keys/values it may see and their absolute positions, the score options,
 * dtype, head dim, split_size and the GPU architecture family -- never on
 * batch size, batch composition, the number of query rows in the call, the
 * SM count or the run.
 */
#ifndef FAD_H
#define FAD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAD_VERSION "0.1.0"

/* split_size must be a multiple of this: a whole number of every kernel's key tiles (32 or 64). */
#define FAD_SPLIT_QUANTUM 128
/* split_size at most this many keys, so that no key index or split count overflows 32 bits */
#define FAD_MAX_SPLIT_SIZE (1 << 24)
/* split_size of deterministic mode unless the caller picks another: the one place the
 * default is written (fad_fwd_params_init, the Python module's state and
 * set_deterministic_mode's signature all read it) */
#define FAD_DEFAULT_SPLIT_SIZE 512
#define FAD_MAX_HEAD_DIM 256

typedef enum fad_status {
    FAD_OK = 0,
    FAD_ERR_DTYPE = 1,       /* an argument has the wrong element type */
    FAD_ERR_VALUE = 2,       /* an argument has a bad shape, stride or value */
    FAD_ERR_ALIGNMENT = 3,   /* a pointer or stride breaks the 16-byte rule */
    FAD_ERR_UNSUPPORTED = 4, /* valid for flash_attn but not implemented here */
    FAD_ERR_WORKSPACE = 5,   /* workspace missing or too small */
    FAD_ERR_NO_CUDA = 6,     /* this build has no CUDA path */
    FAD_ERR_CUDA = 7         /* a CUDA runtime call failed */
} fad_status;

/* cudaStream_t is `struct CUstream_st *`; declared here so C callers need no CUDA headers. */
struct CUstream_st;

typedef enum fad_dtype { FAD_FLOAT16 = 0, FAD_BFLOAT16 = 1 } fad_dtype;

/* How the splits of one query tile are mapped onto CTAs. Never changes bits;
 * the non-AUTO values exist so that tests can prove that. */
typedef enum fad_schedule {
    FAD_SCHEDULE_AUTO = 0,          /* chosen from the grid size and SM count */
    FAD_SCHEDULE_ONE_CTA = 1,       /* every split of a row in one CTA, no workspace */
    FAD_SCHEDULE_CTA_PER_SPLIT = 2  /* one CTA per split + a combine kernel */
} fad_schedule;

typedef struct fad_fwd_params {
    /* --- tensors (device pointers on the CUDA path, host pointers on the CPU path) --- */
    const void *q;             /* (B, Sq, Hq, D), dtype */
    const void *k;             /* (B, Sk, Hkv, D), dtype */
    const void *v;             /* (B, Sk, Hkv, D), dtype */
    void *out;                 /* (B, Sq, Hq, D), dtype; written */
    float *softmax_lse;        /* (B, Hq, Sq) contiguous float32, natural log; written, or
                                  NULL: not computed (the forward; the backward needs it) */
    const float *alibi_slopes; /* NULL, or float32 (Hq,) or (B, Hq) */

    /* --- strides in elements (not bytes); the last dim is contiguous --- */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t out_batch_stride, out_row_stride, out_head_stride;
    int64_t alibi_batch_stride; /* 0 for slopes of shape (Hq,), Hq for (B, Hq) */

    /* --- variable-length batches; all NULL for a padded (B, S, ...) batch --- */
    const int32_t *cu_seqlens_q; /* (B+1) int32: sequence b's queries are rows [cu[b], cu[b+1]) */
    const int32_t *cu_seqlens_k; /* (B+1) int32: likewise its keys; set together with cu_seqlens_q */
    const int32_t *seqused_k;    /* NULL or (B) int32: sequence b attends only its first seqused_k[b] keys */
    int total_q;                 /* rows of q and out (varlen only) */
    int total_k;                 /* rows of k and v (varlen only) */

    /* --- KV cache (flash_attn_with_kvcache): k/v are the cache, (kv_batch, seqlen_k =
     *     capacity, Hkv, D); sequence b attends cache rows [leftpad, cache_seqlens[b]) of
     *     cache entry cache_batch_idx[b]. All NULL otherwise. --- */
    const int32_t *cache_seqlens;   /* (B) int32: where sequence b's keys end in the cache */
    const int32_t *cache_batch_idx; /* NULL or (B) int32: cache entry of sequence b (default b) */
    const int32_t *cache_leftpad;   /* NULL or (B) int32: where sequence b's keys start (default 0) */
    int kv_batch;                   /* entries in the cache (k/v dim 0); pages when paged */
    /* Paged cache (block_table set): k/v are (kv_batch = pages, page_size, Hkv, D) and
     * seqlen_k = max_blocks * page_size is the capacity of one sequence. Key position
     * x (counted from the cache start, x = leftpad + r for the sequence's key r) lives
     * in row x % page_size of page block_table[b * block_table_stride + x / page_size];
     * k/v_batch_stride are then the page strides. A page index outside [0, kv_batch)
     * is never read: on the CPU it is an error, on the GPU the rows that would read
     * it get NaN. cache_batch_idx must be NULL. A varlen batch (cu_seqlens_k set) may be
     * paged too: cu_seqlens_k (and seqused_k) then give only the lengths, leftpad is 0,
     * kv_batch is the number of pages and seqlen_k the table's capacity. */
    const int32_t *block_table;     /* NULL, or (B, max_blocks) int32 */
    int block_table_stride;         /* elements between sequences' rows of block_table */
    int page_size;                  /* rows per page: a positive multiple of 16 (paged only) */

    /* --- sizes --- */
    int batch;       /* B */
    int seqlen_q;    /* Sq; varlen: the longest sequence's queries (max_seqlen_q) */
    int seqlen_k;    /* Sk; varlen: the longest sequence's keys (max_seqlen_k) */
    int num_heads;   /* Hq: query heads */
    int num_heads_k; /* Hkv: key/value heads; Hq % Hkv == 0 (GQA/MQA) */
    int head_dim;    /* D: multiple of 8, at most FAD_MAX_HEAD_DIM */
    fad_dtype dtype;

    /* --- score options --- */
    float softmax_scale; /* multiplies q.k before softcap; 0 means 1/sqrt(D) */
    float softcap;       /* > 0: score = softcap * tanh(score / softcap) */
    int causal;          /* 1: key j visible to row i iff j <= i + Sk - Sq */
    int window_left;     /* -1 unbounded, else keys j >= i + Sk - Sq - window_left */
    int window_right;    /* -1 unbounded, else keys j <= i + Sk - Sq + window_right */

    /* --- split plan --- */
    int deterministic;   /* 1: fixed split plan from split_size; 0: plan adapts to the batch */
    int split_size;      /* keys per split, a positive multiple of FAD_SPLIT_QUANTUM */
    fad_schedule schedule;

    /* --- checks --- */
    int check_indices;   /* GPU: 1 = copy the index arrays (cu_seqlens, seqused_k, cache_seqlens,
                            cache_batch_idx, cache_leftpad, block_table) to the host and check
                            them as the CPU path does, before anything is written: an error
                            that names the argument and the sequence instead of NaN rows, at
                            the price of a device sync (not graph-safe). 0 (default): trusted */

    /* --- dropout (training): element (row, key) kept with probability 1 - dropout_p by a
     *     mask keyed on positions only (fad_math.h, fad_make_dropout), kept ones scaled by
     *     1 / (1 - dropout_p); the backward must get the forward's values (its seed and
     *     offset, or the same dropout_seed_offset pair) --- */
    float dropout_p;         /* in [0, 1); 0: off */
    uint64_t dropout_seed;   /* the generator's seed ... */
    uint64_t dropout_offset; /* ... and offset, one per call */
    /* NULL (every sequence's identity 0), or (batch) int32 on q's device: sequence b's
     * identity in the mask's Philox counter (its bits as uint32), so that sequences at the
     * same positions get different masks where the caller tells them apart */
    const int32_t *dropout_seq_ids;
    /* NULL: the call's seed and offset are dropout_seed and dropout_offset. Else two int64
     * (seed, offset) on q's device (host memory on the CPU path), read in their place when
     * the kernels run: a CUDA graph keeps the pointer, not the values, so a device RNG op
     * captured before the call draws a new pair, and so a new mask, on every replay (host
     * values would be frozen into the graph). Read in one place: fad_dropout_of (fad_seq.h). */
    const int64_t *dropout_seed_offset;

    /* --- CPU path (fad_fwd_cpu, fad_bwd_cpu) --- */
    int num_threads;     /* threads to run on, the caller's own among them; <= 1 (the
                            default): the caller's thread only. Never changes a bit: each
                            row is computed whole by one thread in the split plan's order */
} fad_fwd_params;

/* Fills every field with a neutral default: scale 0 means 1/sqrt(head_dim),
 * no causal mask, unbounded window, deterministic, split_size FAD_DEFAULT_SPLIT_SIZE. */
void fad_fwd_params_init(fad_fwd_params *p);

/* Validates p. On failure returns the status and writes a message that names
 * the argument into msg (may be NULL). Writes no tensor. */
fad_status fad_fwd_check(const fad_fwd_params *p, char *msg, size_t msg_len);

/* Every check fad_fwd_cpu (on_gpu 0) or fad_fwd_cuda (on_gpu 1) runs before it
 * writes, and nothing else: on the CPU the index tensors' contents too (cu_seqlens,
 * cache_seqlens, block_table), on the GPU the 16-byte layout rules. For a caller
 * that writes state the call depends on first (a KV-cache append): check, write,
 * then run. Writes no tensor. */
fad_status fad_fwd_check_call(const fad_fwd_params *p, int on_gpu, char *msg, size_t msg_len);

/* Bytes of device workspace fad_fwd_cuda needs for p on the current device
 * (0 is common: the workspace only exists when splits are spread over CTAs). */
fad_status fad_fwd_workspace_size(const fad_fwd_params *p, size_t *bytes,
                                  char *msg, size_t msg_len);

/* Forward on the GPU, enqueued on stream (a cudaStream_t; NULL = legacy
 * default stream). Validates first; nothing is written on failure. No host
 * sync and no allocation: safe inside CUDA graph capture. */
fad_status fad_fwd_cuda(const fad_fwd_params *p, void *workspace, size_t workspace_bytes,
                        struct CUstream_st *stream, char *msg, size_t msg_len);

/* Forward on the CPU (host pointers), fp32 accumulation, same split plan. */
fad_status fad_fwd_cpu(const fad_fwd_params *p, char *msg, size_t msg_len);

/* Backward: gradients of the forward described by fwd (whose out and
 * softmax_lse are that forward's results). dout, dq, dk, dv have the strides of
 * out, q, k, v. dq is fully written; dk/dv rows of keys that no query sees (past
 * seqused_k, or between varlen sequences) are left as they are (pass zeros).
 * Accumulation orders depend only on positions inside a sequence (keys in
 * increasing order for dq; query heads of a group, then rows, in increasing
 * order for dk/dv), so the gradients are batch-invariant and run-to-run stable. */
typedef enum fad_bwd_part {
    FAD_BWD_ALL = 0,  /* dq, dk and dv */
    FAD_BWD_DQ = 1,   /* dq only: dk, dv are not read and may be NULL */
    FAD_BWD_DKDV = 2, /* dk and dv only: dq is not read and may be NULL */
} fad_bwd_part;

typedef struct fad_bwd_params {
    fad_fwd_params fwd; /* the forward's tensors and options */
    const void *dout;   /* like out: gradient of the output */
    void *dq, *dk, *dv; /* like q, k, v: written */
    /* Which gradients to compute. A part's bits are those of FAD_BWD_ALL (the dQ and
     * dK/dV passes share nothing but the row sums): context parallel asks each rank for
     * the dq of its rows and the dk/dv of its keys at half the work. Zero: all. */
    fad_bwd_part part;
} fad_bwd_params;

/* Backward on the CPU (host pointers), fp32 accumulation. */
fad_status fad_bwd_cpu(const fad_bwd_params *p, char *msg, size_t msg_len);

/* Bytes of device workspace fad_bwd_cuda needs: one fp32 per softmax_lse
 * element (the row sums dout . out), and where the five-product backward
 * applies (FLASH_ATTN_DET_BWD_DQ not "recompute"; sm_90, head dim <= 128, not
 * dropout with softcap or ALiBi), the fp32 dQ accumulator after them: 4 x
 * head-dim-class bytes (256 or 512) per query row and head, rows rounded up to
 * a tile (varlen: a tile more a sequence), plus 4 bytes a tile. */
fad_status fad_bwd_workspace_size(const fad_bwd_params *p, size_t *bytes, char *msg,
                                  size_t msg_len);

/* Backward on the GPU, enqueued on stream. Validates first;
 * nothing is written on failure. No host sync and no allocation. */
fad_status fad_bwd_cuda(const fad_bwd_params *p, void *workspace, size_t workspace_bytes,
                        struct CUstream_st *stream, char *msg, size_t msg_len);

/* flash_attn_with_kvcache's steps before attention, as one CUDA kernel: rotary
 * on q (written to q_rot) and on the new keys, then the new keys and values
 * written into the cache at rows cache_seqlens[b] + i of entry
 * cache_batch_idx[b] (default b), or through block_table for a paged cache
 * (row r of sequence b: row r % page_size of page block_table[b][r / page_size]).
 * Rotary positions are absolute cache rows (flash_attn's rule, cache_leftpad
 * or not): new key i of sequence b sits at cache_seqlens[b] + i; query row i
 * at the same position when rotate_q_per_row, else all query rows at
 * cache_seqlens[b].
 * Rotary (flash_attn's): pairs (2j, 2j+1) when interleaved, else (j, j + R/2),
 * R = rotary_dim; y0 = x0 c - x1 s, y1 = x0 s + x1 c in fp32, each product and
 * sum rounded. No host sync: a row that would land outside the cache (or a
 * page outside it) is not written; the attention that follows reports that
 * sequence as NaN. A position outside rotary_cos gives NaN rows. */
typedef struct fad_append_params {
    const void *q;        /* (B, Sq, Hq, D) */
    void *q_rot;          /* (B, Sq, Hq, D) contiguous; written when rotary is on */
    const void *k, *v;    /* (B, Snew, Hkv, D) new keys/values; NULL when Snew = 0 */
    void *k_cache, *v_cache; /* (kv_batch, capacity, Hkv, D); paged: (pages, page_size, Hkv, D) */
    const void *rotary_cos, *rotary_sin; /* NULL, or (seqlen_ro, rotary_dim / 2) contiguous */
    int rotary_fp32;      /* 1: cos/sin are float32; 0: they have q's dtype */
    const int32_t *cache_seqlens;   /* (B): where sequence b's new rows go */
    const int32_t *cache_batch_idx; /* NULL or (B) */
    const int32_t *block_table;     /* NULL, or (B, max_blocks) int32 with row stride block_table_stride */
    int32_t *seqlens_out;           /* NULL, or (B): written cache_seqlens[b] + Snew */
    int64_t q_batch_stride, q_row_stride, q_head_stride;
    int64_t k_batch_stride, k_row_stride, k_head_stride;
    int64_t v_batch_stride, v_row_stride, v_head_stride;
    int64_t kc_batch_stride, kc_row_stride, kc_head_stride;
    int64_t vc_batch_stride, vc_row_stride, vc_head_stride;
    int block_table_stride, max_blocks;
    int batch, seqlen_q, seqlen_new, num_heads, num_heads_k, head_dim;
    int kv_batch;         /* cache entries, or pages when paged */
    int capacity;         /* rows per entry, or page_size when paged */
    int seqlen_ro, rotary_dim; /* rotary_dim even, <= head_dim; 0 with no rotary */
    int rotary_interleaved, rotate_q_per_row;
    fad_dtype dtype;
} fad_append_params;

fad_status fad_append_cuda(const fad_append_params *p, struct CUstream_st *stream, char *msg,
                           size_t msg_len);

/* 1 when this build contains the CUDA path. */
int fad_has_cuda(void);

/* A static string naming the status. */
const char *fad_status_string(fad_status s);

#ifdef __cplusplus
}
#endif
#endif /* FAD_H */
