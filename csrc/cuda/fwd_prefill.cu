/*
 * fwd_prefill.cu — the launch of the prefill kernel (fwd_prefill_kernel.cuh)
 * and its variants but the group walk's (fwd_prefill_groups.cu).
 */
#include "fwd_prefill_kernel.cuh"

template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kWgmma>
fad_status launch_prefill(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = fwd_cfg<kHeadDim, kWgmma>;
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES];
    static int smem_set_groups[FAD_MAX_DEVICES];
    fwd_kernel_fn kernel = fwd_kernel<T, kHeadDim, kMod, kPaged, kWgmma>;
    int *set = smem_set;
    size_t smem = C::kSmemBytes;
    /* dropout: its own variant with dropout compiled in (no pages: refused before) */
    if constexpr (!kPaged)
        if (a.p.dropout_p > 0.f)
            kernel = fwd_kernel<T, kHeadDim, kMod, false, kWgmma, true>, set = smem_set_drop;
    /* a one-CTA plan past FAD_MERGE_GROUP splits (its X slots): the kGroups
     * variant (fwd_prefill_groups.cu), mma.sync only (fwd_launch.cu sends such
     * a plan nowhere else), without dropout (its dropout builds took the
     * prefill kernels' compile from 59 to 126 s at sm_90a: make_gpu_plan
     * refuses dropout on this schedule) */
    if (a.plan.x_slots) {
        if (kWgmma || a.p.dropout_p > 0.f)
            return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: a group walk on the wgmma or dropout variant");
        if constexpr (!kWgmma)
            kernel = fwd_groups_kernel<T, kHeadDim, kMod, kPaged>(), set = smem_set_groups;
        smem = C::kSmemGroupsBytes;
    }
    fad_status st = allow_smem(kernel, set, smem, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (C::kBlockM != fad_block_m(a.p.head_dim)) /* the plan's m_blocks assume this tile */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: tile rows %d != plan's %d",
                        C::kBlockM, fad_block_m(a.p.head_dim));
    const dim3 grid = split_grid((int64_t)a.plan.m_blocks * a.p.batch * a.p.num_heads, a.plan);
    kernel<<<grid, C::kThreads, smem, stream>>>(a);
    return FAD_OK;
}

/* The warp-specialized kernel (fwd_prefill_ws.cu): one CTA per pair of the
 * plan's 64-row query blocks. */

#define FAD_INST(T, D, MOD, PAGED, WG) \
    template fad_status launch_prefill<T, D, MOD, PAGED, WG>(const fwd_args &, cudaStream_t, char *, size_t);
#define FAD_INST_ALL(T, D, MOD, PAGED) FAD_INST(T, D, MOD, PAGED, false)
FAD_FWD_VARIANTS(FAD_INST_ALL)
/* the wgmma variant: D 64, and D 128 where the warp-specialized kernel is off;
 * only in a build with sm_90a code, the one that launches it */
#if FAD_SM90A
FAD_INST(__half, 64, false, false, true)
FAD_INST(__nv_bfloat16, 64, false, false, true)
#if !FAD_WG_WS
FAD_INST(__half, 128, false, false, true)
FAD_INST(__nv_bfloat16, 128, false, false, true)
#endif
#endif
