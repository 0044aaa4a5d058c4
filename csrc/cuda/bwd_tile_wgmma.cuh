/*
 * bwd_tile_wgmma.cuh — the pieces the backward's two sm_90a kernels share:
 * operand descriptors, the wgmma chains they issue, and scores -> P.
 */
#ifndef FAD_BWD_TILE_WGMMA_CUH
#define FAD_BWD_TILE_WGMMA_CUH

#include "bwd_block.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

/* The wgmma kernels' argument: bwd_args, and where tma is set the tensor maps
 * (tma.cuh) through which their producer copies whole tiles: Q and dO
 * (dK/dV kernel), K and V (dQ kernel). */
struct bwd_ws_args {
    bwd_args a;
    fad_tensor_map map0, map1;
    int tma;
};

/* Descriptor of k16 chunk kk of a K-major swz128 operand: rows 0.. of a tile
 * of kTileRows rows starting at desc0's address (32 bytes per chunk inside a
 * 64-column block, then the next block). */
template <int kTileRows>
__device__ __forceinline__ uint64_t kmajor_chunk(uint64_t desc0, int kk)
{
    return gmma_desc_at(desc0, ((kk / 4) * kTileRows * 64 + (kk % 4) * 16) * 2);
}

/* acc (64 x kHeadDim) += A (registers: a[kk] for k16 chunk kk) * B (a swz128
 * tile of kK rows x kHeadDim at b_addr, read MN-major: rows are the k dim). */
template <typename T, int kHeadDim, int kK>
__device__ __forceinline__ void issue_rs_mn(float (&acc)[kHeadDim / 8][4], uint32_t (&a)[kK / 16][4],
                                            uint32_t b_addr)
{
    const uint64_t b_desc0 = gmma_desc(b_addr, kK * 128, 1024);
    wgmma_fence_operand(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk++) /* 16 rows of 128 bytes per k-chunk */
        wgmma_rs_mnmajor(acc, a[kk], gmma_desc_at(b_desc0, kk * 16 * 128), (const T *)nullptr);
    wgmma_commit();
}

/* d (64 x kN) = A (this warpgroup's 64 rows of a K-major swz128 tile of kARows
 * rows at a_addr) * B^T (kN rows at b_addr of a K-major swz128 tile of kBRows
 * rows). The first k-chunk overwrites d (accumulate 0), so d needs no zeroing. */
template <typename T, int kHeadDim, int kARows, int kN, int kBRows = kN>
__device__ __forceinline__ void issue_ss(float (&d)[kN / 8][4], uint32_t a_addr, uint32_t b_addr)
{
    const uint64_t a_desc0 = gmma_desc(a_addr, 16, 1024), b_desc0 = gmma_desc(b_addr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; kk++)
        wgmma_ss(d, kmajor_chunk<kARows>(a_desc0, kk), kmajor_chunk<kBRows>(b_desc0, kk), (const T *)nullptr,
                 kk > 0);
    wgmma_commit();
}

/* acc (64 x 64) = A (64 rows at a_addr of a K-major swz128 tile of kARows
 * rows x kK) * B (a swz128 tile of kK rows at b_addr, one 64-column block,
 * read MN-major): the five-product backward's dQ = dS K (bwd_dkdv_wgmma.cu),
 * k16 chunks in increasing order; the first overwrites acc. */
template <typename T, int kARows, int kK>
__device__ __forceinline__ void issue_ss_mn(float (&acc)[8][4], uint32_t a_addr, uint32_t b_addr)
{
    const uint64_t a_desc0 = gmma_desc(a_addr, 16, 1024), b_desc0 = gmma_desc(b_addr, kK * 128, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk++)
        wgmma_ss_mnb(acc, kmajor_chunk<kARows>(a_desc0, kk), gmma_desc_at(b_desc0, kk * 16 * 128), (const T *)nullptr,
                     kk > 0);
    wgmma_commit();
}

/* FAD_BWD_WG_D256_SPLIT_SDP: the two math warpgroups' exchange of A fragments.
 * Warpgroup w made k16 chunks [kHalf w, kHalf (w + 1)) of an operand of 2 kHalf
 * chunks; each thread stores its own (its fragments of a chunk: 16 bytes, so a
 * warpgroup's chunk is 2 KB, conflict-free), the two meet (split_meet), and each
 * reads every chunk back in order: thread t of both warpgroups holds the same
 * rows of the A operand, so chunk kk of either is thread t's. x: this step's
 * buffer of the operand, 2 kHalf x 128 uint4 (double-buffered by step parity:
 * a warpgroup's next stores into it come after the next meeting, which the
 * other passes only once it has read this step's). */
template <int kHalf>
__device__ __forceinline__ void split_store(uint4 *x, const uint32_t (&own)[kHalf][4], int wg, int tid)
{
#pragma unroll
    for (int kk = 0; kk < kHalf; kk++)
        x[(wg * kHalf + kk) * 128 + tid] = make_uint4(own[kk][0], own[kk][1], own[kk][2], own[kk][3]);
}
/* Both math warpgroups' stores are done (named barrier 3; 1 and 2 are warpgroup_sync's). */
__device__ __forceinline__ void split_meet() { named_bar_sync(3, 256); }
template <int kChunks>
__device__ __forceinline__ void split_load(const uint4 *x, uint32_t (&all)[kChunks][4], int tid)
{
#pragma unroll
    for (int kk = 0; kk < kChunks; kk++) {
        const uint4 v = x[kk * 128 + tid];
        all[kk][0] = v.x, all[kk][1] = v.y, all[kk][2] = v.z, all[kk][3] = v.w;
    }
}

/* S^T -> P^T in place (dkdv): element (nb, e) of a thread is key
 * key0 + 8 (e/2) and query row m0 + 8 nb + 2 (lane%4) + e%2, whose lse (log2
 * units) is lse2[row - m0]. kMask: some element may lie outside its row's
 * key range (else none does). The element-wise math of dkdv_kernel (its
 * mask through fad_band, the per-element form of fad_row_keys). */
template <bool kMask, int kMB>
__device__ __forceinline__ void scores_to_p(float (&pt)[kMB][4], const float *lse2,
                                            const fad_score_mod &mod, const fad_band &band, int m0,
                                            int key0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < kMB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i_loc = nb * 8 + (lane % 4) * 2 + e % 2, i = m0 + i_loc, j = key0 + 8 * (e / 2);
            const float x = kMask && fad_band_masked(band, i, j) ? -INFINITY : pt[nb][e];
            pt[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[i_loc]);
        }
}

/* S -> P in place (dq): element (nb, e) of a thread is its row r = e/2
 * (lse2[r], key range rk[r]) and key t0 + 8 nb + 2 (lane%4) + e%2. */
template <bool kMask, int kNB>
__device__ __forceinline__ void scores_to_p(float (&pr)[kNB][4], const float (&lse2)[2],
                                            const fad_key_range (&rk)[2], const fad_score_mod &mod,
                                            int t0)
{
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int nb = 0; nb < kNB; nb++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int r = e / 2, j = t0 + nb * 8 + (lane % 4) * 2 + e % 2;
            const bool masked = kMask && (j < rk[r].lo || j >= rk[r].hi);
            const float x = masked ? -INFINITY : pr[nb][e];
            pr[nb][e] = fad_exp_score(x, mod.exp_scale, lse2[r]);
        }
}

#endif /* FAD_BWD_TILE_WGMMA_CUH */
