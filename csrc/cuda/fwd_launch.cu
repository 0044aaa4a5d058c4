/*
 * fwd_launch.cu — the forward's one dispatch point: a call's compile-time
 * variant (dtype x head dim x score mod x paged KV), its kernel (the packed
 * kernel for short query blocks; else the prefill kernel on mma.sync, on
 * wgmma, or warp-specialized), then the combine of a CTA-per-split plan.
 */
#include "fwd_launch.h"
#include "mma.cuh"

template <typename T, int kHeadDim, bool kMod, bool kPaged>
static fad_status launch(const fwd_args &a_in, cudaStream_t stream, char *msg, size_t msg_len)
{
    fwd_args a = a_in;
    if (a.plan.kernel == FAD_FWD_PACKED) { /* (before the flags: a run's combine polls from fewer splits) */
        const fad_status st = packed_run_ctas<T, kHeadDim, kMod, kPaged>(a, &a.run_ctas, msg, msg_len);
        if (st != FAD_OK)
            return st;
    }
    if (!combine_polls<kHeadDim>(a)) /* (else the packed kernel marks each split CTA done) */
        a.ws_flag = nullptr;
    /* The plan's kernel (make_gpu_plan, fad_core.c, chose it); one this variant
     * does not build is a bug, refused. Which kernels a variant builds: softcap,
     * ALiBi only mma.sync, paged KV mma.sync and (D128) the warp-specialized
     * kernel; a build without sm_90a code (FAD_SM90A 0)
     * references no wgmma variant, so the sm_90a-only kernel files are left out
     * of it; fwd_kernel's wgmma variant at D64 only where the warp-specialized
     * kernel runs D64 (below FAD_WS_D64_MIN_SK keys), at D128 only where it does
     * not run D128 (FAD_WG_WS 0). */
    constexpr bool kHasWgmma = FAD_SM90A && kHeadDim <= 128 && !kMod && !kPaged;
    constexpr bool kWs256 = FAD_SM90A && kHeadDim == 256 && !kMod && !kPaged && FAD_WG_WS && FAD_WS_D256;
    constexpr bool kWsPaged = FAD_SM90A && kHeadDim == 128 && !kMod && kPaged && FAD_WG_WS && FAD_WS_PAGED;
    constexpr bool kWs = (kHasWgmma && FAD_WG_WS && (kHeadDim == 128 || (kHeadDim == 64 && FAD_WS_D64_CONSUMERS))) ||
                         kWs256 || kWsPaged;
    constexpr bool kWgmma = kHasWgmma && (!kWs || kHeadDim == 64);
    fad_status st = FAD_OK;
    switch (a.plan.kernel) {
    case FAD_FWD_GROUPS:
        /* A one-CTA plan past FAD_MERGE_GROUP splits: fwd_kernel's kGroups
         * variant (mma.sync, the same bits as every other kernel), its X
         * slots all free first, and no combine. */
        CUDA_TRY(cudaMemsetAsync(a.ws_x_flag, 0, (size_t)a.plan.x_slots * sizeof(unsigned), stream));
        st = launch_prefill<T, kHeadDim, kMod, kPaged, false>(a, stream, msg, msg_len);
        if (st != FAD_OK)
            return st;
        CUDA_TRY(cudaGetLastError());
        return FAD_OK;
    case FAD_FWD_PACKED:
        st = launch_packed<T, kHeadDim, kMod, kPaged>(a, stream, msg, msg_len);
        break;
    case FAD_FWD_MMA:
        st = launch_prefill<T, kHeadDim, kMod, kPaged, false>(a, stream, msg, msg_len);
        break;
    case FAD_FWD_WGMMA:
        if constexpr (kWgmma)
            st = launch_prefill<T, kHeadDim, kMod, kPaged, true>(a, stream, msg, msg_len);
        else
            st = fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no wgmma prefill kernel at head dim %d", kHeadDim);
        break;
    default: /* the warp-specialized kernel's shapes */
        if constexpr (kWs)
            st = launch_prefill_ws<T, kHeadDim, kPaged>(a, stream, msg, msg_len);
        else
            st = fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no warp-specialized kernel at head dim %d", kHeadDim);
        break;
    }
    if (st != FAD_OK)
        return st;
    CUDA_TRY(cudaGetLastError());
    return launch_combine<T, kHeadDim>(a, stream, msg, msg_len);
}

template <typename T, bool kMod, bool kPaged>
static fad_status dispatch_head_dim(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    switch (fad_fwd_head_dim_bound(a.p.head_dim)) {
    case 64: return launch<T, 64, kMod, kPaged>(a, s, msg, msg_len);
    case 128: return launch<T, 128, kMod, kPaged>(a, s, msg, msg_len);
    case 192: return launch<T, 192, kMod, kPaged>(a, s, msg, msg_len);
    default: return launch<T, 256, kMod, kPaged>(a, s, msg, msg_len);
    }
}

/* Paged KV (block_table) is its own compile-time variant: the block-table
 * look-ups stay out of the contiguous kernels' registers. */
template <typename T, bool kMod>
static fad_status dispatch_paged(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (a.p.block_table)
        return dispatch_head_dim<T, kMod, true>(a, s, msg, msg_len);
    return dispatch_head_dim<T, kMod, false>(a, s, msg, msg_len);
}

/* The one place a call picks its compile-time variant: dtype x head dim x
 * whether scores need a mod (softcap/ALiBi) before the softmax x paged KV. */
template <typename T>
static fad_status dispatch_mod(const fwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (fad_scores_modded(&a.p)) /* (dropout: a kDrop variant of either, fwd_prefill.cu) */
        return dispatch_paged<T, true>(a, s, msg, msg_len);
    return dispatch_paged<T, false>(a, s, msg, msg_len);
}

/* The keys of a sequence (FAD_MAX_SEQLEN_K), and grid x (CUDA's limit 2^31 - 1) of the
 * attention kernel and of the combine, checked before the first launch: a padded call's query rows are within it (the Python glue refuses
 * more), but a varlen batch of many sequences sizes its grid by the longest
 * (batch x heads x blocks of max_seqlen_q). Grid y and z carry the splits (split_grid). */
static fad_status check_grid(const fwd_args &a, char *msg, size_t msg_len)
{
    const fad_status st = fad_check_seqlen_k(a.p.seqlen_k, msg, msg_len);
    if (st != FAD_OK)
        return st;
    const int64_t attn = a.plan.packed ? packed_grid_x(a)
                                       : (int64_t)a.plan.m_blocks * a.p.batch * a.p.num_heads;
    const int64_t most = a.plan.cta_per_split && combine_grid_x(a) > attn ? combine_grid_x(a) : attn;
    if (most <= 0x7fffffff)
        return FAD_OK;
    return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                    "batch, num_heads, seqlen_q: the forward needs %lld CTAs (batch %d x heads "
                    "x blocks of seqlen_q %d, the longest), past CUDA's grid limit of 2^31 - 1",
                    (long long)most, a.p.batch, a.p.seqlen_q);
}

extern "C" fad_status fad_fwd_cuda_launch(const fad_fwd_params *p, const fad_plan *plan,
                                          void *workspace, struct CUstream_st *stream, char *msg,
                                          size_t msg_len)
{
    fwd_args a;
    a.p = *p;
    a.plan = *plan;
    a.ws_o = (float *)((char *)workspace + plan->ws_o_offset);
    a.ws_ml = (float *)((char *)workspace + plan->ws_ml_offset);
    a.ws_flag = plan->cta_per_split ? (int *)((char *)workspace + plan->ws_flag_offset) : nullptr;
    a.ws_r = plan->r_slots ? (float *)((char *)workspace + plan->ws_r_offset) : nullptr;
    a.ws_r_flag = plan->r_slots ? (unsigned *)((char *)workspace + plan->ws_r_flag_offset) : nullptr;
    a.ws_x = plan->x_slots ? (float *)workspace : nullptr;
    a.ws_x_flag = plan->x_slots ? (unsigned *)((char *)workspace + fad_x_flag_offset(plan->x_slots)) : nullptr;
    a.run_ctas = 0; /* (launch(): packed plans) */
    const fad_status st = check_grid(a, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* The one-CTA walks but fwd_kernel's kGroups variant fold a row's splits
     * in one chain, the two-level order only up to one group (fad_math.h,
     * FAD_MERGE_GROUP): fad_make_plan gives a longer row a CTA per split or X
     * slots (that variant; launch() sends it nowhere else), so a plan with
     * neither is a bug, refused here rather than answered in another order;
     * so is a plan with X slots that is not a one-CTA prefill plan. */
    if (plan->x_slots && (plan->cta_per_split || plan->packed || plan->r_slots))
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: X slots in a plan that is no one-CTA prefill plan");
    if ((plan->kernel == FAD_FWD_GROUPS) != (plan->x_slots != 0) || (plan->kernel == FAD_FWD_PACKED) != (plan->packed != 0))
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: the plan's kernel %d against its X slots and packing",
                        plan->kernel);
    if (!plan->cta_per_split && !plan->x_slots && fad_num_splits(p->seqlen_k, plan->split_size) > FAD_MERGE_GROUP)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: a one-CTA plan of %d splits (at most %d)",
                        fad_num_splits(p->seqlen_k, plan->split_size), FAD_MERGE_GROUP);
    if (p->dtype == FAD_BFLOAT16)
        return dispatch_mod<__nv_bfloat16>(a, stream, msg, msg_len);
    return dispatch_mod<__half>(a, stream, msg, msg_len);
}
