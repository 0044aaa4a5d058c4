/*
 * fwd_tile_wgmma.cuh — the two products of a forward tile on sm_90a (wgmma),
 * in place of fwd_tile.cuh's mma.sync chains, and attend_tile_wgmma, the
 * whole tile on them. Used by fwd_kernel's wgmma variant and fwd_ws_kernel.
 */
#ifndef FAD_FWD_TILE_WGMMA_CUH
#define FAD_FWD_TILE_WGMMA_CUH

#include "fwd_tile.cuh"
#include "wgmma.cuh"

/* The two products of a tile on sm_90a, for the 64 rows of one warpgroup:
 * wgmma chains (64 x kBlockN x 16 and 64 x kHeadDim x 16 per instruction,
 * k-chunks in increasing order) in place of attend_tile's mma.sync ones.
 * tests/wgmma_probe.cu checks that a wgmma chain gives every fp32 result
 * the bits of the mma.sync chain it replaces, and the fragments are the same
 * registers, so a row gets the same bits on either path (and prefill rows
 * still match the packed decode kernel's). Each call issues and commits one
 * wgmma group and returns; the caller waits (wgmma_wait) before it reads the
 * results or reuses the operands.
 * S = Q K^T into s (zeroed by the caller): Q from qf (kQInRegs: this warp's A
 * fragments; kQRegK: those of its first kQRegK k-chunks only, the rest read
 * from shared memory -- the same products in the same order, so the same
 * bits) or at q_addr = this warpgroup's first Q row in a swz128 tile of
 * kQRows rows; K at k_addr, a swz128 tile of kBlockN rows. */
template <typename T, int kHeadDim, int kBlockN, int kQRows, bool kQInRegs,
          int kQRegK = kQInRegs ? kHeadDim / 16 : 0>
__device__ __forceinline__ void issue_qk_wgmma(float (&s)[1][kBlockN / 8][4],
                                               const uint32_t (&qf)[1][kQRegK > 0 ? kQRegK : 1][4],
                                               uint32_t q_addr, uint32_t k_addr)
{
    static_assert(kQRegK >= 0 && kQRegK <= kHeadDim / 16, "k-chunks of Q in registers");
    const uint64_t k_desc0 = gmma_desc(k_addr, 16, 1024), q_desc0 = gmma_desc(q_addr, 16, 1024);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kHeadDim / 16; kk++) { /* K-major: 32 bytes per k-chunk in a 64-column block */
        const uint64_t k_desc = gmma_desc_at(k_desc0, ((kk / 4) * kBlockN * 64 + (kk % 4) * 16) * 2);
        if constexpr (kQRegK > 0)
            if (kk < kQRegK) { /* (kk is a constant once unrolled: no branch; the index below
                                * is clamped so that the branch ptxas drops stays in bounds) */
                wgmma_rs_kmajor(s[0], qf[0][kk < kQRegK ? kk : 0], k_desc, (const T *)nullptr);
                continue;
            }
        if constexpr (kQRegK < kHeadDim / 16)
            wgmma_ss(s[0], gmma_desc_at(q_desc0, ((kk / 4) * kQRows * 64 + (kk % 4) * 16) * 2),
                     k_desc, (const T *)nullptr);
    }
    wgmma_commit();
}

/* O += P V: P (the softmax'd s) packed to A fragments pf (the caller keeps
 * them, untouched, until the wait), V at v_addr, a swz128 tile of kBlockN
 * rows read MN-major. acc_live = false: O = P V, acc's old values unread (a
 * split's first tile: what adding to zeros gives, up to the sign of an exact
 * zero, with no zeroing of acc at each split start -- ~114 instructions per
 * split at D128, about half of what deterministic mode added over fast mode). */
template <typename T, int kBlockN>
__device__ __forceinline__ void p_fragments(const float (&s)[1][kBlockN / 8][4],
                                            uint32_t (&pf)[kBlockN / 16][4])
{
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++)
        p_fragment<T>(s[0], kk, pf[kk]);
}
/* Past 128 columns (D256) each k-chunk is one m64n128k16 per 128 columns of
 * o: an element's products are added in the same k order either way, so the
 * bits are those of one wide instruction (and of mma.sync's chain). */
template <typename T, int kHeadDim, int kBlockN>
__device__ __forceinline__ void issue_pv_wgmma_pf(float (&acc)[1][kHeadDim / 8][4],
                                                  uint32_t (&pf)[kBlockN / 16][4], uint32_t v_addr,
                                                  bool acc_live)
{
    constexpr int kN = kHeadDim < 128 ? kHeadDim : 128; /* columns per instruction */
    static_assert(kHeadDim % kN == 0, "whole instructions per row of o");
    const uint64_t v_desc0 = gmma_desc(v_addr, kBlockN * 128, 1024);
    wgmma_fence_operand(acc[0]);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; kk++) /* MN-major V: 16 key rows of 128 bytes per k-chunk */
#pragma unroll
        for (int n = 0; n < kHeadDim / kN; n++) /* (kN / 64 column blocks of kBlockN rows each) */
            wgmma_rs_mnmajor(*reinterpret_cast<float(*)[kN / 8][4]>(&acc[0][n * kN / 8]), pf[kk],
                             gmma_desc_at(v_desc0, kk * 16 * 128 + n * (kN / 64) * kBlockN * 128),
                             (const T *)nullptr, kk > 0 || acc_live);
    wgmma_commit();
}
/* attend_tile on sm_90a: S = Q K^T, the softmax step, O += P V; while_s()
 * runs while S is computed (the caller issues its next K/V copies there), and
 * on_p(pf) on P once packed, before O += P V reads it (dropout, where on).
 * (Issuing tile t's S before waiting for tile t-1's O += P V, with three
 * stages, was measured slower: docs/design.md, "wgmma-limits".) */
template <typename T, int kHeadDim, int kBlockN, int kQRows, bool kQInRegs, bool kMod, class Rows,
          class WhileS, class OnP>
__device__ __forceinline__ void
attend_tile_wgmma(float (&acc)[1][kHeadDim / 8][4], float (&m_s)[2], float (&l_s)[2],
                  const uint32_t (&qf)[1][kQInRegs ? kHeadDim / 16 : 1][4], uint32_t q_addr,
                  uint32_t k_addr, uint32_t v_addr, bool need_mask, const fad_score_mod &mod,
                  const Rows &rows, int t0, int len_q, int len_k, int window_left, int window_right,
                  bool acc_live, const WhileS &while_s, const OnP &on_p)
{
    float s[1][kBlockN / 8][4] = {};
    issue_qk_wgmma<T, kHeadDim, kBlockN, kQRows, kQInRegs>(s, qf, q_addr, k_addr);
    while_s();
    wgmma_wait<0>();
    wgmma_fence_operand(s[0]);
    softmax_tile<kMod>(s, acc, m_s, l_s, need_mask, mod, rows, t0, len_q, len_k, window_left,
                       window_right);
    uint32_t pf[kBlockN / 16][4];
    p_fragments<T, kBlockN>(s, pf);
    on_p(pf);
    issue_pv_wgmma_pf<T, kHeadDim, kBlockN>(acc, pf, v_addr, acc_live);
    wgmma_wait<0>();
    wgmma_fence_operand(acc[0]);
    wgmma_fence_operand(pf);
}

#endif /* FAD_FWD_TILE_WGMMA_CUH */
