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
 * t0 (a multiple of 32) in the m16n8k16 accumulator layout: f(r, nb, e, kept)
 * for row r (key-space position i_pos[r]), key t0 + 8 nb + 2 (lane % 4) + e.
 * One Philox draw per row and 32 keys holds this thread's 8 (fad_math.h). */
template <int kRows, int kNB, class F>
__device__ __forceinline__ void dropout_walk(const fad_dropout &d, int head, const int (&i_pos)[kRows],
                                             int t0, F f)
{
    static_assert(kNB % 4 == 0, "whole 32-key groups");
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int g = 0; g < kNB / 4; g++) {
            const int j0 = t0 + 32 * g + 2 * (lane % 4);
            const fad_u32x4 bits = fad_dropout_draw(&d, 0, head, i_pos[r], j0);
#pragma unroll
            for (int w = 0; w < 4; w++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    f(r, 4 * g + w, e, fad_dropout_kept(&d, bits, j0 + 8 * w + e));
        }
}

#endif /* FAD_DROPOUT_CUH */
