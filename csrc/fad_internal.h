/*
 * fad_internal.h — what the C core and the CUDA launcher share but a caller of
 * fad.h never sees: the per-call plan and the tile constants it depends on.
 */
#ifndef FAD_INTERNAL_H
#define FAD_INTERNAL_H

#include "fad.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Tile shape of the forward kernel per head-dim class: tuning knobs that never
 * change a bit (rows are independent), compared with scripts/ab_variants.sh.
 * FAD_WIDE_MAX_D: head dims up to this give each warp 32 query rows (else 16).
 * FAD_D64_WARPS / FAD_D128_WARPS: warps per CTA for D <= 64 and 64 < D <= 128
 * (4 above). FAD_D64_MIN_BLOCKS: CTAs per SM the D <= 64 register budget allows. */
#ifndef FAD_WIDE_MAX_D
#define FAD_WIDE_MAX_D 0
#endif
#ifndef FAD_D64_WARPS
#define FAD_D64_WARPS 8
#endif
#ifndef FAD_D64_MIN_BLOCKS
#define FAD_D64_MIN_BLOCKS 2
#endif
#ifndef FAD_D128_WARPS
#define FAD_D128_WARPS 4
#endif
/* FAD_WG_Q_REGS_MIN_D / FAD_WG_R_REGS_MIN_D: in the sm_90a prefill variant,
 * head-dim classes from this one up keep Q (wgmma A from registers) / the
 * merged result's o in registers; smaller ones keep them in shared memory.
 * At D64 (two warpgroups per CTA) Q in registers gives wrong results on the
 * H100 (benchmarks/NOTES.md, "Prefill on wgmma"), so D64 keeps Q in shared
 * memory; R in registers, no faster at first, is 5-7% faster at D64 since
 * the copy and fold changes of "Prefill v3" (0 B spilled). */
#ifndef FAD_WG_Q_REGS_MIN_D
#define FAD_WG_Q_REGS_MIN_D 128
#endif
#ifndef FAD_WG_R_REGS_MIN_D
#define FAD_WG_R_REGS_MIN_D 64
#endif
/* FAD_WG_LEAN_LOADS: 1 = the sm_90a variant copies K/V tiles with
 * load_tile_lean (per-chunk offsets from one per-thread base; A/B knob). */
#ifndef FAD_WG_LEAN_LOADS
#define FAD_WG_LEAN_LOADS 1
#endif
/* FAD_WG_LOADS_DURING_S: 1 = the sm_90a variant issues the next tile's K/V
 * copies while S = Q K^T runs (0: before it, as the mma.sync kernel does). */
#ifndef FAD_WG_LOADS_DURING_S
#define FAD_WG_LOADS_DURING_S 1
#endif
/* FAD_WG_WS: 1 = at D128 the sm_90a prefill runs the warp-specialized
 * kernel (fad_fwd_ws.cuh: a cp.async producer warpgroup, two consumer
 * warpgroups of 64 rows) instead of fwd_kernel's wgmma variant; the same bits.
 * FAD_WS_STAGES: its K/V ring depth. FAD_WS_PRODUCER_REGS /
 * FAD_WS_CONSUMER_REGS: the registers per thread setmaxnreg gives each side
 * (P + 2 * C <= 3 * 168: what __launch_bounds__ gives 384 threads). */
#ifndef FAD_WG_WS
#define FAD_WG_WS 1
#endif
#ifndef FAD_WS_Q_REGS /* 1 = its consumers hold Q's A fragments in registers */
#define FAD_WS_Q_REGS 1
#endif
#ifndef FAD_WS_STAGES
#define FAD_WS_STAGES 4
#endif
#ifndef FAD_WS_PRODUCER_REGS
#define FAD_WS_PRODUCER_REGS 40
#endif
#ifndef FAD_WS_CONSUMER_REGS
#define FAD_WS_CONSUMER_REGS 232
#endif

#ifdef __CUDACC__
#define FAD_HOST_DEVICE __host__ __device__
#else
#define FAD_HOST_DEVICE
#endif

static inline FAD_HOST_DEVICE int fad_fwd_warps(int head_dim)
{
    return head_dim <= 64 ? FAD_D64_WARPS : head_dim <= 128 ? FAD_D128_WARPS : 4;
}

/* Query rows per CTA of the forward kernel (fwd_cfg in fad_fwd.cu). */
static inline FAD_HOST_DEVICE int fad_block_m(int head_dim)
{
    return fad_fwd_warps(head_dim) * 16 * (head_dim <= FAD_WIDE_MAX_D ? 2 : 1);
}

/* The packed forward kernel (fwd_packed_kernel: GQA heads packed into M, for
 * decode and other short query blocks). Knobs that never change a bit:
 * FAD_PACKED_WARPS: warps (16 packed rows each) per CTA; FAD_PACKED_STAGES(_MOD):
 * depth of its K/V cp.async pipeline (without / with softcap or ALiBi; fewer
 * where shared memory is short); FAD_PACKED_MAX_SQ: the longest query
 * block (seqlen_q, max_seqlen_q for varlen) that runs on it. */
#ifndef FAD_PACKED_WARPS
#define FAD_PACKED_WARPS 1
#endif
#ifndef FAD_PACKED_STAGES
#define FAD_PACKED_STAGES 3
#endif
#ifndef FAD_PACKED_STAGES_MOD /* the softcap/ALiBi variant (3 stages spill 24 B at D128) */
#define FAD_PACKED_STAGES_MOD 4
#endif
#ifndef FAD_PACKED_MAX_SQ
#define FAD_PACKED_MAX_SQ 16
#endif

/* Packed rows ((query row, head of the group) pairs) per CTA of the packed kernel. */
static inline FAD_HOST_DEVICE int fad_packed_block_m(void) { return FAD_PACKED_WARPS * 16; }

/* Keys per tile of the CPU path's walk inside a split (each CUDA variant has
 * its own, also dividing FAD_SPLIT_QUANTUM). */
#define FAD_BLOCK_N 64
/* Auto schedule: never spend more than this on split partials. */
#define FAD_MAX_WORKSPACE_BYTES ((size_t)256 << 20)

typedef struct fad_plan {
    int split_size;      /* keys per split used by this call */
    int num_splits;      /* splits of the longest sequence */
    int m_blocks;        /* query tiles per (batch, head); packed: per (batch, kv head) */
    int cta_per_split;   /* 1: one CTA per split, partials in workspace, combine */
    int packed;          /* 1: fwd_packed_kernel (GQA heads packed into M), else fwd_kernel */
    size_t ws_o_offset;  /* bytes: fp32 o partials [split][B][Hq][Sq][D] */
    size_t ws_ml_offset; /* bytes: fp32 (m, l) partials [split][B][Hq][Sq][2] */
    size_t workspace_bytes;
} fad_plan;

/* Builds the plan for p (already checked). num_sms = 0 on the CPU path. */
void fad_make_plan(const fad_fwd_params *p, int num_sms, fad_plan *plan);

/* fad_fwd_check plus the pointer checks a run needs. */
fad_status fad_fwd_check_run(const fad_fwd_params *p, char *msg, size_t msg_len);

/* fad_fwd_check_run for a backward, plus its own rules (no KV cache, no pages)
 * and the gradients' pointers. */
fad_status fad_bwd_check_run(const fad_bwd_params *bp, char *msg, size_t msg_len);

/* 1 when the call has no query row: nothing to compute or write. */
int fad_fwd_is_empty(const fad_fwd_params *p);

/* A copy of p with defaults filled in (softmax_scale 0 -> 1/sqrt(head_dim)). */
fad_fwd_params fad_fwd_resolve(const fad_fwd_params *p);

/* Makes dev the current CUDA device; *prev receives the old one. */
fad_status fad_cuda_set_device(int dev, int *prev, char *msg, size_t msg_len);

/* words uint32 at ptr (device memory) <- pattern, enqueued on stream: the NaN
 * prefill of a varlen output (rows no sequence covers stay NaN). */
fad_status fad_cuda_fill32(void *ptr, uint32_t pattern, size_t words, struct CUstream_st *stream,
                           char *msg, size_t msg_len);

/* CPU path helpers shared by the forward and the backward (fad_cpu.c). */
fad_status fad_check_seqlens_host(const fad_fwd_params *p, char *msg, size_t msg_len);
float fad_bf16_to_float(uint16_t h);
float fad_fp16_to_float(uint16_t h);
uint16_t fad_float_to_bf16(float f); /* round to nearest even */
uint16_t fad_float_to_fp16(float f); /* round to nearest even */
typedef float (*load_fn)(uint16_t);
struct fad_seq;
/* fp32 scratch for one kv head's keys and values, 2 x seqlen_k x D (free() it). */
float *fad_kv_buffer(const fad_fwd_params *p);
/* Sequence seq's keys/values of kv head hk, converted to fp32 (len_k, D) row-major. */
void fad_load_kv_head(const fad_fwd_params *p, const struct fad_seq *seq, int hk, load_fn load,
                      float *kf, float *vf);

/* printf-style message into msg, returns st. */
fad_status fad_fail(fad_status st, char *msg, size_t msg_len, const char *fmt, ...);

/* CUDA side (fad_fwd.cu, or fad_nocuda.c in a CPU-only build). */
fad_status fad_cuda_num_sms(int *num_sms, char *msg, size_t msg_len);
fad_status fad_fwd_cuda_launch(const fad_fwd_params *p, const fad_plan *plan, void *workspace,
                               struct CUstream_st *stream, char *msg, size_t msg_len);
/* Nonzero in *use when the sm_90a (wgmma) kernel variants may run on the
 * current device: an sm_90a build, an sm_90 GPU, FLASH_ATTN_DET_WGMMA not "0";
 * 2 when it is "force" (no size rule: fad_bwd.cu). */
fad_status fad_use_wgmma(int *use, char *msg, size_t msg_len);
/* The backward's kernels (fad_bwd.cu); bp->fwd resolved, dsum: one fp32 per flat row. */
fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, float *dsum, struct CUstream_st *stream,
                               char *msg, size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* FAD_INTERNAL_H */
