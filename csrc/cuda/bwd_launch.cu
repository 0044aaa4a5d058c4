/*
 * bwd_launch.cu — the backward's one dispatch point: a call's compile-time
 * variant (dtype x head dim x score mod) and its kernels, dsum then dK/dV and
 * dQ (or the one part asked for) on mma.sync or on their sm_90a variants.
 */
#include "bwd_cfg.cuh"
#include "bwd_launch.h"
#include "mma.cuh"

/* The sm_90a variants (bwd_dkdv_wgmma.cu, bwd_dq_wgmma.cu): D 64, 128 and 256,
 * with or without a score mod, where fad_use_wgmma allows them; the same bits
 * as the mma.sync kernels, so which one runs may depend on anything, the grid
 * size included. Their CTAs are larger (128 keys for dK/dV; at D256 64 keys
 * and every column), so on a grid of fewer dK/dV CTAs than SMs the mma.sync
 * kernels run instead (measured: a B8 L256 training step, docs/design.md,
 * "backward-order"), unless forced. */
template <typename T, int kHeadDim, bool kMod>
static fad_status launch_bwd_wgmma(bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = bwd_wg_cfg<kHeadDim>;
    const fad_fwd_params &p = a.p;
    a.n_blocks = (p.seqlen_k + C::kKeys - 1) / C::kKeys;
    a.m_blocks = (p.seqlen_q + C::kRows - 1) / C::kRows;
    const int64_t dkdv_ctas = (int64_t)a.n_blocks * p.batch * p.num_heads_k;
    const int64_t dq_ctas = (int64_t)a.m_blocks * p.batch * p.num_heads;
    fad_status st = FAD_OK;
    const bool dkdv = dkdv_ctas > 0 && a.part != FAD_BWD_DQ;
    if (dkdv)
        st = launch_dkdv_wgmma<T, kHeadDim, kMod>(a, dkdv_ctas, stream, msg, msg_len);
    /* The dQ kernel reads nothing the dK/dV kernel writes: launched as its
     * programmatic dependent (FAD_BWD_DQ_PDL), its CTAs take the SMs that
     * kernel's last wave leaves idle, and it ends after it (each of its
     * CTAs waits for it before ending). Only right behind it: behind the
     * dsum kernel it would read dsum early. */
    if (st == FAD_OK && dq_ctas > 0 && a.part != FAD_BWD_DKDV)
        st = launch_dq_wgmma<T, kHeadDim, kMod>(a, dq_ctas, stream, FAD_BWD_DQ_PDL && dkdv, msg, msg_len);
    return st;
}

/* Every grid of the backward is 1-D, x capped by CUDA at 2^31 - 1: checked before the
 * first launch (dsum), for whichever kernels run, with the keys of a sequence
 * (FAD_MAX_SEQLEN_K). A padded call is within it (the Python glue
 * bounds its query rows), but a varlen batch of many sequences sizes its grids by the longest
 * (batch x heads x blocks of max_seqlen_q / max_seqlen_k). (64: bwd_dsum.cu's kDsumRows.) */
template <int kHeadDim>
static fad_status check_grids(const fad_fwd_params &p, char *msg, size_t msg_len)
{
    using C = bwd_cfg<kHeadDim>;
    using W = bwd_wg_cfg<kHeadDim>;
    auto blocks = [](int n, int per) { return ((int64_t)n + per - 1) / per; };
    const int rows = C::kRows < W::kRows ? (C::kRows < 64 ? C::kRows : 64) : (W::kRows < 64 ? W::kRows : 64);
    const int64_t dq = blocks(p.seqlen_q, rows) * p.batch * p.num_heads;
    const int64_t mma = blocks(p.seqlen_k, C::kKeys) * C::kColSplit, wg = blocks(p.seqlen_k, W::kKeys);
    const int64_t dkdv = (mma > wg ? mma : wg) * p.batch * p.num_heads_k;
    const fad_status st = fad_check_seqlen_k(p.seqlen_k, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (dq <= 0x7fffffff && dkdv <= 0x7fffffff)
        return FAD_OK;
    return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                    "batch, num_heads, seqlen_q, seqlen_k: the backward needs %lld CTAs (batch %d "
                    "x heads x blocks of the longest sequence), past CUDA's grid limit of 2^31 - 1",
                    (long long)(dq > dkdv ? dq : dkdv), p.batch);
}

template <typename T, int kHeadDim, bool kMod>
static fad_status launch_bwd(bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    using C = bwd_cfg<kHeadDim>;
    int wgmma = 0;
    fad_status st = check_grids<kHeadDim>(a.p, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* (a score mod with dropout stays on mma.sync: its dK/dV wgmma build at D64
     * spilled 1.2 KB, and the pair is rare; so does D256 with dropout) */
    const bool drop = a.p.dropout_p > 0.f;
    if (!(kMod && drop) && !(bwd_wg_cfg<kHeadDim>::kSplitCols && drop))
        st = fad_use_wgmma(&wgmma, msg, msg_len);
    const fad_fwd_params &p = a.p;
    int sms = 0;
    if (st == FAD_OK && wgmma == 1)
        st = fad_cuda_num_sms(&sms, msg, msg_len);
    const int64_t ctas = (int64_t)((p.seqlen_k + bwd_wg_cfg<kHeadDim>::kKeys - 1) / bwd_wg_cfg<kHeadDim>::kKeys) *
                         p.batch * p.num_heads_k;
    if (wgmma == 1 && ctas < sms)
        wgmma = 0;
    if (st != FAD_OK)
        return st;
    st = launch_dsum<T>(a, stream, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if constexpr (FAD_SM90A) /* (else the sm_90a-only kernel files are not linked) */
        if (wgmma)
            return launch_bwd_wgmma<T, kHeadDim, kMod>(a, stream, msg, msg_len);
    a.n_blocks = (p.seqlen_k + C::kKeys - 1) / C::kKeys;
    a.m_blocks = (p.seqlen_q + C::kRows - 1) / C::kRows;
    const int64_t dkdv_ctas = (int64_t)a.n_blocks * C::kColSplit * p.batch * p.num_heads_k;
    const int64_t dq_ctas = (int64_t)a.m_blocks * p.batch * p.num_heads;
    if (dkdv_ctas > 0 && a.part != FAD_BWD_DQ)
        st = launch_dkdv<T, kHeadDim, kMod>(a, dkdv_ctas, stream, msg, msg_len);
    if (st == FAD_OK && a.part != FAD_BWD_DKDV)
        st = launch_dq<T, kHeadDim, kMod>(a, dq_ctas, stream, msg, msg_len);
    return st;
}

template <typename T, bool kMod>
static fad_status bwd_dispatch_head_dim(bwd_args &a, cudaStream_t s, char *msg, size_t msg_len)
{
    if (a.p.head_dim <= 64)
        return launch_bwd<T, 64, kMod>(a, s, msg, msg_len);
    if (a.p.head_dim <= 128)
        return launch_bwd<T, 128, kMod>(a, s, msg, msg_len);
    return launch_bwd<T, 256, kMod>(a, s, msg, msg_len);
}

/* The one place the backward picks its compile-time variant: dtype x head
 * dim x whether scores carry a mod (softcap/ALiBi). */
extern "C" fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, float *dsum,
                                          struct CUstream_st *stream, char *msg, size_t msg_len)
{
    bwd_args a;
    a.p = bp->fwd;
    a.dout = bp->dout, a.dq = bp->dq, a.dk = bp->dk, a.dv = bp->dv;
    a.part = bp->part; /* the dQ and dK/dV passes only share dsum: either may be left out */
    a.dsum = dsum;
    a.n_blocks = a.m_blocks = 0;
    /* (dropout: a kDrop variant of either, on mma.sync or wgmma: bwd_dq.cu, bwd_dkdv.cu and
     * their sm_90a variants) */
    const bool mod = a.p.softcap > 0.f || a.p.alibi_slopes;
    if (a.p.dtype == FAD_BFLOAT16)
        return mod ? bwd_dispatch_head_dim<__nv_bfloat16, true>(a, stream, msg, msg_len)
                   : bwd_dispatch_head_dim<__nv_bfloat16, false>(a, stream, msg, msg_len);
    return mod ? bwd_dispatch_head_dim<__half, true>(a, stream, msg, msg_len)
               : bwd_dispatch_head_dim<__half, false>(a, stream, msg, msg_len);
}

