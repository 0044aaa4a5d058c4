/*
 * fad_math.h — the math every path shares: which keys a row may see, the
 * split plan, the score transform, the online-softmax step, the merge of two
 * partial states and the final normalisation.
 *
 * Compiled by the C compiler (CPU path) and by nvcc (kernels), so each rule
 * lives exactly once. Products and sums that decide bits are written with
 * explicit fused/unfused operations so that no compiler may re-associate or
 * contract them differently in different kernels.
 *
 * Partial states are (m, l, o) in log2 units: m the running max of the scores
 * (already multiplied by log2(e)), l = sum exp2(s - m), o = sum exp2(s - m) v.
 * An empty state is (-inf, 0, 0); merging it into anything is the identity,
 * bit for bit, which is what lets a kernel skip tiles and splits freely.
 */
#ifndef FAD_MATH_H
#define FAD_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define FAD_HD __host__ __device__ __forceinline__
#else
#define FAD_HD static inline
#endif

#define FAD_LOG2E 1.4426950408889634f
#define FAD_LN2 0.6931471805599453f

/* Fixed-rounding arithmetic: identical on every path that shares the code. */
#if defined(__CUDA_ARCH__)
#define FAD_FMA(a, b, c) __fmaf_rn((a), (b), (c))
#define FAD_MUL(a, b) __fmul_rn((a), (b))
#define FAD_ADD(a, b) __fadd_rn((a), (b))
FAD_HD float fad_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
#else
#define FAD_FMA(a, b, c) fmaf((a), (b), (c))
#define FAD_MUL(a, b) ((a) * (b))
#define FAD_ADD(a, b) ((a) + (b))
#endif

/* Host exp2: Cephes' exp2f polynomial on [-0.5, 0.5] (relative error about
 * 2e-7), results below 2^-126 flushed to 0 as the GPU's ex2.approx.ftz does.
 * Only fused multiply-adds, products, sums and integer steps, with no
 * library call, so that the CPU's vector kernels (cpu/simd.h, vexp2) repeat it
 * lane by lane with the same bits and no libm decides a result. */
#define FAD_EXP2_ROUNDER 12582912.f /* 1.5 * 2^23: x + it holds round(x) in its low bits */
#define FAD_EXP2_C5 1.535336188319500e-4f
#define FAD_EXP2_C4 1.339887440266574e-3f
#define FAD_EXP2_C3 9.618437357674640e-3f
#define FAD_EXP2_C2 5.550332471162809e-2f
#define FAD_EXP2_C1 2.402264791363012e-1f
#define FAD_EXP2_C0 6.931472028550421e-1f
#if !defined(__CUDA_ARCH__)
FAD_HD float fad_exp2(float x)
{
    x = -127.f > x ? -127.f : x; /* (selects keep a NaN) */
    x = x > 128.f ? 128.f : x;
    const float t = FAD_ADD(x, FAD_EXP2_ROUNDER);
    const float f = x - (t - FAD_EXP2_ROUNDER); /* x - round(x), exact, in [-0.5, 0.5] */
    float p = FAD_FMA(f, FAD_EXP2_C5, FAD_EXP2_C4);
    p = FAD_FMA(p, f, FAD_EXP2_C3);
    p = FAD_FMA(p, f, FAD_EXP2_C2);
    p = FAD_FMA(p, f, FAD_EXP2_C1);
    p = FAD_FMA(p, f, FAD_EXP2_C0);
    p = FAD_FMA(p, f, 1.f); /* 2^f */
    uint32_t u; /* 2^round(x) from t's bits: 0 for -127, inf for 128 */
    memcpy(&u, &t, 4);
    u = (u - (0x4B400000u - 127u)) << 23;
    float s;
    memcpy(&s, &u, 4);
    return FAD_MUL(p, s);
}
#endif

/* ------------------------------------------------------------------------ */
/* Masking: the half-open key range [lo, hi) that query row i may attend.   */
/* ------------------------------------------------------------------------ */

typedef struct fad_key_range {
    int lo, hi; /* empty when lo >= hi */
} fad_key_range;

/* Row i of a sequence with len_q queries and len_k keys. Bottom-right aligned
 * (flash_attn): row i sits at key position i + len_k - len_q. window < 0 is
 * unbounded; causal is window_right == 0. */
FAD_HD fad_key_range fad_row_keys(int i, int len_q, int len_k, int window_left, int window_right)
{
    fad_key_range r;
    long long diag = (long long)i + len_k - len_q;
    long long lo = window_left < 0 ? 0 : diag - window_left;
    long long hi = window_right < 0 ? len_k : diag + window_right + 1;
    r.lo = lo < 0 ? 0 : (int)(lo > len_k ? len_k : lo);
    r.hi = hi < 0 ? 0 : (int)(hi > len_k ? len_k : hi);
    return r;
}

/* The same rule per (row, key) pair, for kernels that mask element by
 * element across many rows (the backward's dK/dV tiles, where each thread's
 * elements belong to 16 rows): key j lies in fad_row_keys(i) iff j < len_k
 * and lo_d <= j - diag(i) <= hi_d, diag(i) = i + len_k - len_q, the bounds
 * open (INT_MIN / INT_MAX) where a window side is unbounded. 32-bit: the
 * checks keep lengths far below 2^30. */
typedef struct fad_band {
    int diag0;      /* len_k - len_q: diag(i) - i */
    int lo_d, hi_d; /* allowed j - diag(i) */
    int len_k;
} fad_band;

FAD_HD fad_band fad_make_band(int len_q, int len_k, int window_left, int window_right)
{
    fad_band b;
    b.diag0 = len_k - len_q;
    b.lo_d = window_left < 0 ? (int)(-2147483647 - 1) : -window_left;
    b.hi_d = window_right < 0 ? 2147483647 : window_right;
    b.len_k = len_k;
    return b;
}

FAD_HD int fad_band_masked(fad_band b, int i, int j)
{
    const int d = j - i - b.diag0;
    return j >= b.len_k || d < b.lo_d || d > b.hi_d;
}

/* ------------------------------------------------------------------------ */
/* Division by a call's constant: a multiply-high and a shift.               */
/* ------------------------------------------------------------------------ */

#if defined(__CUDA_ARCH__)
#define FAD_MULHI(a, b) __umulhi((a), (b))
#else
#define FAD_MULHI(a, b) ((uint32_t)(((uint64_t)(a) * (uint64_t)(b)) >> 32))
#endif

/* n / d for 0 <= n < 2^31 and 1 <= d < 2^31, d fixed for a launch: the host
 * makes (mul, shift) once, a kernel divides with one multiply-high (a divide
 * is about 20 dependent instructions on the GPU, with a MUFU.RCP, and a
 * kernel's grid index takes three in a row before any address is known).
 * With l = ceil(log2 d), mul = ceil(2^(31 + l) / d) < 2^32 and
 * n / d = (n mul) >> (31 + l): mul d - 2^(31 + l) < d <= 2^l, so the error
 * n (mul - 2^(31 + l) / d) / 2^(31 + l) < 2^31 / 2^(31 + l) <= 1 / d never
 * reaches the next multiple of d (Granlund and Montgomery's round-up
 * method). d = 1 divides by itself (mul would need 33 bits).
 * tests/test_mask_forms.py checks it against '/' over d < 70,000 and edges. */
typedef struct fad_fastdiv {
    uint32_t d, mul, shift;
} fad_fastdiv;

FAD_HD fad_fastdiv fad_make_fastdiv(uint32_t d)
{
    fad_fastdiv f = {d, 0u, 0u};
    if (d > 1u) {
        uint32_t l = 0;
        while ((1ull << l) < d) /* l = ceil(log2 d) */
            l++;
        f.mul = (uint32_t)(((1ull << (31 + l)) + d - 1) / d);
        f.shift = l - 1;
    }
    return f;
}
FAD_HD int fad_fastdiv_div(int n, fad_fastdiv f)
{
    return f.d == 1u ? n : (int)(FAD_MULHI((uint32_t)n, f.mul) >> f.shift);
}

/* ------------------------------------------------------------------------ */
/* Split plan: split s of a sequence covers keys [s*S, min((s+1)*S, len_k)). */
/* ------------------------------------------------------------------------ */

FAD_HD int fad_num_splits(int len_k, int split_size)
{
    return (int)(((long long)len_k + split_size - 1) / split_size); /* (no overflow near 2^31) */
}

/* The split that key t belongs to, and the keys of split s (before the cut
 * at len_k): the one definition of where a split starts and ends, used by the
 * CPU path and by every kernel's walk. */
FAD_HD int fad_split_of(int t, int split_size) { return t / split_size; }
FAD_HD fad_key_range fad_split_keys(int s, int split_size)
{
    /* in 64 bits, clamped to int's range: near 2^31 keys a sequence's last split ends past
     * it (and is cut at len_k <= 2^31 - 1 anyway) */
    const long long lo = (long long)s * split_size, hi = lo + split_size;
    fad_key_range r = {(int)(lo < 0x7fffffff ? lo : 0x7fffffff), (int)(hi < 0x7fffffff ? hi : 0x7fffffff)};
    return r;
}

/* The block_n-key tiles from tile t0 to the end of t0's split, t0 included
 * (t0 a multiple of block_n, which divides split_size): a kernel counts them
 * down instead of dividing per tile. */
FAD_HD int fad_split_tiles_left(int t0, int split_size, int block_n)
{
    return (split_size - t0 % split_size) / block_n; /* t0 % split_size: t0's offset in its split */
}

/* First and one-past-last split that intersect keys [lo, hi). */
FAD_HD int fad_first_split(fad_key_range r, int split_size) { return fad_split_of(r.lo, split_size); }
FAD_HD int fad_end_split(fad_key_range r, int split_size)
{
    return r.hi > r.lo ? fad_split_of(r.hi - 1, split_size) + 1 : fad_split_of(r.lo, split_size);
}

/* ------------------------------------------------------------------------ */
/* Scores: raw dot product q.k -> logit in log2 units.                        */
/* ------------------------------------------------------------------------ */

/* A tile's scores are kept as raw dot products when no score mod applies:
 * the scale then enters the exponent as one FMA, exp2(qk * scale_log2 - max).
 * With softcap or ALiBi the scores are rewritten into log2 logits first and
 * exp_scale is 1. Either way: p = fad_exp_score(s, exp_scale, base), and a
 * row's max in log2 units is max(s) * exp_scale (exact: scaling by a positive
 * number is monotone under rounding). */
typedef struct fad_score_mod {
    float scale_log2;   /* softmax_scale * log2(e) */
    float exp_scale;    /* scale_log2 without a mod, 1 with one */
    float cap_in;       /* softmax_scale / softcap (softcap > 0) */
    float cap_out_log2; /* softcap * log2(e) (softcap > 0) */
    int has_softcap;
    int has_mod;        /* softcap or ALiBi: scores become log2 logits */
} fad_score_mod;

FAD_HD fad_score_mod fad_make_score_mod(float softmax_scale, float softcap, int has_alibi)
{
    fad_score_mod m;
    m.has_softcap = softcap > 0.f;
    m.has_mod = m.has_softcap || has_alibi;
    m.scale_log2 = softmax_scale * FAD_LOG2E;
    m.exp_scale = m.has_mod ? 1.f : m.scale_log2;
    m.cap_in = m.has_softcap ? softmax_scale / softcap : 0.f;
    m.cap_out_log2 = m.has_softcap ? softcap * FAD_LOG2E : 0.f;
    return m;
}

/* ALiBi in log2 units: -slope * |i + len_k - len_q - j| * log2(e). */
FAD_HD float fad_alibi_log2(float slope_log2, int i, int j, int len_q, int len_k)
{
    long long d = (long long)i + len_k - len_q - j;
    return -slope_log2 * (float)(d < 0 ? -d : d);
}

/* The log2 logit of a raw dot product (used only when has_mod). */
FAD_HD float fad_logit(const fad_score_mod *m, float qk)
{
    if (m->has_softcap)
        return FAD_MUL(m->cap_out_log2, tanhf(FAD_MUL(qk, m->cap_in)));
    return FAD_MUL(qk, m->scale_log2);
}

/* d(score)/d(q.k) in natural units, for the backward: the scale, times
 * 1 - tanh^2 under a softcap (ALiBi is additive and has no gradient). */
FAD_HD float fad_logit_grad(const fad_score_mod *m, float softmax_scale, float qk)
{
    if (m->has_softcap) {
        const float t = tanhf(FAD_MUL(qk, m->cap_in));
        return FAD_MUL(softmax_scale, FAD_FMA(-t, t, 1.f));
    }
    return softmax_scale;
}

/* exp2 of a score in log2 units relative to base (see fad_score_mod). */
FAD_HD float fad_exp_score(float s, float exp_scale, float base)
{
    return fad_exp2(FAD_FMA(s, exp_scale, -base));
}

/* The backward's dS of one (row, key): p (dP - D) d(score)/d(q.k), in this
 * order, on every path (CPU and each kernel). */
FAD_HD float fad_ds(float p, float dp, float dsum, float grad)
{
    return FAD_MUL(FAD_MUL(p, FAD_ADD(dp, -dsum)), grad);
}

/* ------------------------------------------------------------------------ */
/* Online softmax step for one row and one key tile.                          */
/* ------------------------------------------------------------------------ */

/* Given the old running max and the tile's max, returns the new max and the
 * factor the old (l, o) are multiplied by. The running max only moves when the
 * tile's max exceeds it by more than FAD_RESCALE_SLACK (log2 units), as in
 * FlashAttention-4; otherwise the old max stays the reference and the factor
 * is exactly 1, so the O(D) rescale of o is skipped. Any reference max gives
 * the same softmax: a tile's exponents are then at most 2^slack = 256, far
 * inside the range of fp32 and of the fp16/bf16 P fed to P V. The skip
 * matters most in deterministic mode: every split starts a fresh state, and
 * with the exact rule (slack 0) nearly every tile of an 8-tile split moves
 * the max of some row of a warp (docs/design.md, "rescale-slack").
 *
 * A row that has seen no key (m_old = -inf) has l = 0 and o = 0 (+-0), which
 * any finite factor maps to themselves bit for bit: it gets 1 too, so the
 * first tile of a split rescales nothing either.
 *
 * The rule depends on nothing but the row's own scores on the fixed tile walk,
 * so it keeps every invariance; it is shared by the CPU path and all kernels.
 * A fully masked tile (m_tile = -inf) leaves the state untouched. */
#ifndef FAD_RESCALE_SLACK
#define FAD_RESCALE_SLACK 8.f
#endif
FAD_HD float fad_rescale(float m_old, float m_tile, float *m_new)
{
    /* Selects, not branches: kernels issue the next tile's MMAs ahead of this
     * step, and a branch here would end the basic block they share with the
     * exponentials that follow (fwd_packed_kernel). */
    const int fresh = m_old == -INFINITY;
    const int moves = !fresh && m_tile > FAD_ADD(m_old, FAD_RESCALE_SLACK);
    const float factor = fad_exp2(m_old - m_tile); /* used only when m_tile > m_old, finite */
    /* (fmaxf: a NaN tile max leaves a fresh row at -inf) */
    *m_new = fresh ? fmaxf(m_old, m_tile) : moves ? m_tile : m_old;
    return moves ? factor : 1.f;
}

/* The max a tile's exponents are taken against: 0 when the row has seen no
 * key yet, so exp2(-inf - 0) = 0 instead of exp2(-inf - -inf) = NaN. */
FAD_HD float fad_exp_base(float m) { return m == -INFINITY ? 0.f : m; }

/* ------------------------------------------------------------------------ */
/* Merging two partial states: the only cross-split reduction there is.      */
/* ------------------------------------------------------------------------ */

/* The merged max is the left state's, as long as the right one's exceeds it
 * by at most FAD_RESCALE_SLACK: the same stale-max rule as fad_rescale, so
 * that folding split after split into a row's result R (left) keeps R's max
 * and scales only the new split (right). One of the two weights is exactly 1.
 * An empty left state (-inf) takes the right one's max and weighs 0.
 * A merged max may lie below the true max by up to twice the slack (each
 * state's own max may already be stale): values up to 2^16 times their
 * normalised size, in fp32 (P is rounded to fp16/bf16 only inside a split,
 * against that split's own max). */
typedef struct fad_merge_w {
    float m;      /* merged max */
    float wa, wb; /* weights of the left and right state; one of them is 1 */
} fad_merge_w;

FAD_HD fad_merge_w fad_merge_weights(float ma, float mb)
{
    /* Written as selects, not branches: the fold at each split's end runs it
     * for every row of the warp, and the branchy form cost a divergence
     * region per row there (docs/design.md, "merge-selects"). */
    const int moves = (ma == -INFINITY) | (mb > FAD_ADD(ma, FAD_RESCALE_SLACK));
    fad_merge_w w;
    w.m = moves ? fmaxf(ma, mb) : ma; /* moves: mb, or -inf when both are */
    const float lower = moves ? ma : mb; /* the state whose weight may be below 1 */
    /* 0 for an empty state against a non-empty one; 1, not NaN, for two empty ones */
    const float e = lower == w.m ? 1.f : fad_exp2(lower - w.m);
    w.wa = moves ? e : 1.f;
    w.wb = moves ? 1.f : e;
    return w;
}

/* a + b * wb: the merged value once a has been multiplied by wa (exact, and
 * skippable, in the common case wa = 1). */
FAD_HD float fad_merge_keep_a(float a, float b, float wb) { return FAD_FMA(b, wb, a); }

/* a * wa + b * wb as a * wa (rounded) plus b * wb in one FMA. */
FAD_HD float fad_merge_value(float a, float b, fad_merge_w w)
{
    return fad_merge_keep_a(FAD_MUL(a, w.wa), b, w.wb);
}

/* ------------------------------------------------------------------------ */
/* The two-level order of a row's splits (docs/design.md, "merge-groups").    */
/* ------------------------------------------------------------------------ */

/* Folding split after split into one running sum loses about one rounding of
 * the sum per split: at 2^30 keys in 512-key splits (2^21 splits) o and l
 * would be off by several bf16 steps. So a row's splits are folded in groups
 * of FAD_MERGE_GROUP, keyed on the split index (group g: splits
 * FAD_MERGE_GROUP g .. FAD_MERGE_GROUP (g + 1) - 1): each group left to right
 * from the empty state, as one chain always was, then the groups' results
 * left to right into the row's outer result X. A row within one group (every
 * row of at most FAD_MERGE_GROUP splits from split 0) keeps the one chain's
 * bits. The CPU path, the combine and fwd_kernel's kGroups variant fold in
 * this order, whichever splits they walk; the other one-CTA walks keep the
 * one chain, since no plan gives them a row of more than FAD_MERGE_GROUP
 * splits (fad_make_plan). */
#define FAD_MERGE_GROUP 1024

/* Whether the fold of split s, after which a walk goes on to split s + 1,
 * closes its group: the group's result then goes into X (fad_outer_*) and the
 * running result starts empty again. */
FAD_HD int fad_group_closes(int s) { return (s + 1) % FAD_MERGE_GROUP == 0; }

/* The last split of split s's group: the one split of a run of at most
 * FAD_MERGE_GROUP from s on whose fold may close a group (where it lies
 * before the walk's last split). */
FAD_HD int fad_group_last(int s) { return s - s % FAD_MERGE_GROUP + (FAD_MERGE_GROUP - 1); }

/* X <- X (+) G for a group's result G: fad_merge_* between two non-empty
 * states; a copy of G while X is empty, and X unchanged by an empty G (a row
 * a walk crosses a group with before its first key or after its last), so
 * that a row's result is its non-empty groups' chain alone, whichever splits
 * the walk covered (a merge with an empty state is no identity: it turns -0
 * into +0). */
typedef struct fad_outer_w {
    fad_merge_w w;
    int copy_g; /* X empty: X <- G */
    int keep_x; /* G empty: X unchanged */
} fad_outer_w;

FAD_HD fad_outer_w fad_outer_weights(float m_x, float m_g)
{
    fad_outer_w o;
    o.w = fad_merge_weights(m_x, m_g);
    o.copy_g = m_x == -INFINITY;
    o.keep_x = !o.copy_g && m_g == -INFINITY;
    return o;
}

/* One value (o or l) of X (+) G; the merged max is w.w.m. */
FAD_HD float fad_outer_value(float x, float g, fad_outer_w w)
{
    const float v = fad_merge_value(x, g, w.w);
    return w.copy_g ? g : w.keep_x ? x : v;
}

/* ------------------------------------------------------------------------ */
/* Dropout: a keep mask keyed only by positions, so batch-invariant.          */
/* ------------------------------------------------------------------------ */

/* Element (query row i, key j) of head h is kept with probability 1 - p. Its
 * random bits are Philox4x32-7 (Salmon et al., Random123; 7 rounds, as
 * flash_attn's dropout: Crush-resistant, and 30% less than the default 10) of
 *   key     = the call's key (fad_make_dropout: Philox4x32-10 of the
 *             generator's (seed, offset), so each call of a step draws anew)
 *   counter = (64-key group of j and j's pair in its 8, (uint32) the row's
 *             key-space position i + len_k - len_q, h, seq_id)
 * byte 2 ((j / 8) % 2) + j % 2 of output word (j / 16) % 4; kept iff that
 * byte < keep8 = round((1 - p) * 256) (so p acts in steps of 1/256, as in
 * flash_attn). Nothing else enters: not the batch index, the batch size, the
 * tile or the split, so a sequence is dropped the same way alone and in any
 * batch. seq_id is 0 unless the caller names its sequences (fad_fwd_params.
 * dropout_seq_ids; the identity then travels with the sequence). The counter
 * layout puts a thread's 16 elements of one m16n8k16 row (keys
 * 8 nb + 2 (lane % 4) + {0, 1}, nb = 0..7) in one Philox call: the kernels
 * draw each call once per 64-key tile. Kept elements are scaled by
 * rp = 1 / (1 - p) at the output's normalisation. */
#define FAD_PHILOX_M0 0xD2511F53u
#define FAD_PHILOX_M1 0xCD9E8D57u
#define FAD_PHILOX_W0 0x9E3779B9u
#define FAD_PHILOX_W1 0xBB67AE85u
#define FAD_DROPOUT_ROUNDS 7 /* fad_philox7: change both together */
typedef struct fad_u32x4 {
    uint32_t x[4];
} fad_u32x4;

/* One Philox4x32 round under key (k0, k1). */
FAD_HD fad_u32x4 fad_philox_round(fad_u32x4 c, uint32_t k0, uint32_t k1)
{
    const uint32_t hi0 = FAD_MULHI(FAD_PHILOX_M0, c.x[0]), lo0 = FAD_PHILOX_M0 * c.x[0];
    const uint32_t hi1 = FAD_MULHI(FAD_PHILOX_M1, c.x[2]), lo1 = FAD_PHILOX_M1 * c.x[2];
    fad_u32x4 n;
    n.x[0] = hi1 ^ c.x[1] ^ k0, n.x[1] = lo1, n.x[2] = hi0 ^ c.x[3] ^ k1, n.x[3] = lo0;
    return n;
}

/* Philox4x32 with `rounds` rounds (integer math: the same bits on every path).
 * Round r uses the key bumped r times by the Weyl constants. */
FAD_HD fad_u32x4 fad_philox_rounds(fad_u32x4 c, uint32_t k0, uint32_t k1, int rounds)
{
    for (int round = 0; round < rounds; round++) {
        c = fad_philox_round(c, k0, k1);
        k0 += FAD_PHILOX_W0, k1 += FAD_PHILOX_W1;
    }
    return c;
}

/* The mask's draw, Philox4x32-7, written out round by round: the same bits as
 * fad_philox_rounds(c, k0, k1, 7). Written as that loop, nvcc kept three of the
 * seven rounds as a rolled loop inside the kernels' tile loops (about 13
 * instructions a round: moves, a counter, a branch, a split multiply) where a
 * written-out round is 2 IMAD.WIDE + 2 LOP3 with the key in uniform
 * registers. */
FAD_HD fad_u32x4 fad_philox7(fad_u32x4 c, uint32_t k0, uint32_t k1)
{
#define FAD_PHILOX_ROUND_(r) \
    c = fad_philox_round(c, k0 + (uint32_t)(r) * FAD_PHILOX_W0, k1 + (uint32_t)(r) * FAD_PHILOX_W1)
    FAD_PHILOX_ROUND_(0);
    FAD_PHILOX_ROUND_(1);
    FAD_PHILOX_ROUND_(2);
    FAD_PHILOX_ROUND_(3);
    FAD_PHILOX_ROUND_(4);
    FAD_PHILOX_ROUND_(5);
    FAD_PHILOX_ROUND_(6);
#undef FAD_PHILOX_ROUND_
    return c;
}

/* Philox4x32-10 (Random123's known answers hold for it). */
FAD_HD fad_u32x4 fad_philox(fad_u32x4 c, uint32_t k0, uint32_t k1)
{
    return fad_philox_rounds(c, k0, k1, 10);
}

typedef struct fad_dropout {
    uint32_t k0, k1; /* the call's Philox key */
    uint32_t keep8;  /* keep iff 8 random bits < keep8; 256: dropout off */
    float rp;        /* 1 / (1 - p): the kept elements' scale; 1 when off */
    int on;
    uint32_t seq_id; /* the sequence's identity in the counter (fad_dropout_of) */
} fad_dropout;

/* 1 / (1 - p), or 1 without dropout: the kept elements' scale. */
FAD_HD float fad_dropout_rp(float p) { return p > 0.f ? 1.f / FAD_ADD(1.f, -p) : 1.f; }

FAD_HD fad_dropout fad_make_dropout(float p, uint64_t seed, uint64_t offset)
{
    fad_dropout d;
    fad_u32x4 c;
    c.x[0] = (uint32_t)offset, c.x[1] = (uint32_t)(offset >> 32);
    c.x[2] = 0x64726f70u /* "drop": this stream is not used for anything else */, c.x[3] = 0;
    const fad_u32x4 k = fad_philox(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    d.k0 = k.x[0], d.k1 = k.x[1];
    d.on = p > 0.f;
    const float keep = FAD_ADD(1.f, -p);
    d.keep8 = d.on ? (uint32_t)FAD_FMA(keep, 256.f, 0.5f) : 256u;
    d.rp = fad_dropout_rp(p);
    d.seq_id = 0;
    return d;
}

/* The Philox draw that holds element (row position i_pos, key j) of head h:
 * it holds keys 64 (j / 64) + 8 w + 2 ((j / 2) % 4) + {0, 1}, w = 0..7. */
FAD_HD fad_u32x4 fad_dropout_draw(const fad_dropout *d, int h, int i_pos, int j)
{
    fad_u32x4 c;
    c.x[0] = ((uint32_t)j >> 6 << 2) | (((uint32_t)j >> 1) & 3u);
    c.x[1] = (uint32_t)i_pos, c.x[2] = (uint32_t)h, c.x[3] = d->seq_id;
    return fad_philox7(c, d->k0, d->k1); /* FAD_DROPOUT_ROUNDS rounds */
}

/* Whether byte `byte` (0..3) of a draw's word is below keep8. */
FAD_HD int fad_dropout_kept_byte(const fad_dropout *d, uint32_t word, int byte)
{
    return ((word >> (8 * byte)) & 0xffu) < d->keep8;
}

/* Whether key j is kept, from the draw that holds it (the word chosen by
 * selects, not by indexing: a runtime index would put the draw in local memory
 * on the GPU). */
FAD_HD int fad_dropout_kept(const fad_dropout *d, fad_u32x4 r, int j)
{
    const uint32_t w = (uint32_t)j >> 4 & 3u;
    const uint32_t word = w == 0 ? r.x[0] : w == 1 ? r.x[1] : w == 2 ? r.x[2] : r.x[3];
    return fad_dropout_kept_byte(d, word, (int)(((uint32_t)j >> 3 & 1u) * 2 + ((uint32_t)j & 1u)));
}

/* One element, for paths that draw per element (the CPU's). */
FAD_HD int fad_dropout_keep(const fad_dropout *d, int h, int i_pos, int j)
{
    return fad_dropout_kept(d, fad_dropout_draw(d, h, i_pos, j), j);
}

/* ------------------------------------------------------------------------ */
/* Final normalisation of a merged state.                                    */
/* ------------------------------------------------------------------------ */

/* 1/l, or 0 for a row that saw no key (its output is 0, as flash_attn's). */
FAD_HD float fad_inv_sum(float l) { return l > 0.f ? 1.f / l : 0.f; }

/* What a merged row's o is multiplied by: 1/l, times dropout's rp (exactly
 * 1/l without dropout: rp = 1). */
FAD_HD float fad_out_scale(float l, float rp) { return FAD_MUL(fad_inv_sum(l), rp); }

/* Natural-log log-sum-exp; -inf for a row that saw no key. */
FAD_HD float fad_lse(float m, float l)
{
    return l > 0.f ? FAD_MUL(FAD_ADD(m, log2f(l)), FAD_LN2) : -INFINITY;
}

#endif /* FAD_MATH_H */
