/*
 * dropout.cuh — dropout's keep rule (fad_math.h) laid over the m16n8k16
 * accumulator layout: which Philox draw holds which of a thread's elements.
 * Shared by the forward's tile (fwd_tile.cuh) and the dQ kernel; the dK/dV
 * kernel's transposed tiles draw through fad_dropout_draw directly.
 */
#ifndef FAD_DROPOUT_CUH
#define FAD_DROPOUT_CUH

#include "fad_math.h"

/* Dropout's keep rule over a thread's kRows rows x kNB n8 blocks of keys from
 * t0 (a multiple of 8 kNB, or of 64) in the m16n8k16 accumulator layout:
 * f(r, nb, e, kept) for row r (key-space position i_pos[r]), key
 * t0 + 8 nb + 2 (lane % 4) + e. One Philox draw per row and 64 keys holds this
 * thread's 16 (fad_math.h); a 32-key tile uses half of one. Words and bytes are
 * picked with compile-time indices (the word of a 32-key tile by a select on
 * t0), so the draw stays in registers. */
template <int kRows, int kNB, class F>
__device__ __forceinline__ void dropout_walk(const fad_dropout &d, int head, const int (&i_pos)[kRows],
                                             int t0, F f)
{
    constexpr int kPer = kNB < 8 ? kNB : 8; /* n8 blocks per draw */
    static_assert(kPer == 4 || (kPer == 8 && kNB % 8 == 0), "whole 32- or 64-key groups");
    const int lane = threadIdx.x % 32;
    /* a 32-key tile's half of its 64-key draw: words 2, 3 when t0 % 64 == 32 */
    const bool upper = kPer == 4 && (t0 & 32);
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int g = 0; g < kNB / kPer; g++) {
            const int j0 = t0 + 8 * kPer * g + 2 * (lane % 4);
            const fad_u32x4 bits = fad_dropout_draw(&d, head, i_pos[r], j0);
#pragma unroll
            for (int w = 0; w < kPer; w++) {
                const uint32_t word = upper ? bits.x[2 + (w >> 1)] : bits.x[w >> 1];
#pragma unroll
                for (int e = 0; e < 2; e++)
                    f(r, kPer * g + w, e, fad_dropout_kept_byte(&d, word, 2 * (w & 1) + e));
            }
        }
}

#endif /* FAD_DROPOUT_CUH */
