/*
 * bwd_launch.cu — the backward's one dispatch point: a call's compile-time
 * variant (dtype x head dim x score mod) and its kernels, dsum then dK/dV and
 * dQ (or the one part asked for) on mma.sync or on their sm_90a variants.
 */
#include <string.h>

#include "bwd_cfg.cuh"
#include "bwd_dq_accum.cuh"
#include "bwd_launch.h"
#include "mma.cuh"

/* FLASH_ATTN_DET_BWD_DQ (read once): "reduce" (the default; also unset or
 * empty) or "recompute". reduce: where dq_reduce_applies holds, the dK/dV kernel
 * issues the fifth product dQ = dS K itself and adds it to an fp32
 * accumulator in key-block order (bwd_dq_accum.cuh), and a conversion kernel
 * (bwd_dq_post.cu) replaces the dQ kernel, which recomputes S and dP. The two
 * settings give different bits, each a function of positions inside the
 * sequence only: dQ's sum is regrouped, and with GQA the dK/dV kernel walks
 * its row tiles from the last down, the heads inner, which regroups dK's and
 * dV's (bwd_dkdv_wgmma.cu, step_h). */
static fad_status dq_reduce_env(int *reduce, char *msg, size_t msg_len)
{
    static int env = -1; /* 0 recompute, 1 reduce, 2 neither */
    const char *e = getenv("FLASH_ATTN_DET_BWD_DQ");
    if (env < 0)
        env = !e || !e[0] || strcmp(e, "reduce") == 0 ? 1 : strcmp(e, "recompute") == 0 ? 0 : 2;
    *reduce = env == 1;
    if (env == 2)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len,
                        "FLASH_ATTN_DET_BWD_DQ: expected 'reduce' or 'recompute', got '%s'", e ? e : "");
    return FAD_OK;
}

/* The one rule for whether a call's dQ is summed by the dK/dV kernel (the
 * workspace size and the dispatch both ask here): the switch not "recompute", the sm_90a
 * kernels in use (fad_use_wgmma), head dim <= 128, not dropout with a score
 * mod (D256 and that pair keep the dQ kernel: launch_bwd's wgmma rule). Every
 * other input, the grid size included,
 * leaves it unchanged: the bits of one (dtype, head dim, mods) must not
 * depend on the batch (launch_bwd, the small-grid rule). A dK/dV-only call
 * runs it too, its dQ adds left unconverted in the workspace: with GQA that
 * kernel walks its row tiles in its own order (bwd_dkdv_wgmma.cu, step_h), and
 * dK, dV must not depend on whether dQ was asked for. */
static fad_status dq_reduce_applies(const fad_fwd_params &p, int *use, char *msg, size_t msg_len)
{
    int env = 0;
    *use = 0;
    fad_status st = dq_reduce_env(&env, msg, msg_len);
    if (st != FAD_OK || !env || !FAD_SM90A || p.head_dim > 128 || (p.dropout_p > 0.f && fad_scores_modded(&p)))
        return st;
    int wgmma = 0;
    st = fad_use_wgmma(&wgmma, msg, msg_len);
    *use = wgmma != 0;
    return st;
}

/* The accumulator's bytes with its semaphores (bwd_dq_accum.cuh has the layout). */
static size_t dq_accum_bytes(const fad_fwd_params &p)
{
    return p.head_dim <= 64 ? dq_accum_cfg<64>::bytes(p) : dq_accum_cfg<128>::bytes(p);
}

/* The workspace past the row sums (fad_bwd_workspace_need, fad_core.c): the
 * dQ accumulator, then its semaphores, from dsum_bytes rounded up to 256. */
extern "C" fad_status fad_bwd_cuda_extra_bytes(const fad_bwd_params *bp, size_t dsum_bytes, size_t *bytes,
                                               char *msg, size_t msg_len)
{
    int use = 0;
    *bytes = 0;
    const fad_status st = dq_reduce_applies(bp->fwd, &use, msg, msg_len);
    if (st == FAD_OK && use)
        *bytes = (dsum_bytes + 255) / 256 * 256 - dsum_bytes + dq_accum_bytes(bp->fwd);
    return st;
}

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
    if (a.dq_accum) { /* five products: dK/dV (stored unless only dQ is asked for) and dQ's adds, then dQ
                       * (unless only dK/dV are) */
        bwd_args r = a;
        if (a.part == FAD_BWD_DQ)
            r.dk = r.dv = nullptr;
        if (dkdv_ctas > 0)
            st = launch_dkdv_wgmma<T, kHeadDim, kMod>(r, dkdv_ctas, stream, msg, msg_len);
        if (st == FAD_OK && a.part != FAD_BWD_DKDV)
            st = launch_dq_post<T, kHeadDim>(a, stream, msg, msg_len);
        return st;
    }
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
    /* (not with a dQ accumulator: the mma.sync path's dQ has the dQ kernel's
     * bits, not the accumulator's, so taking it for small grids would make dQ
     * depend on the batch size; dK and dV are the same on either path) */
    if (wgmma == 1 && ctas < sms && !a.dq_accum)
        wgmma = 0;
    if (st != FAD_OK)
        return st;
    if (a.dq_accum) /* the semaphores start at zero (the accumulator's first add is a copy) */
        CUDA_TRY(cudaMemsetAsync(a.dq_sems, 0, (size_t)p.num_heads * a.dq_head_tiles * sizeof(int) + sizeof(unsigned),
                                 stream)); /* (and the ticket after them) */
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
extern "C" fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, void *workspace,
                                          struct CUstream_st *stream, char *msg, size_t msg_len)
{
    bwd_args a;
    a.p = bp->fwd;
    a.dout = bp->dout, a.dq = bp->dq, a.dk = bp->dk, a.dv = bp->dv;
    a.part = bp->part; /* the dQ and dK/dV passes only share dsum: either may be left out */
    a.dsum = (float *)workspace;
    a.n_blocks = a.m_blocks = 0;
    a.dq_accum = nullptr, a.dq_sems = nullptr, a.dq_ticket = nullptr, a.dq_m_tiles = 0, a.dq_head_tiles = 0;
    size_t extra = 0;
    const size_t dsum_bytes = (size_t)fad_flat_rows(&a.p) * sizeof(float);
    fad_status st = fad_bwd_cuda_extra_bytes(bp, dsum_bytes, &extra, msg, msg_len);
    if (st != FAD_OK)
        return st;
    if (extra) { /* (zeroed in launch_bwd, once the checks passed) */
        const size_t off = (dsum_bytes + 255) / 256 * 256;
        const bool d64 = a.p.head_dim <= 64;
        a.dq_m_tiles = d64 ? dq_accum_cfg<64>::m_tiles(a.p) : dq_accum_cfg<128>::m_tiles(a.p);
        a.dq_head_tiles = d64 ? dq_accum_cfg<64>::head_tiles(a.p) : dq_accum_cfg<128>::head_tiles(a.p);
        const int64_t tiles = (int64_t)a.p.num_heads * a.dq_head_tiles;
        a.dq_accum = reinterpret_cast<float *>((char *)workspace + off);
        a.dq_sems = reinterpret_cast<int *>(a.dq_accum + tiles * dq_accum_cfg<64>::kTileFloats);
        a.dq_ticket = reinterpret_cast<unsigned *>(a.dq_sems + tiles);
        static_assert(dq_accum_cfg<64>::kTileFloats == dq_accum_cfg<128>::kTileFloats, "one tile size");
    }
    /* (dropout: a kDrop variant of either, on mma.sync or wgmma: bwd_dq.cu, bwd_dkdv.cu and
     * their sm_90a variants) */
    const bool mod = fad_scores_modded(&a.p);
    if (a.p.dtype == FAD_BFLOAT16)
        return mod ? bwd_dispatch_head_dim<__nv_bfloat16, true>(a, stream, msg, msg_len)
                   : bwd_dispatch_head_dim<__nv_bfloat16, false>(a, stream, msg, msg_len);
    return mod ? bwd_dispatch_head_dim<__half, true>(a, stream, msg, msg_len)
               : bwd_dispatch_head_dim<__half, false>(a, stream, msg, msg_len);
}

