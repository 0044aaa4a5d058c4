/*
 * dropout.cuh — dropout's keep rule (fad_math.h) laid over the m16n8k16
 * accumulator layout: which Philox draw holds which of a thread's elements.
 * Shared by the forward's tile (fwd_tile.cuh) and the dQ kernels; the dK/dV
 * kernels' transposed tiles draw once per warpgroup, through shared memory
 * (dropout_draw_group; then dropout_kept_staged or dropout_staged_masks). The
 * wgmma forward kernels drop on P already packed to A fragments (dropout_pf):
 * four keep tests per word at once (dropout_bytes), and one AND NOT per pair
 * of elements.
 */
#ifndef FAD_DROPOUT_CUH
#define FAD_DROPOUT_CUH

#include <type_traits>

#include "fad_math.h"

/* Dropout's keep rule over a thread's kRows rows x kNB n8 blocks of keys from
 * t0 (a multiple of 8 kNB, or of 64) in the m16n8k16 accumulator layout.
 * One Philox draw per row and 64 keys holds this thread's 16 (fad_math.h); a
 * 32-key tile uses half of one. The draws do not depend on S, so the wgmma
 * kernels issue them (dropout_draw_tile) before they wait for S, and use them
 * (dropout_walk_drawn, dropout_pf) once S has landed. */
template <int kNB>
struct dropout_tile_draws {
    static constexpr int kPer = kNB < 8 ? kNB : 8; /* n8 blocks per draw */
    static constexpr int kDraws = kNB / kPer;      /* per row */
    static_assert(kPer == 4 || (kPer == 8 && kNB % 8 == 0), "whole 32- or 64-key groups");
};

/* bits[r][g]: row r's draw of keys t0 + 64 g .. (the 64-key group holding them). */
template <int kRows, int kNB>
__device__ __forceinline__ void dropout_draw_tile(fad_u32x4 (&bits)[kRows][dropout_tile_draws<kNB>::kDraws],
                                                  const fad_dropout &d, int head, const int (&i_pos)[kRows],
                                                  int t0)
{
    constexpr int kPer = dropout_tile_draws<kNB>::kPer;
    const int lane = threadIdx.x % 32;
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int g = 0; g < kNB / kPer; g++)
            bits[r][g] = fad_dropout_draw(&d, head, i_pos[r], t0 + 8 * kPer * g + 2 * (lane % 4));
}

/* f(r, nb, e, kept) for row r, key t0 + 8 nb + 2 (lane % 4) + e, from the
 * tile's draws. Words and bytes are picked with compile-time indices (the word
 * of a 32-key tile by a select on t0), so the draws stay in registers. */
template <int kRows, int kNB, class F>
__device__ __forceinline__ void dropout_walk_drawn(const fad_dropout &d,
                                                   const fad_u32x4 (&bits)[kRows][dropout_tile_draws<kNB>::kDraws],
                                                   int t0, F f)
{
    constexpr int kPer = dropout_tile_draws<kNB>::kPer;
    /* a 32-key tile's half of its 64-key draw: words 2, 3 when t0 % 64 == 32 */
    const bool upper = kPer == 4 && (t0 & 32);
#pragma unroll
    for (int r = 0; r < kRows; r++)
#pragma unroll
        for (int g = 0; g < kNB / kPer; g++)
#pragma unroll
            for (int w = 0; w < kPer; w++) {
                const uint32_t word = upper ? bits[r][g].x[2 + (w >> 1)] : bits[r][g].x[w >> 1];
#pragma unroll
                for (int e = 0; e < 2; e++)
                    f(r, kPer * g + w, e, fad_dropout_kept_byte(&d, word, 2 * (w & 1) + e));
            }
}

/* Both at once, for the mma.sync kernels (their S is ready when they drop). */
template <int kRows, int kNB, class F>
__device__ __forceinline__ void dropout_walk(const fad_dropout &d, int head, const int (&i_pos)[kRows],
                                             int t0, F f)
{
    fad_u32x4 bits[kRows][dropout_tile_draws<kNB>::kDraws];
    dropout_draw_tile<kRows, kNB>(bits, d, head, i_pos, t0);
    dropout_walk_drawn<kRows, kNB>(d, bits, t0, f);
}

/* The keep test on packed bytes, four at once: kept iff byte x < t = keep8
 * (0..256). The result's sign bit of each byte says *dropped* (an AND NOT
 * applies the complement for free). Three integer instructions and no select,
 * where __vcmpltu4 took four and t = 256 (no byte holds it) a fifth. Split
 * x = 128 xh + xl and t into th = [t >= 128] and tl = t - 128 th (t = 256:
 * th = 1, tl = 128). The bytes of s = xl + (128 - tl) cannot carry into each
 * other (at most 127 + 128), and s's sign bit says xl >= tl. So x < t is
 *   th = 1: not (xh and xl >= tl)      th = 0: not (xh or xl >= tl),
 * and dropped is one LOP3 of (x, s, th's mask) on the sign bits. */
struct dropout_bytes {
    uint32_t add4, th4;
    __device__ __forceinline__ explicit dropout_bytes(const fad_dropout &d)
        : add4((d.keep8 >= 128u ? 256u - d.keep8 : 128u - d.keep8) * 0x01010101u),
          th4(d.keep8 >= 128u ? ~0u : 0u)
    {
    }
    __device__ __forceinline__ uint32_t dropped_sign(uint32_t x) const
    {
        const uint32_t s = (x & 0x7f7f7f7fu) + add4;
        return (x & s & th4) | ((x | s) & ~th4);
    }
};

/* prmt, its selector in a register (ptxas folds a constant one into the
 * instruction); a nibble's msb replicates that byte's sign. */
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel)
{
    uint32_t r;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
    return r;
}

/* The sign bits of bytes lo, hi of m spread over the low and high halves of a
 * word (prmt's sign-replicating selectors, 8 + byte: 0xffff per dropped half). */
template <int kLo, int kHi>
__device__ __forceinline__ uint32_t dropout_halves(uint32_t m)
{
    return prmt(m, 0u, (uint32_t)(8 + kLo) * 0x11u | (uint32_t)(8 + kHi) * 0x1100u);
}

/* Dropout's keep rule over the dK/dV kernels' transposed tiles (S^T: a
 * thread's keys j and j + 8 as rows, query rows m0 + 8 nb + 2 (lane % 4) +
 * {0, 1} as columns, nb < kMB), as a bit mask: bit nb * 4 + e is element
 * (nb, e) of the m16n8k16 accumulator layout (key j + 8 (e / 2), query row
 * m0 + 8 nb + 2 (lane % 4) + e % 2). Keys j and j + 8 share a row's Philox
 * draw (same 64-key group and pair) and its word ((j / 16) % 4): bytes j % 2
 * and 2 + j % 2 (fad_math.h).
 * The draw of (row i, key pair pr) holds the group's 16 keys 8 w + 2 pr +
 * {0, 1}, of which one warp's 16 keys are 4: drawn by the warps that need
 * them, each draw would be made 4 times (twice, with lanes L and L ^ 4
 * sharing one through a shuffle, as these kernels once did).
 * Both dK/dV kernels give one warpgroup (128 threads) exactly one 64-key
 * group, so its threads make each of a step's kRows x 4 draws once
 * (dropout_draw_group), the warpgroup syncs, and each thread reads one word
 * per row (dropout_kept_staged).
 * Layout: word w of draw (row, pr) at [(4 w + pr) kPad + row]; kPad = kRows
 * + 8 puts the 4 pairs 8 banks apart, so neither the writes (8 rows x 4
 * pairs per warp) nor the reads (a warp's w is fixed; 4 pairs x 4 rows, the
 * lanes of keys 2 pr and 2 pr + 1 reading one word) meet in a bank. */
template <int kMB> /* (64 bits for the wgmma kernel's 128-row steps at D64) */
using dropout_kept_t = typename std::conditional<(kMB > 8), uint64_t, uint32_t>::type;
template <int kRows> struct dropout_group_smem {
    static constexpr int kPad = kRows + 8;
    static constexpr int kWords = 16 * kPad;
    static constexpr size_t kBytes = (size_t)kWords * 4;
    static_assert(kRows % 32 == 0, "whole sets of 128 draws");
};

/* Writes the step's draws: rows m0 .. m0 + kRows - 1 (key-space positions
 * + i_off), the group of keys from g0 (a multiple of 64); t = thread in the
 * warpgroup. Each word is stored as its keep test's result (dropout_bytes:
 * the sign bit of each byte says dropped), made once here rather than by
 * each of the two threads that read it. The caller syncs the warpgroup before
 * the reads, and no thread may still read the previous step's draws (the
 * kernel's per-step barrier). */
template <int kRows>
__device__ __forceinline__ void dropout_draw_group(uint32_t *s, const fad_dropout &d, const dropout_bytes &keep,
                                                   int head, int g0, int m0, int i_off, int t)
{
    constexpr int kPad = dropout_group_smem<kRows>::kPad;
#pragma unroll 1 /* (one draw's registers at a time: the caller holds S^T and dP^T in flight) */
    for (int k = 0; k < kRows * 4 / 128; k++) {
        const int c = t + 128 * k, row = c >> 2, pr = c & 3;
        const fad_u32x4 bits = fad_dropout_draw(&d, head, m0 + row + i_off, g0 + 2 * pr);
#pragma unroll
        for (int w = 0; w < 4; w++)
            s[(4 * w + pr) * kPad + row] = keep.dropped_sign(bits.x[w]);
    }
}

/* The words key jj (0..63) of the group reads: those of its pair (jj / 2) % 4
 * and word jj / 16, at this thread's first row 2 (lane % 4); row 8 nb + e2 of
 * the step is col[8 nb + e2]. */
template <int kRows>
__device__ __forceinline__ const uint32_t *dropout_staged_col(const uint32_t *s, int jj)
{
    const int lane = threadIdx.x % 32;
    const uint32_t w = (uint32_t)jj >> 4 & 3u, pr = (uint32_t)jj >> 1 & 3u;
    return s + (4 * w + pr) * dropout_group_smem<kRows>::kPad + 2 * (lane % 4);
}

/* The transposed mask of the group's key jj (0..63), from dropout_draw_group's
 * words: rows 8 nb + 2 (lane % 4) + e2 of the step, keys jj and jj + 8 (bytes
 * jj % 2 and 2 + jj % 2 of word jj / 16 of pair (jj / 2) % 4), as bit
 * nb * 4 + 2 e1 + e2 of a mask: element (nb, e = 2 e1 + e2), set where kept
 * (the mma.sync kernel's form). */
template <int kMB, int kRows>
__device__ __forceinline__ dropout_kept_t<kMB> dropout_kept_staged(const uint32_t *s, int jj)
{
    static_assert(kMB * 8 == kRows, "one step's rows");
    const uint32_t shift = 8u * ((uint32_t)jj & 1u) + 7u; /* byte jj % 2's sign bit */
    const uint32_t *col = dropout_staged_col<kRows>(s, jj);
    dropout_kept_t<kMB> kept = 0;
#pragma unroll
    for (int nb = 0; nb < kMB; nb++)
#pragma unroll
        for (int e2 = 0; e2 < 2; e2++) {
            const uint32_t dropped = col[8 * nb + e2] >> shift;
#pragma unroll
            for (int e1 = 0; e1 < 2; e1++)
                kept |= (dropout_kept_t<kMB>)(~dropped >> (16 * e1) & 1u) << (nb * 4 + 2 * e1 + e2);
        }
    return kept;
}

/* The same mask as masks for AND NOT, the wgmma dK/dV kernel's form: no bit
 * tests or selects, two instructions per element. element(): all ones where
 * the fp32 element (nb, e) is dropped; pair(): 0xffff per dropped half of
 * the packed pair (nb, e = 2 h, 2 h + 1) of P^T's A fragment (p_fragment: the
 * low half row e2 = 0, the high half e2 = 1). prmt's sign-replicating
 * selectors pick byte 2 h + jj % 2 (a run-time selector: jj is the thread's). */
template <int kRows>
struct dropout_staged_masks {
    const uint32_t *col;
    uint32_t sel_e[2], sel_pair[2];
    __device__ __forceinline__ dropout_staged_masks(const uint32_t *s, int jj)
    {
        const uint32_t b = (uint32_t)jj & 1u;
        col = dropout_staged_col<kRows>(s, jj);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            sel_e[h] = (8u + 2u * h + b) * 0x1111u;
            sel_pair[h] = (8u + 2u * h + b) * 0x11u | (12u + 2u * h + b) * 0x1100u;
        }
    }
    __device__ __forceinline__ uint32_t element(int nb, int e) const
    {
        return prmt(col[8 * nb + (e & 1)], 0u, sel_e[e >> 1]);
    }
    __device__ __forceinline__ uint32_t pair(int nb, int h) const
    {
        return prmt(col[8 * nb], col[8 * nb + 1], sel_pair[h]);
    }
};

/* Dropout on P packed to m16n8k16 A fragments (p_fragment's layout) of one
 * 64-key tile from t0, for a thread's 2 rows at key-space positions i_pos:
 * pf[kk][2 (nb % 2) + r] holds (row r, keys t0 + 8 nb + 2 (lane % 4) + {0, 1})
 * with nb = 2 kk + nb % 2, the first key in its low half. Each dropped half is
 * zeroed by an AND: +0, the bits the float path (dropout_walk, x = 0.f, then
 * packed) gives, and kept halves are untouched, so both paths give P the same
 * bits. bits: the tile's draws (dropout_draw_tile<2, 8>): one per row; word
 * nb / 2, bytes 2 (nb % 2) + {0, 1}. */
__device__ __forceinline__ void dropout_pf(uint32_t (&pf)[4][4], const dropout_bytes &keep,
                                           const fad_u32x4 (&bits)[2][1])
{
#pragma unroll
    for (int r = 0; r < 2; r++)
#pragma unroll
        for (int w = 0; w < 4; w++) { /* word w: n8 blocks 2w (bytes 0, 1) and 2w + 1 (bytes 2, 3) */
            const uint32_t m = keep.dropped_sign(bits[r][0].x[w]);
            pf[w][r] &= ~dropout_halves<0, 1>(m);     /* byte 0 -> low half, byte 1 -> high */
            pf[w][2 + r] &= ~dropout_halves<2, 3>(m); /* bytes 2, 3 */
        }
}

#endif /* FAD_DROPOUT_CUH */
