/*
 * fad_internal.h — what the C core and the CUDA launcher share but a caller of
 * fad.h never sees: the per-call plan and the tile constants it depends on.
 */
#ifndef FAD_INTERNAL_H
#define FAD_INTERNAL_H

#include "fad.h"
#include "fad_config.h"

#ifdef __cplusplus
extern "C" {
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

/* Query rows per CTA of the forward kernel (fwd_cfg in cuda/fwd_block.cuh). */
static inline FAD_HOST_DEVICE int fad_block_m(int head_dim)
{
    return fad_fwd_warps(head_dim) * 16 * (head_dim <= FAD_WIDE_MAX_D ? 2 : 1);
}

/* Packed rows ((query row, head of the group) pairs) per CTA of the packed kernel. */
static inline FAD_HOST_DEVICE int fad_packed_block_m(void) { return FAD_PACKED_WARPS * 16; }

/* Keys per tile of the CPU path's walk inside a split (each CUDA variant has
 * its own, also dividing FAD_SPLIT_QUANTUM). */
#define FAD_BLOCK_N 64
/* Keys per sequence, at most: the kernels walk a sequence's keys in int, a few tiles past its
 * end (prefetch), so the last 2^16 below 2^31 are left as headroom. */
#define FAD_MAX_SEQLEN_K (0x7fffffff - 0xffff)
/* Auto schedule: never spend more than this on split partials. */
#define FAD_MAX_WORKSPACE_BYTES ((size_t)256 << 20)

typedef struct fad_plan {
    int split_size;      /* keys per split used by this call */
    int num_splits;      /* splits of the longest sequence */
    int m_blocks;        /* query tiles per (batch, head); packed: per (batch, kv head) */
    int cta_per_split;   /* 1: one CTA per split, partials in workspace, combine */
    int packed;          /* 1: fwd_packed_kernel (GQA heads packed into M), else fwd_kernel */
    /* X slots of fwd_kernel's kGroups variant (a one-CTA plan past FAD_MERGE_GROUP
     * splits), 0: none. Their pool is then the whole workspace: fp32 slots
     * [x_slots][32][FAD_X_LANE_FLOATS] from 0, uint32 taken flags [x_slots] from
     * fad_x_flag_offset (zeroed by the launch). (An int in the padding before
     * ws_o_offset: every other field keeps its offset, and the kernels without
     * it their code.) */
    int x_slots;
    size_t ws_o_offset;  /* bytes: fp32 o partials [split][B][Hq][Sq][D] */
    size_t ws_ml_offset; /* bytes: fp32 (m, l) partials [split][B][Hq][Sq][2] */
    size_t ws_flag_offset; /* bytes: int32 ready flags, one per split CTA [split][grid x] */
    int r_slots;           /* R slots (D256 on Hopper: fwd_prefill_ws.cu's kRGlobal), 0: none */
    /* the kernel this call runs (fad_fwd_kernel): chosen once, by make_gpu_plan (fad_core.c),
     * which fwd_launch.cu's launch() follows; the CPU path's plans leave it 0. (An int in the
     * padding after r_slots: every other field keeps its offset.) */
    int kernel;
    size_t ws_r_offset;    /* bytes: fp32 R slots [r_slots][FAD_WS_R_SLOT_FLOATS] */
    size_t ws_r_flag_offset; /* bytes: uint32 taken flags [r_slots] (zeroed by the launch) */
    size_t workspace_bytes;
} fad_plan;

/* A GPU forward's kernel (fad_plan.kernel), and for the warp-specialized
 * sm_90a prefill kernel its shape (fwd_prefill_ws.cu's ws_shape). */
typedef enum fad_fwd_kernel {
    FAD_FWD_MMA = 0,   /* fwd_kernel on mma.sync: any arch, softcap, ALiBi, paged KV, D 192 */
    FAD_FWD_GROUPS,    /* fwd_kernel's kGroups variant: a one-CTA walk past FAD_MERGE_GROUP splits */
    FAD_FWD_PACKED,    /* fwd_packed_kernel: short query blocks (decode), GQA heads packed into M */
    FAD_FWD_WGMMA,     /* fwd_kernel's wgmma variant (sm_90a): D64 below FAD_WS_D64_MIN_SK[_FULL] */
    FAD_FWD_WS_MAIN,   /* fwd_ws_kernel (sm_90a), where no shape below applies */
    FAD_FWD_WS_NARROW, /* D128 up to FAD_WS_NARROW_MAX_SK keys */
    FAD_FWD_WS_LEAN,   /* D64 up to FAD_WS_D64_LEAN_MAX_SK keys */
    FAD_FWD_WS_LONG    /* D256 from FAD_WS_D256_LONG_MIN_SK keys */
} fad_fwd_kernel;

/* The head dim a GPU forward's compile-time variant is built for (fwd_launch.cu's dispatch). */
static inline int fad_fwd_head_dim_bound(int D) { return D <= 64 ? 64 : D <= 128 ? 128 : D <= 192 ? 192 : 256; }

/* Where a plan's X slots' taken flags start in its workspace (fad_plan.x_slots). */
static inline FAD_HOST_DEVICE size_t fad_x_flag_offset(int x_slots)
{
    return (size_t)x_slots * 32 * FAD_X_LANE_FLOATS * sizeof(float);
}

/* Builds the plan for p (already checked). num_sms = 0 on the CPU path. */
void fad_make_plan(const fad_fwd_params *p, int num_sms, fad_plan *plan);

/* fad_fwd_check plus the pointer checks a run needs. */
fad_status fad_fwd_check_run(const fad_fwd_params *p, char *msg, size_t msg_len);

/* fad_fwd_check_run for a backward, plus its own rules (no KV cache, no pages)
 * and the gradients' pointers. */
fad_status fad_bwd_check_run(const fad_bwd_params *bp, char *msg, size_t msg_len);

/* 1 when the call has no query row: nothing to compute or write. */
int fad_fwd_is_empty(const fad_fwd_params *p);

/* head_dim ** -0.5 as Python computes it, rounded to float: the default scale. */
float fad_default_softmax_scale(int head_dim);

/* A copy of p with defaults filled in (softmax_scale 0 -> fad_default_softmax_scale). */
fad_fwd_params fad_fwd_resolve(const fad_fwd_params *p);

/* Makes dev the current CUDA device; *prev receives the old one. */
fad_status fad_cuda_set_device(int dev, int *prev, char *msg, size_t msg_len);

/* words uint32 at ptr (device memory) <- pattern, enqueued on stream: the NaN
 * prefill of a varlen output (rows no sequence covers stay NaN). */
fad_status fad_cuda_fill32(void *ptr, uint32_t pattern, size_t words, struct CUstream_st *stream,
                           char *msg, size_t msg_len);

/* The index arrays' contents (cu_seqlens, seqused_k, cache_seqlens, cache_batch_idx,
 * cache_leftpad, block_table) checked on the host: every CPU call, and a GPU call in checked
 * mode once they are copied over (fad_core.c). */
fad_status fad_check_seqlens_host(const fad_fwd_params *p, char *msg, size_t msg_len);
/* CPU path helpers shared by the forward and the backward (fad_cpu.c). */
float fad_bf16_to_float(uint16_t h);
float fad_fp16_to_float(uint16_t h);
uint16_t fad_float_to_bf16(float f); /* round to nearest even */
uint16_t fad_float_to_fp16(float f); /* round to nearest even */

/* The CPU path's fold of one row's split states (m[s], l[s], o[s][D] of splits
 * first .. first + n - 1) into its result, out = (m, l, o[D]) unnormalised: the
 * order of every path (fad_math.h, FAD_MERGE_GROUP), for tests of that order on
 * split counts no real call reaches on the CPU. */
fad_status fad_cpu_fold_splits(const float *m, const float *l, const float *o, int first, int n,
                               int D, float *out, char *msg, size_t msg_len);

/* printf-style message into msg, returns st. */
fad_status fad_fail(fad_status st, char *msg, size_t msg_len, const char *fmt, ...);

/* Whether a call's scores carry a mod (softcap or ALiBi): the launchers' variant choice. */
static inline int fad_scores_modded(const fad_fwd_params *p) { return p->softcap > 0.f || p->alibi_slopes != NULL; }

/* seqlen_k within FAD_MAX_SEQLEN_K: the GPU launchers' refusal (the Python glue refuses it
 * first, naming the tensor). */
static inline fad_status fad_check_seqlen_k(int seqlen_k, char *msg, size_t msg_len)
{
    if (seqlen_k <= FAD_MAX_SEQLEN_K)
        return FAD_OK;
    return fad_fail(FAD_ERR_VALUE, msg, msg_len, "seqlen_k: %d keys in a sequence, past the limit "
                    "of 2^31 - 2^16 (%d)", seqlen_k, FAD_MAX_SEQLEN_K);
}

/* CUDA side (cuda/, or fad_nocuda.c in a CPU-only build). The current device's
 * SM count and compute-capability major (cuda/device.cu, asked once per device). */
fad_status fad_cuda_num_sms(int *num_sms, char *msg, size_t msg_len);
/* p's index arrays (device memory) copied to the host and checked with
 * fad_check_seqlens_host: the checked mode (fad_fwd_params.check_indices). */
fad_status fad_check_indices_cuda(const fad_fwd_params *p, char *msg, size_t msg_len);
fad_status fad_cuda_cc_major(int *major, char *msg, size_t msg_len);
/* The device current on the calling thread (this module's cudart is static; the
 * current device is the driver's current context, which cuBLASLt's runtime reads too). */
fad_status fad_cuda_current_device(int *dev, char *msg, size_t msg_len);
/* bytes of device memory on the current device, kept for the life of the process. */
fad_status fad_cuda_alloc(void **ptr, size_t bytes, char *msg, size_t msg_len);
/* The forward's kernels (cuda/fwd_launch.cu). */
fad_status fad_fwd_cuda_launch(const fad_fwd_params *p, const fad_plan *plan, void *workspace,
                               struct CUstream_st *stream, char *msg, size_t msg_len);
/* Nonzero in *use when the sm_90a (wgmma) kernel variants may run on the
 * current device: an sm_90a build, an sm_90 GPU, FLASH_ATTN_DET_WGMMA not "0";
 * 2 when it is "force" (no size rule: cuda/bwd_launch.cu). */
fad_status fad_use_wgmma(int *use, char *msg, size_t msg_len);
/* The backward's kernels (cuda/bwd_launch.cu); bp->fwd resolved; workspace: one fp32 per flat
 * row (dsum), then the fad_bwd_cuda_extra_bytes that follow its dsum_bytes (the dQ
 * accumulator where FLASH_ATTN_DET_BWD_DQ=reduce applies; 0 bytes elsewhere). */
fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, void *workspace, struct CUstream_st *stream,
                               char *msg, size_t msg_len);
fad_status fad_bwd_cuda_extra_bytes(const fad_bwd_params *bp, size_t dsum_bytes, size_t *bytes, char *msg,
                                    size_t msg_len);

#ifdef __cplusplus
}
#endif
#endif /* FAD_INTERNAL_H */
