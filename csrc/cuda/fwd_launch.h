/*
 * fwd_launch.h — what the forward's files share on the host side: the kernel
 * argument (fwd_args), the list of compile-time variants, and the launch
 * function of each kernel file. Each kernel file (fwd_prefill.cu,
 * fwd_prefill_ws.cu, fwd_decode.cu, fwd_combine.cu) defines its launcher and
 * instantiates it for every variant, so the files compile side by side;
 * fwd_launch.cu picks which one a call runs.
 */
#ifndef FAD_FWD_LAUNCH_H
#define FAD_FWD_LAUNCH_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fad_internal.h"

struct fwd_args {
    fad_fwd_params p;
    fad_plan plan;
    float *ws_o;  /* partial o, CTA-per-split schedule only */
    float *ws_ml; /* partial (m, l) */
    /* Per split CTA of the packed kernel (index blockIdx.z * gridDim.x +
     * blockIdx.x): 1 once its partials are written, so that a staged combine
     * launched early folds each split as soon as it is done
     * (FAD_COMBINE_POLL); nullptr: the combine waits for the whole grid. */
    int *ws_flag;
    /* R slots (plan.r_slots of FAD_WS_R_SLOT_FLOATS floats) and their taken
     * flags: fwd_prefill_ws.cu's kRGlobal; nullptr where the plan has none. */
    float *ws_r;
    unsigned *ws_r_flag;
    /* X slots (plan.x_slots) and their taken flags: fwd_kernel's kGroups
     * variant (fwd_tile.cuh, fold_group_close); nullptr where the plan has
     * none. (Last, so that every other field keeps its offset.) */
    float *ws_x;
    unsigned *ws_x_flag;
    /* The packed kernel's runs (fwd_decode.cu, packed_run_ctas): split CTAs
     * a row block, each walking every run_ctas-th split; 0: a CTA a split.
     * Host-side, chosen once a call, so that the launch and the combine's
     * polling agree. */
    int run_ctas;
};

/* The packed kernel's grid: x = (sequence b, kv head hk, block of
 * fad_packed_block_m() packed rows), the row block fastest; z = the split of
 * a CTA-per-split plan. packed_cta_x: the x of packed row pr (query row i of
 * head hk G + g is pr = i G + g); fwd_packed_kernel decodes its blockIdx.x
 * the other way. */
__host__ __device__ inline int64_t packed_grid_x(const fwd_args &a)
{
    return (int64_t)a.plan.m_blocks * a.p.batch * a.p.num_heads_k;
}
__host__ __device__ inline int packed_cta_x(const fwd_args &a, int b, int hk, int pr)
{
    return (b * a.p.num_heads_k + hk) * a.plan.m_blocks + pr / fad_packed_block_m();
}

/* The combine's grid x: a CTA per 4 query rows of each (sequence, head), or per row where
 * fewer than 4 (decode: its 4 warps share the row's columns). */
__host__ __device__ inline int64_t combine_grid_x(const fwd_args &a)
{
    const int rows_per_cta = FAD_COMBINE_BY_COLS && a.p.seqlen_q < 4 ? 1 : 4;
    return (int64_t)(a.p.seqlen_q + rows_per_cta - 1) / rows_per_cta * a.p.batch * a.p.num_heads;
}

/* The split CTAs of a CTA-per-split plan lie on grid y and z (x: the row blocks), which CUDA
 * caps at 65535 each, where a long sequence has more splits (2^25 keys in 512-key splits:
 * 65536). Up to 65535 splits, z is the split (y = 1); past that, split = y gridDim.z + z, and
 * the y z - num_splits CTAs past the last split walk nothing (tile_walk). split_ctas > 0 (the
 * packed kernel's runs): that many split CTAs a row block, CTA y z + z walking every
 * (y z)-th split from its own. Which CTA runs a split never changes a bit. */
inline dim3 split_grid(int64_t x, const fad_plan &plan, int split_ctas = 0)
{
    const int splits = !plan.cta_per_split ? 1 : split_ctas > 0 ? split_ctas : plan.num_splits;
    const int y = (splits + 65534) / 65535;
    return dim3((unsigned)x, (unsigned)y, (unsigned)((splits + y - 1) / y));
}
/* Whether a decode call's split CTAs may walk runs of splits (fwd_decode.cu's
 * packed_run_ctas; past one wave, FAD_PACKED_RUN_MIN_CTAS): a packed CTA-per-split
 * plan over one sequence, whose row blocks then walk one length, so that a grid
 * sized from shapes alone shares the splits out evenly (with several sequences
 * a long one's splits would queue in its row blocks' CTAs: 0.86-0.92x at batch
 * 4-8 of mixed lengths), and neither pages nor softcap/ALiBi (fewer kernels). */
inline bool packed_runs_shape(const fwd_args &a)
{
    return a.plan.packed && a.plan.cta_per_split && a.p.batch == 1 && !a.p.block_table &&
           !fad_scores_modded(&a.p);
}
#ifdef __CUDACC__
__device__ __forceinline__ int split_of_cta() { return (int)(blockIdx.y * gridDim.z + blockIdx.z); }
#endif

/* The compile-time variants, X(T, kHeadDim, kMod, kPaged): dtype x head-dim
 * class x whether scores need a mod (softcap/ALiBi) x paged KV. */
#define FAD_FWD_VARIANTS_D(X, T, D) X(T, D, false, false) X(T, D, false, true) X(T, D, true, false) X(T, D, true, true)
#define FAD_FWD_VARIANTS_T(X, T) \
    FAD_FWD_VARIANTS_D(X, T, 64) FAD_FWD_VARIANTS_D(X, T, 128) FAD_FWD_VARIANTS_D(X, T, 192) FAD_FWD_VARIANTS_D(X, T, 256)
#define FAD_FWD_VARIANTS(X) FAD_FWD_VARIANTS_T(X, __half) FAD_FWD_VARIANTS_T(X, __nv_bfloat16)
/* X(T, kHeadDim): the variants of kernels that take no score mod or pages (the combine). */
#define FAD_FWD_HEAD_DIMS_T(X, T) X(T, 64) X(T, 128) X(T, 192) X(T, 256)
#define FAD_FWD_HEAD_DIMS(X) FAD_FWD_HEAD_DIMS_T(X, __half) FAD_FWD_HEAD_DIMS_T(X, __nv_bfloat16)

/* fwd_prefill.cu: fwd_kernel (fwd_prefill_kernel.cuh; kWgmma: its sm_90a variant). */
template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kWgmma>
fad_status launch_prefill(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);
/* fwd_prefill_ws.cu: fwd_ws_kernel (sm_90a, D 64, 128 and 256), in the plan's shape (fad_plan.kernel). */
template <typename T, int kHeadDim, bool kPaged>
fad_status launch_prefill_ws(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);
/* fwd_decode.cu: fwd_packed_kernel, in runs where a.run_ctas is set; packed_run_ctas:
 * the runs a packed plan gets (0: none), from its shape, the SMs and the kernel's occupancy. */
template <typename T, int kHeadDim, bool kMod, bool kPaged>
fad_status launch_packed(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);
template <typename T, int kHeadDim, bool kMod, bool kPaged>
fad_status packed_run_ctas(const fwd_args &a, int *ctas, char *msg, size_t msg_len);
/* fwd_combine.cu: combine_kernel (nothing to do unless the plan is CTA-per-split). */
template <typename T, int kHeadDim>
fad_status launch_combine(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);
/* fwd_combine.cu: whether launch_combine will poll the packed kernel's ready
 * flags (a.ws_flag) for this call: a packed, CTA-per-split plan whose combine
 * takes the staged kernel. */
template <int kHeadDim> bool combine_polls(const fwd_args &a);

#endif /* FAD_FWD_LAUNCH_H */
