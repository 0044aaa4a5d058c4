/*
 * bwd_launch.h — what the backward's files share on the host side: the kernel
 * argument (bwd_args), the list of compile-time variants and the launch
 * function of each kernel file (bwd_dsum.cu, bwd_dkdv.cu, bwd_dq.cu and their
 * sm_90a variants bwd_dkdv_wgmma.cu, bwd_dq_wgmma.cu); bwd_launch.cu picks.
 */
#ifndef FAD_BWD_LAUNCH_H
#define FAD_BWD_LAUNCH_H

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "fad_internal.h"

struct bwd_args {
    fad_fwd_params p;  /* the forward's tensors and options (resolved) */
    const void *dout;  /* like out */
    void *dq, *dk, *dv; /* like q, k, v */
    float *dsum;       /* one fp32 per flat row: D_i */
    /* Where the five-product backward applies (FLASH_ATTN_DET_BWD_DQ, bwd_launch.cu; else NULL):
     * dQ summed in fp32 by the dK/dV kernel, tile by tile in key-block order
     * (bwd_dq_accum.cuh), then converted (bwd_dq_post.cu); dq_sems: one
     * semaphore a tile; dq_m_tiles: row tiles of the longest sequence; dq_head_tiles: a head's
     * tiles (bwd_dq_accum.cuh, dq_tile) */
    float *dq_accum;
    int *dq_sems;
    /* the next work item of the five-product dK/dV kernel's persistent grid
     * (bwd_dkdv_wgmma.cu, kPersist): one counter after the semaphores, zeroed with them */
    unsigned *dq_ticket;
    int dq_m_tiles;
    int64_t dq_head_tiles;
    int n_blocks;      /* key tiles per (sequence, kv head) in dkdv_kernel's grid */
    int m_blocks;      /* row tiles per (sequence, head) in dq_kernel's grid */
    fad_bwd_part part; /* which passes run (host side only; last, so the kernels' view of the
                        * fields above is unchanged) */
};

/* The compile-time variants, X(T, kHeadDim, kMod): dtype x head-dim class x
 * whether scores carry a mod (softcap/ALiBi). The wgmma kernels, X(T,
 * kHeadDim), are each built with and without a mod. */
#define FAD_BWD_VARIANTS_T(X, T) \
    X(T, 64, false) X(T, 64, true) X(T, 128, false) X(T, 128, true) X(T, 256, false) X(T, 256, true)
#define FAD_BWD_VARIANTS(X) FAD_BWD_VARIANTS_T(X, __half) FAD_BWD_VARIANTS_T(X, __nv_bfloat16)
#define FAD_BWD_WGMMA_VARIANTS(X) \
    X(__half, 64) X(__half, 128) X(__half, 256) X(__nv_bfloat16, 64) X(__nv_bfloat16, 128) X(__nv_bfloat16, 256)

/* launch_dsum sizes its own grid (kDsumRows rows a CTA, bwd_dsum.cu); the others
 * launch their kernel on a grid of `ctas` CTAs (a.n_blocks, a.m_blocks set). */
template <typename T>
fad_status launch_dsum(const bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);
template <typename T, int kHeadDim, bool kMod>
fad_status launch_dkdv(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len);
template <typename T, int kHeadDim, bool kMod>
fad_status launch_dq(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len);
/* (a.dq_accum set: the variant that also adds dQ into it; then dK/dV are stored only where a.dk is set) */
template <typename T, int kHeadDim, bool kMod>
fad_status launch_dkdv_wgmma(const bwd_args &a, int64_t ctas, cudaStream_t stream, char *msg, size_t msg_len);
/* (pdl: the dQ kernel as a programmatic dependent of the dK/dV kernel launched just before it) */
template <typename T, int kHeadDim, bool kMod>
fad_status launch_dq_wgmma(const bwd_args &a, int64_t ctas, cudaStream_t stream, int pdl, char *msg,
                           size_t msg_len);

/* dQ from a.dq_accum, converted to the dtype (D 64 and 128 only: bwd_dq_accum.cuh) */
template <typename T, int kHeadDim>
fad_status launch_dq_post(const bwd_args &a, cudaStream_t stream, char *msg, size_t msg_len);

#endif /* FAD_BWD_LAUNCH_H */
