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

/* The dK/dV kernel's epilogue without split columns (D <= 128): dK and dV of
 * the CTA's kN keys x kHeadDim, staged in shared memory (s_dk, s_dv: kN rows
 * of kHeadDim elements each, sK's and sV's space, free once every product is
 * done) so that the global stores are whole 16-byte chunks, a warp's 32 of
 * them two rows (D128) or four (D64) in a row; thread tid (0..255) of the
 * math warpgroups holds rows key_row + 8r as store_dkdv's. Storing each
 * accumulator pair with a 4-byte store, the math warps spent about 2.6 steps'
 * time a CTA in this epilogue, throttled by the LSU queue (Nsight Compute,
 * D128 L8k). Chunk c of row r lives at chunk c ^ (r % 8) of its row, so the
 * 8 rows of a stmatrix and the 8 chunks of a quarter warp's load hit
 * distinct banks. Barrier 3 (split_meet's, a D256 kernel's only) among the
 * 256 math threads: before, both warpgroups are done with sK and sV (the
 * other's dQ product reads this one's keys); after, the tile is stored. */
template <typename T, int kHeadDim, int kN>
__device__ __forceinline__ void store_dkdv_staged(const float (&dk)[kHeadDim / 8][4], const float (&dv)[kHeadDim / 8][4],
                                                  T *s_dk, T *s_dv, const bwd_args &a, const fad_seq &seq, int hk,
                                                  int n0, int tid)
{
    constexpr int kChunks = kHeadDim / 8; /* 16-byte chunks a row */
    static_assert(kChunks >= 8 && kN == 128, "the swizzle spans 8 chunks; two math warpgroups of 64 keys, 256 threads");
    const fad_fwd_params &p = a.p;
    const int warp = tid / 32, lane = tid % 32;
    auto at = [](T *s, int row, int chunk) {
        return smem_addr(s) + (uint32_t)(row * kHeadDim + ((chunk ^ (row % 8)) * 8)) * (uint32_t)sizeof(T);
    };
    named_bar_sync(3, 256);
    {
        const int i = lane / 8, row = warp * 16 + lane % 8 + 8 * (i % 2);
#pragma unroll
        for (int nb = 0; nb < kChunks; nb += 2) { /* matrices (rows 0-7, 8-15) x (chunks nb, nb + 1) */
            const uint32_t k4[4] = {dtype_ops<T>::pack(dk[nb][0], dk[nb][1]), dtype_ops<T>::pack(dk[nb][2], dk[nb][3]),
                                    dtype_ops<T>::pack(dk[nb + 1][0], dk[nb + 1][1]),
                                    dtype_ops<T>::pack(dk[nb + 1][2], dk[nb + 1][3])};
            const uint32_t v4[4] = {dtype_ops<T>::pack(dv[nb][0], dv[nb][1]), dtype_ops<T>::pack(dv[nb][2], dv[nb][3]),
                                    dtype_ops<T>::pack(dv[nb + 1][0], dv[nb + 1][1]),
                                    dtype_ops<T>::pack(dv[nb + 1][2], dv[nb + 1][3])};
            stmatrix_x4<false>(at(s_dk, row, nb + i / 2), k4);
            stmatrix_x4<false>(at(s_dv, row, nb + i / 2), v4);
        }
    }
    named_bar_sync(3, 256);
    T *gk = (T *)a.dk + seq.k_off + hk * p.k_head_stride, *gv = (T *)a.dv + seq.v_off + hk * p.v_head_stride;
#pragma unroll
    for (int pass = 0; pass < kN * kChunks / 256; pass++) {
        const int c = pass * 256 + tid, row = c / kChunks, chunk = c % kChunks;
        const int j = n0 + row;
        if (j >= seq.len_k || chunk * 8 >= p.head_dim)
            continue;
        uint4 kx, vx;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(kx.x), "=r"(kx.y), "=r"(kx.z), "=r"(kx.w) : "r"(at(s_dk, row, chunk)));
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(vx.x), "=r"(vx.y), "=r"(vx.z), "=r"(vx.w) : "r"(at(s_dv, row, chunk)));
        *reinterpret_cast<uint4 *>(gk + (int64_t)j * p.k_row_stride + chunk * 8) = kx;
        *reinterpret_cast<uint4 *>(gv + (int64_t)j * p.v_row_stride + chunk * 8) = vx;
    }
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
__device__ __forceinline__ void split_meet() { asm volatile("bar.sync 3, 256;\n" ::: "memory"); }
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
