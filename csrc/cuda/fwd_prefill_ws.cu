/*
 * fwd_prefill_ws.cu — the warp-specialized prefill kernel for sm_90a (D 64,
 * 128 and 256): one producer warpgroup copies K/V tiles, n consumer
 * warpgroups (FAD_WS_D128_CONSUMERS at D128 -- one, two CTAs an SM, in the
 * narrow variant for short keys --, FAD_WS_D64_CONSUMERS at D64 -- four, in
 * the lean variant for mid-length keys --, FAD_WS_D256_CONSUMERS at D256 --
 * part of R in shared memory in the long variant for long keys --: see
 * fwd_ws_cfg) compute. It runs fwd_tile.cuh's tile math, as fwd_kernel does
 * (fwd_prefill_kernel.cuh).
 *
 * Shapes: as fwd_kernel (fwd_prefill_kernel.cuh's header). One CTA = one (sequence,
 * kv head, n 64-row query blocks of its query heads (block_of, in the kernel)
 * [, split]); 128 (n + 1) threads:
 *   warpgroup 0, the producer: Q of all n blocks (cp.async), then every
 *     K/V tile the blocks walk, into a ring of kStages stages: a whole tile
 *     by the bulk tensor copy engine (TMA, tma.cuh; thread 0's arrival on
 *     the stage's `full` mbarrier expects its bytes), a tile that the
 *     sequence's end cuts -- and every tile where no tensor map can be made
 *     -- by cp.async (one commit group per tile, per K or V half at D256;
 *     once it has landed the producer fences it for the async proxy and
 *     arrives);
 *   warpgroups 1 .. n, the consumers: one 64-row block each, each exactly
 *     fwd_kernel's wgmma variant on its 64 rows -- its own tile walk
 *     (tile_walk), its own split folds, the same softmax_max / softmax_exp /
 *     fold_split on the same fragments -- so every row gets fwd_kernel's bits.
 *     A consumer releases a stage (its `empty` mbarrier) once its products
 *     on it are done; tiles outside its own walk it only waits for and releases.
 *
 * Why it is faster than fwd_kernel's wgmma variant (docs/design.md,
 * "warp-specialized-prefill"):
 *   - the K/V tile of one stage feeds 64 n query rows, not 64: 1/n of the
 *     L2 traffic per flop;
 *   - no copy instructions and no CTA barrier in the consumers' loop, and the
 *     producer's registers go to the consumers (setmaxnreg);
 *   - S = Q K^T of tile t+1 is issued before O += P V of tile t (acc's
 *     rescale for tile t runs under the first), and tile t+1's softmax
 *     (row max and exponentials) runs while O += P V does. The operations
 *     on acc are the same, in the same order, so the bits are.
 * kDrop: dropout (fwd_kernel's kDrop, the same keep rule and the same bits),
 * applied to P once packed (dropout_pf), before the next tile's S = Q K^T is
 * issued, while s's registers are free. (Applied after that issue instead, so
 * that the draws run under it, ptxas spilled 200 B against 86 B, and the
 * forward at p = 0.1 measured 1.48-1.62x the time of p = 0 against
 * 1.24-1.32x. Made by the producer
 * warpgroup into shared memory beside the stage's K/V, with a second arrival
 * on its full barrier, they measured 1.28-1.32x against 1.23-1.24x, and
 * 1.30-1.54x against 1.17-1.37x with the TMA producer otherwise idle
 * (docs/design.md, "dropout-kernels"). Drawn for the next tile
 * while the consumer waits for its S, they kept 8 registers live across
 * the softmax: 112 B of spill against 28 B, and the D128 forward at p = 0.1
 * took 1.14-1.20x longer. With Q in shared memory and no spill, after the
 * next S's issue or a tile ahead they took 1.07-1.16x the time of the
 * draws here.)
 */
#include <type_traits>

#include "fwd_block.cuh"
#include "fwd_tile_wgmma.cuh"
#include "tma.cuh"

/* The kernel's argument: fwd_args, and where tma is set, the tensor maps of K
 * and V (tma.cuh) through which the producer copies whole tiles; where tma_q
 * is, Q's (a consumer's whole 64-row tile); where tma_o is, the output's,
 * through which the consumers store it (16-row boxes). */
struct fwd_ws_args {
    fwd_args a;
    /* the grid index's divisors (fad_math.h): CTAs a (sequence, kv head), kv heads, q heads a kv head
     * (D256: CTAs a (sequence, query head), query heads, q heads a kv head) */
    fad_fastdiv div_ctas, div_heads, div_group;
    fad_tensor_map k_map, v_map, o_map, q_map;
    int tma, tma_o, tma_q;
};

/* The kernel's shapes: ws_main (FAD_WS_D128_CONSUMERS at D128, FAD_WS_D64_CONSUMERS
 * at D64, FAD_WS_D256_CONSUMERS at D256), ws_narrow (D128, short keys), ws_lean (D64,
 * mid-length keys) and ws_long (D256, long keys), as the plan chose (fad_plan.kernel); every shape runs the same
 * consumer code on its 64-row blocks, so each row gets the same bits. */
enum ws_shape { ws_main, ws_narrow, ws_lean, ws_long };

template <int kHeadDim, ws_shape kShape = ws_main> struct fwd_ws_cfg {
    /* D256 (kWide): a consumer's o (64 rows x 256 columns) takes 128
     * registers a thread, so R's o is not in registers and Q is read by SS
     * wgmmas from shared memory; two stages, whose K and V halves are filled
     * and released apart (kKVApart, below). With one consumer R's o lives in
     * shared memory (64 KB); with two (FAD_WS_D256_CONSUMERS, the default:
     * one consumer left the tensor cores idle through every softmax, 47% busy)
     * in global memory (kRGlobal), and setmaxnreg gives each 240. */
    static constexpr bool kWide = kHeadDim > 128;
    static constexpr int kBlockM = 64;                 /* rows per consumer warpgroup */
    static constexpr int kBlockN = 64;                 /* keys per tile: fwd_kernel's walk */
    /* kNarrow (D128): one consumer, and two CTAs an SM (kMinBlocks), so
     * that one CTA's prologue (Q, the ring's first tiles, the first S) and
     * epilogue (the last P V, the fold, the stores) run under the other's
     * tiles; for short key ranges, where a CTA walks few tiles and that pays
     * for each K/V tile feeding 64 rows, not 128 (FAD_WS_NARROW_MAX_SK). */
    static constexpr bool kNarrow = kShape == ws_narrow;
    static_assert(!kNarrow || kHeadDim == 128, "the narrow variant is budgeted for D128");
    /* kLean (D64, FAD_WS_D64_LEAN_MAX_SK): four consumers, each with 112
     * registers (setmaxnreg 24 / 112 in 640 threads), so R's o lives in
     * shared memory and S = Q K^T reads Q there (16 KB each a consumer), as at
     * D256. More consumer warps pay at mid-length walks; at long ones the
     * SS reads of Q and R's shared-memory fold cost more than they bring. */
    static constexpr bool kLean = kShape == ws_lean;
    static_assert(!kLean || kHeadDim == 64, "the lean variant is budgeted for D64");
    /* kThree (D128's main shape, FAD_WS_D128_CONSUMERS 3): three consumers
     * of 160 registers, so that a third consumer warp on each SM
     * sub-partition issues while the other two wait on their softmax chains.
     * Q is then read by SS wgmmas from shared memory and R's o (32 KB a
     * consumer) lives there too, which leaves room for two K/V stages, their
     * K and V halves released apart (kKVApart). */
    static constexpr bool kThree = kHeadDim == 128 && kShape == ws_main && FAD_WS_D128_CONSUMERS == 3;
    static constexpr int kConsumers = kNarrow ? 1 : kLean ? 4 : kHeadDim == 64 ? FAD_WS_D64_CONSUMERS
                                      : kWide ? FAD_WS_D256_CONSUMERS : kThree ? 3 : 2; /* consumer warpgroups */
    static constexpr int kMinBlocks = kNarrow ? 2 : 1; /* CTAs an SM (__launch_bounds__) */
    /* kByKv: a CTA's row blocks by (sequence, kv head), from the last (the kernel's block_of); D256
     * keeps rows of one (sequence, query head) */
    static constexpr bool kByKv = !kWide;
    static constexpr int kRows = kConsumers * kBlockM; /* query rows per CTA */
    static constexpr int kThreads = 128 * (1 + kConsumers);
    static constexpr int kStages = kWide || kThree ? 2 : kNarrow ? FAD_WS_NARROW_STAGES : FAD_WS_STAGES; /* K/V ring depth */
    static constexpr bool kQInRegs = FAD_WS_Q_REGS && !kWide && !kLean && !kThree; /* Q's A fragments held by the consumers */
    static constexpr bool kRSmem = kWide || kLean || kThree; /* R's o not in registers: in shared memory or (kRGlobal) global */
    /* kQRegK: where Q is read by SS products (not kQInRegs), the k-chunks of Q
     * whose A fragments a consumer thread holds in registers all the same (4
     * registers each), from the first; the rest are read from shared memory
     * (FAD_WS_D128_Q_REG_K, FAD_WS_LEAN_Q_REG_K, FAD_WS_D256_Q_REG_K). */
    static constexpr int kQRegK = kQInRegs ? 0 : kThree ? FAD_WS_D128_Q_REG_K : kLean ? FAD_WS_LEAN_Q_REG_K
                                  : kWide ? FAD_WS_D256_Q_REG_K : 0;
    /* kRGlobal (D256, two consumers): no room for R's 64 KB a consumer beside
     * Q and two stages, so R's o lives in global memory (L2, written and read
     * back once a split): each consumer warp takes a slot of the plan's pool
     * at its first fold and gives it back after its last (below). kLong
     * (FAD_WS_D256_LONG_MIN_SK): the shared memory left over holds a quarter
     * of it (kRSmemNB n8 blocks a warp), so the fold, which both consumers
     * run at a split's end while the tensor cores idle, waits on L2 for the
     * rest only; its slot's last quarter goes unused. */
    static constexpr bool kLong = kShape == ws_long;
    static_assert(!kLong || kHeadDim == 256, "the long variant is D256's");
    static constexpr bool kRGlobal = kWide && kConsumers > 1;
    static constexpr int kRSmemNB = kRGlobal && kLong ? FAD_WS_RG_SMEM_NB : 0; /* R's n8 blocks in shared memory */
    static constexpr int kRBatch = kLong ? FAD_WS_RG_LONG_BATCH : FAD_WS_RG_BATCH; /* (kRGlobal) fold_split's */
    static_assert(!kRGlobal || kBlockM * kHeadDim / 4 == FAD_WS_R_SLOT_FLOATS,
                  "a warp's R fits one slot of the plan's pool (fad_make_plan)");
    /* kKVApart: a stage's K and V halves have barriers of their own. A
     * consumer releases K once S = Q K^T has retired, V once O += P V has:
     * with two stages K of tile i + 2 then loads during tile i + 1's softmax,
     * where one barrier per stage would hold it until tile i's O += P V.
     * Each half is a commit group, announced as the whole tiles are (below):
     * the writer fences, then arrives. (Arrivals as the copies land, with
     * the consumers fencing after each wait, measured 1.01-1.10x slower at
     * D256: their fence.proxy.async is a MEMBAR.ALL.CTA.) */
    static constexpr bool kKVApart = kWide || kThree;
    /* (kWide with one consumer: 256 threads may each hold 255 registers; no setmaxnreg) */
    static constexpr bool kSetMaxNReg = !kWide || kConsumers > 1;
    static constexpr int kProducerRegs = kThree ? FAD_WS_D128_PRODUCER_REGS
                                         : kNarrow ? FAD_WS_NARROW_PRODUCER_REGS
                                         : kLean ? FAD_WS_LEAN_PRODUCER_REGS
                                         : kWide ? FAD_WS_D256_PRODUCER_REGS
                                         : kHeadDim == 64 ? FAD_WS_D64_PRODUCER_REGS : FAD_WS_PRODUCER_REGS;
    static constexpr int kConsumerRegs = kThree ? FAD_WS_D128_CONSUMER_REGS
                                         : kNarrow ? FAD_WS_NARROW_CONSUMER_REGS
                                         : kLean ? FAD_WS_LEAN_CONSUMER_REGS
                                         : kWide ? FAD_WS_D256_CONSUMER_REGS
                                         : kHeadDim == 64 ? FAD_WS_D64_CONSUMER_REGS : FAD_WS_CONSUMER_REGS;
    static constexpr size_t kTileBytes = (size_t)kBlockN * kHeadDim * 2; /* one K or V tile */
    static constexpr size_t kQBytes = (size_t)kBlockM * kHeadDim * 2;    /* one consumer's Q */
    /* one consumer's R (kRGlobal: its shared part) */
    static constexpr size_t kRBytes = kRGlobal ? (size_t)kBlockM * kRSmemNB * 8 * 4
                                      : kRSmem ? (size_t)kBlockM * kHeadDim * 4 : 0;
    static constexpr size_t kROffset = kConsumers * kQBytes + kStages * 2 * kTileBytes;
    static constexpr size_t kBarOffset = kROffset + kConsumers * kRBytes;
    /* full[kStages], empty[kStages], q_full [, full_v[kStages], empty_v[kStages]] */
    static constexpr int kBars = 2 * kStages + 1 + (kKVApart ? 2 * kStages : 0);
    /* the consumers' walks (16 B each), after the barriers */
    static constexpr size_t kWalkOffset = (kBarOffset + kBars * sizeof(uint64_t) + 15) / 16 * 16;
    /* (then an int: kPaged's flag, a page outside the cache met by the producer) */
    static constexpr size_t kBadOffset = kWalkOffset + kConsumers * 16;
    static constexpr size_t kSmemBytes = kBadOffset + 16;
    static_assert((kHeadDim == 128 && (kConsumers == 2 || kThree)) || (kNarrow && kConsumers == 1) ||
                      (kHeadDim == 64 && kConsumers >= 2) || (kHeadDim == 256 && kConsumers <= 2),
                  "the consumers' registers are budgeted for D 128 (two or three), D 64 or D 256 (one or two)");
    /* setmaxnreg moves registers inside the CTA's allocation, which
     * __launch_bounds__(kThreads, kMinBlocks) sets to (65536 / kThreads /
     * kMinBlocks) per thread, rounded down to a multiple of 8 (168 for two
     * consumers, 128 narrow): a consumer's alloc would wait forever for
     * registers the producer never freed. */
    static constexpr int kLaunchRegs = 65536 / kThreads / kMinBlocks / 8 * 8;
    static_assert(!kSetMaxNReg ||
                      (kProducerRegs + kConsumerRegs * kConsumers) * 128 <= kLaunchRegs * kThreads,
                  "setmaxnreg: the registers the producer frees must cover the consumers'");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory");
    /* (each CTA also takes 1 KB the system reserves, of an SM's 228) */
    static_assert(kSmemBytes + 1024 <= 228 * 1024 / kMinBlocks, "shared memory for kMinBlocks CTAs an SM");
};

/* kPagedBox: 0, K/V in contiguous rows; else a paged cache, whose whole tiles the
 * producer copies as boxes of kPagedBox rows (16, or kBlockN where pages are
 * whole tiles: launch_prefill_ws). */
template <typename T, int kHeadDim, ws_shape kShape, bool kDrop, int kPagedBox>
__global__ void __launch_bounds__(fwd_ws_cfg<kHeadDim, kShape>::kThreads, fwd_ws_cfg<kHeadDim, kShape>::kMinBlocks)
fwd_ws_kernel(const __grid_constant__ fwd_ws_args wa)
{
    constexpr bool kPaged = kPagedBox != 0;
    const fwd_args &a = wa.a;
    pdl_launch_dependents(); /* the combine, if any, may start launching (it waits for us) */
    using C = fwd_ws_cfg<kHeadDim, kShape>;
    constexpr int kBlockM = C::kBlockM, kBlockN = C::kBlockN, kStages = C::kStages;
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size;

    /* The grid index, by the host's magic divisors: three divides in a row
     * were most of the ~330 dependent instructions every warp runs before
     * any walk or address is known (1.4-4.5% at D128 and GQA 1k-2k keys;
     * docs/performance.md, "What won"). */
    const int ctas = (int)wa.div_ctas.d; /* CTAs per (sequence, kv head) [D256: query head] */
    const int bk = fad_fastdiv_div((int)blockIdx.x, wa.div_ctas), cta = (int)blockIdx.x - bk * ctas;
    const int b = fad_fastdiv_div(bk, wa.div_heads);
    const int h_cta = bk - b * (C::kByKv ? p.num_heads_k : p.num_heads); /* (D256: the query head) */
    const int hk = C::kByKv ? h_cta : fad_fastdiv_div(h_cta, wa.div_group);
    const int G = (int)wa.div_group.d; /* query heads a kv head */
    const fad_seq seq = fad_get_seq(&p, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, wg = uniform_warpgroup();
    /* The CTA's row blocks. A (sequence, kv head) has n = G nb blocks of 64
     * rows (nb a query head), block j being rows [64 (j / G), + 64) of query
     * head hk G + j % G: the heads that share the K/V side by side, so that
     * one CTA's consumers walk one K/V for rows of several heads, a group
     * leaves one CTA with empty blocks, not one a head, and under a causal
     * mask a CTA's blocks walk within a tile of each other. CTA `cta` takes
     * blocks [n - kConsumers (cta + 1), n - kConsumers cta), from the last:
     * the CTA with empty blocks is the last, and holds the first rows, the
     * shortest causal walks (it held the longest, run by one consumer alone:
     * 16 tiles at 1k keys against 1), and the longest walks start first.
     * Which CTA runs a row changes none of its bits (the same consumer code
     * on each row's own walk). block_of(c): consumer c's first row and
     * head; a block before the first has m0 = q_end, past every row. (An
     * invalid sequence's rows, poisoned below, count up to seqlen_q.)
     * D256 (!kByKv) keeps one (sequence, query head) a CTA, rows from the
     * first: there the blocks by kv head measured 0.955-0.97x at 2k-16k
     * keys without a mask (benchmarks/results/2026-11-30_h200_fwd_row_blocks_cc7a1dd.md,
     * section 4). */
    /* (every consumer's, once: one divide, then a step per consumer; uniform over the CTA) */
    int blk_m0[C::kConsumers], blk_h[C::kConsumers];
    if constexpr (C::kByKv) {
        const int q_end = ((seq.valid ? len_q : p.seqlen_q) + kBlockM - 1) / kBlockM * kBlockM;
        const int j0 = G * (q_end / kBlockM) - C::kConsumers * (cta + 1); /* the CTA's first block */
        const int j = max(j0, 0);
        int rb = fad_fastdiv_div(j, wa.div_group), g = j - rb * G;
#pragma unroll
        for (int c = 0; c < C::kConsumers; c++) {
            const bool some = j0 + c >= 0;
            blk_m0[c] = some ? rb * kBlockM : q_end;
            blk_h[c] = hk * G + g;
            if (some && ++g == G)
                g = 0, rb++;
        }
    }
    struct row_block {
        int m0, h;
    };
    auto block_of = [&](int c) { /* (selects, not a local-memory array, for a runtime c) */
        if constexpr (!C::kByKv) {
            return row_block{cta * C::kRows + c * kBlockM, h_cta};
        } else {
            row_block r = {blk_m0[0], blk_h[0]};
#pragma unroll
            for (int i = 1; i < C::kConsumers; i++)
                if (c == i)
                    r = {blk_m0[i], blk_h[i]};
            return r;
        }
    };
    if (!seq.valid && p.cache_seqlens && !a.plan.cta_per_split) { /* (else the combine does it) */
        if constexpr (!C::kByKv) {
            for (int i = cta * C::kRows + warp; i < (cta + 1) * C::kRows; i += C::kThreads / 32)
                poison_row(p, seq, h_cta, i, lane, 32);
        } else {
            for (int i = warp; i < C::kRows; i += C::kThreads / 32) {
                const row_block blk = block_of(i / kBlockM);
                poison_row(p, seq, blk.h, blk.m0 + i % kBlockM, lane, 32);
            }
        }
        return;
    }
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw); /* consumer c's Q: + c * kBlockM * kHeadDim */
    const int D = p.head_dim;
    /* The producer issues Q first (nothing else uses that shared memory), so
     * that its trip from global memory overlaps the set-up. A consumer's
     * whole Q tile (inside the sequence) is kHeadDim / 64 boxes of the copy
     * engine, issued by thread 0, which inits q_full before the CTA meets
     * (ring_init then leaves it alone) and expects their bytes on it; a tile
     * that the sequence's end cuts goes by cp.async, zero-filled past the
     * end. Each producer thread arrives on q_full once its copies (if any)
     * have landed, after the CTA met. (Issued after the set-up, a
     * three-consumer CTA waited 1.2-1.3 us for Q. By cp.async, the consumers'
     * setmaxnreg after the meeting stamped 0.75-0.80 us a three-consumer CTA,
     * 0.53 with the copy engine's Q: 1.04-1.09x at D128 GQA and D256 up to 1k
     * keys; docs/performance.md, "What won".) */
    uint64_t *q_full = reinterpret_cast<uint64_t *>(smem_raw + C::kBarOffset) + 2 * kStages;
    if (wg == 0) {
        const bool tq = wa.tma_q;
        auto by_tma = [&](int m0) { return tq && m0 + kBlockM <= len_q; }; /* a consumer's Q */
        if (tq && tid == 0) {
            mbar_init(q_full, 128);
            mbar_init_fence();
            int whole = 0;
#pragma unroll
            for (int c = 0; c < C::kConsumers; c++)
                whole += by_tma(block_of(c).m0);
            if (whole)
                mbar_expect_tx(q_full, (uint32_t)(whole * C::kQBytes));
        }
        const int64_t q_row0 = tq ? seq.q_off / p.q_row_stride : 0;
#pragma unroll
        for (int c = 0; c < C::kConsumers; c++) {
            const row_block blk = block_of(c);
            const int m0 = blk.m0;
            if (by_tma(m0)) {
                if (tid == 0)
                    tma_load_tile<kBlockM, kHeadDim>(sQ + c * kBlockM * kHeadDim, &wa.q_map, blk.h,
                                                     (int)(q_row0 + m0), q_full);
                continue;
            }
            const T *q_g = (const T *)p.q + seq.q_off + (int64_t)min(m0, max(len_q - 1, 0)) * p.q_row_stride +
                           blk.h * p.q_head_stride;
            load_tile<T, kHeadDim, kBlockM, 128, true>(sQ + c * kBlockM * kHeadDim, q_g,
                                                       (int)p.q_row_stride, len_q - m0, D);
        }
    }

    /* Each consumer's tiles [first, last), by fwd_kernel's rules (walks =
     * 0: no tile -- no rows, or its split is masked for every row). The
     * producer copies the union [u_first, u_last). Consumer c's walk is
     * computed once, by lane 0 of its first warp, into shared memory that
     * every thread reads after the CTA barrier below. (With every warp
     * computing every consumer's walk, integer divisions by the split size
     * in all 16-20 warps, the CTAs' set-up stamped 2.1 us longer at D128,
     * 3.05 us at D64's lean shape; computed once: 1.04-1.08x at D64 L1k,
     * docs/performance.md, "What won".) */
    struct __align__(16) walk {
        int walks, first, last, unused;
    };
    walk *s_walk = reinterpret_cast<walk *>(smem_raw + C::kWalkOffset);
    if (wg >= 1 && warp % 4 == 0 && lane == 0) {
        const int c = wg - 1, m0 = block_of(c).m0, m_end = min(m0 + kBlockM, len_q);
        walk w = {0, 0, 0, 0};
        if (m0 < len_q) {
            const fad_key_range lo = fad_row_keys(m0, len_q, len_k, p.window_left, p.window_right);
            const fad_key_range hi = fad_row_keys(m_end - 1, len_q, len_k, p.window_left, p.window_right);
            w.walks = tile_walk<kBlockN>(a.plan, lo, hi, len_k, &w.first, &w.last) && w.first < w.last;
        }
        s_walk[c] = w;
    }

    T *sKV = reinterpret_cast<T *>(smem_raw + C::kConsumers * C::kQBytes); /* stage st: K, then V */
    uint64_t *full = reinterpret_cast<uint64_t *>(smem_raw + C::kBarOffset);
    uint64_t *empty = full + kStages;
    /* (kKVApart: full and empty are the K halves', these the V halves') */
    uint64_t *full_v = q_full + 1, *empty_v = full_v + kStages;
    /* full: every producer thread's copies; empty: one arrival per consumer warp */
    if constexpr (C::kKVApart)
        if (tid == 0)
            for (int st = 0; st < kStages; st++)
                mbar_init(&full_v[st], 128), mbar_init(&empty_v[st], 4 * C::kConsumers);
    /* kPaged: set by a producer thread that met a page outside the cache (before it
     * announced that tile), read by the consumers once every tile was announced */
    int *s_bad = reinterpret_cast<int *>(smem_raw + C::kBadOffset);
    if (kPaged && tid == 0)
        *s_bad = 0;
    /* (fences and syncs those too; q_full was inited above where Q takes the copy engine) */
    ring_init(full, empty, kStages, 128, 4 * C::kConsumers, wa.tma_q ? nullptr : q_full, 128);
    int u_first = INT_MAX, u_last = INT_MIN;
#pragma unroll
    for (int c = 0; c < C::kConsumers; c++) { /* (unrolled: scalars, not an array in local memory) */
        const walk w = s_walk[c];
        if (w.walks)
            u_first = min(u_first, w.first), u_last = max(u_last, w.last);
    }
    const bool any_walk = u_first < u_last;

    if (wg == 0) {
        /* ---- producer: Q (issued above), then the K/V tiles of the union walk, in order ---- */
        if constexpr (C::kSetMaxNReg)
            setmaxnreg_dec<C::kProducerRegs>();
        mbar_arrive_cp_async(q_full);
        if (!any_walk) {
            cp_async_wait_all();
            return;
        }
        const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
        const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;
        /* wa.tma: a whole tile's K or V half (inside the sequence) is
         * kHeadDim / 64 boxes of the copy engine, issued by thread 0, whose
         * arrival on the half's full barrier expects their bytes; the other
         * threads arrive at once (the barrier counts 128). The phase
         * completes when the bytes have landed: nothing is announced late and
         * nobody fences (the engine writes through the async proxy that wgmma
         * reads through). A tile that the sequence's end cuts -- only the
         * walk's last can be -- goes by cp.async, zero-filled past the end,
         * and is announced once it has landed. */
        const int64_t k_row0 = wa.tma ? seq.k_off / p.k_row_stride : 0;
        const int64_t v_row0 = wa.tma ? seq.v_off / p.v_row_stride : 0;
        /* (kPaged: by boxes of kPagedBox rows, each inside one page, as long as the
         * sequence's first row starts a box) */
        auto whole = [&](int t0) {
            return wa.tma && t0 + kBlockN <= len_k && (!kPaged || seq.k_start % (kPaged ? kPagedBox : 1) == 0);
        };
        /* kPaged: rows [0, len_k - t0) of tile t0 through the block table, one half
         * (kHalves 1: K, 2: V) or both; a page outside the cache sets s_bad */
        const T *k_h = (const T *)p.k + hk * p.k_head_stride, *v_h = (const T *)p.v + hk * p.v_head_stride;
        auto paged = [&](auto halves, T *sK_, T *sV_, int t0) {
            if (load_kv_paged<T, kHeadDim, kBlockN, 128, true, 1, decltype(halves)::value>(sK_, sV_, p, seq, k_h, v_h,
                                                                                           t0, len_k - t0, D))
                *s_bad = 1;
        };
        auto tma_half = [&](T *dst, bool is_v, int t0, uint64_t *bar) { /* (thread 0) */
            if constexpr (kPagedBox == kBlockN) {
                /* pages of whole tiles: the tile at its page's row (the map's row
                 * page x page_size + row in it), one look-up; a page outside the
                 * cache: a box outside the map, zeros, as cp.async fills */
                int pg, in_page;
                const bool ok = fad_kv_page(&p, &seq, t0, &pg, &in_page);
                if (!ok)
                    *s_bad = 1;
                tma_load_tile<kBlockN, kHeadDim>(dst, is_v ? &wa.v_map : &wa.k_map, hk,
                                                 ok ? pg * p.page_size + in_page : -kBlockN, bar);
            } else if constexpr (kPaged) {
                /* each 16-row group at its page's row, the same way */
#pragma unroll
                for (int g = 0; g < kBlockN / 16; g++) {
                    int pg, in_page;
                    const bool ok = fad_kv_page(&p, &seq, t0 + 16 * g, &pg, &in_page);
                    if (!ok)
                        *s_bad = 1;
                    const int row = ok ? pg * p.page_size + in_page : -16;
#pragma unroll
                    for (int cb = 0; cb < kHeadDim / 64; cb++)
                        tma_load_box(reinterpret_cast<unsigned char *>(dst) + (cb * kBlockN + 16 * g) * 128,
                                     is_v ? &wa.v_map : &wa.k_map, cb * 64, hk, row, bar);
                }
            } else {
                tma_load_tile<kBlockN, kHeadDim>(dst, is_v ? &wa.v_map : &wa.k_map, hk,
                                                 (int)((is_v ? v_row0 : k_row0) + t0), bar);
            }
        };
        if constexpr (C::kKVApart) {
            /* Each half once the consumers released its slot, K one tile
             * ahead of V: K(0), K(1), V(0), K(2), V(1), ... A consumer needs
             * K(i + 1) before V(i) (S of the next tile is issued before
             * O += P V of this one), and K's slot frees a half turn earlier
             * (when S retires), so K(i + 2) need not queue behind V(i)'s wait
             * for O += P V of tile i - 2. A half is a commit group, announced
             * (landed, fenced, arrived) once the next one is issued, as the
             * whole tiles are below. No slot the producer waits for depends
             * on an announcement still behind it (V(i)'s waits on O += P V of
             * tile i - 2, K(i + 2)'s on S of tile i), so the lag cannot
             * deadlock. (Measured: the K-first order alone 0.98-1.02x, the
             * writer's fence 1.01-1.10x: docs/design.md,
             * "warp-specialized-prefill".) */
            uint64_t *pending = nullptr; /* the full barrier of the half issued last */
            auto load_half = [&](int i, bool is_v) {
                const int st = i % kStages, t0 = u_first + i * kBlockN;
                T *sK = sKV + (size_t)st * 2 * kBlockN * kHeadDim;
                ring_wait_empty(is_v ? &empty_v[st] : &empty[st], i, kStages);
                if (whole(t0)) {
                    uint64_t *bar = is_v ? &full_v[st] : &full[st];
                    if (tid == 0) {
                        mbar_arrive_expect_tx(bar, (uint32_t)C::kTileBytes);
                        tma_half(is_v ? sK + kBlockN * kHeadDim : sK, is_v, t0, bar);
                    } else {
                        mbar_arrive(bar);
                    }
                    if (pending) { /* (the last tile's K half, cut by the sequence's end) */
                        cp_async_wait_all();
                        fence_async_smem();
                        mbar_arrive(pending);
                        pending = nullptr;
                    }
                    return;
                }
                if constexpr (kPaged) {
                    if (is_v)
                        paged(std::integral_constant<int, 2>{}, nullptr, sK + kBlockN * kHeadDim, t0);
                    else
                        paged(std::integral_constant<int, 1>{}, sK, nullptr, t0);
                } else if (is_v)
                    load_tile_lean<T, kHeadDim, kBlockN, 128, true>(sK + kBlockN * kHeadDim,
                                                                   v_g + (int64_t)t0 * p.v_row_stride,
                                                                   (int)p.v_row_stride, len_k - t0, D);
                else
                    load_tile_lean<T, kHeadDim, kBlockN, 128, true>(sK, k_g + (int64_t)t0 * p.k_row_stride,
                                                                   (int)p.k_row_stride, len_k - t0, D);
                cp_async_commit();
                if (pending) {
                    cp_async_wait<1>();
                    fence_async_smem();
                    mbar_arrive(pending);
                }
                pending = is_v ? &full_v[st] : &full[st];
            };
            const int n = (u_last - u_first + kBlockN - 1) / kBlockN;
            load_half(0, false);
            for (int i = 0; i < n; i++) {
                if (i + 1 < n)
                    load_half(i + 1, false);
                load_half(i, true);
            }
            cp_async_wait_all();
            if (pending) {
                fence_async_smem();
                mbar_arrive(pending);
            }
            return;
        }
        /* Tile t0's K and V into the stage at sK by cp.async, zero-filled
         * past the sequence's end: one commit group. */
        auto copy_tile = [&](T *sK, int t0) {
            if constexpr (kPaged) {
                paged(std::integral_constant<int, 3>{}, sK, sK + kBlockN * kHeadDim, t0);
                cp_async_commit();
                return;
            }
            load_tile_lean<T, kHeadDim, kBlockN, 128, true>(sK, k_g + (int64_t)t0 * p.k_row_stride,
                                                           (int)p.k_row_stride, len_k - t0, D);
            load_tile_lean<T, kHeadDim, kBlockN, 128, true>(sK + kBlockN * kHeadDim,
                                                           v_g + (int64_t)t0 * p.v_row_stride,
                                                           (int)p.v_row_stride, len_k - t0, D);
            cp_async_commit();
        };
        if (wa.tma) { /* (one barrier per stage: K's and V's boxes on it) */
            uint64_t *pending = nullptr;
            for (int t0 = u_first, i = 0; t0 < u_last; t0 += kBlockN, i++) {
                const int st = i % kStages;
                ring_wait_empty(&empty[st], i, kStages);
                T *sK = sKV + (size_t)st * 2 * kBlockN * kHeadDim;
                if (whole(t0)) {
                    if (tid == 0) {
                        mbar_arrive_expect_tx(&full[st], 2 * (uint32_t)C::kTileBytes);
                        tma_half(sK, false, t0, &full[st]);
                        tma_half(sK + kBlockN * kHeadDim, true, t0, &full[st]);
                    } else {
                        mbar_arrive(&full[st]);
                    }
                } else {
                    copy_tile(sK, t0);
                    pending = &full[st];
                }
            }
            cp_async_wait_all();
            if (pending) {
                fence_async_smem();
                mbar_arrive(pending);
            }
            return;
        }
        /* A tile's copies are one commit group. The thread announces tile
         * i - 1 once it has issued tile i: it waits for tile i - 1's group to
         * land, fences its writes for the async proxy that wgmma reads
         * through (the writer's fence, before the barrier: then no consumer
         * fences per tile), and arrives on the stage's full barrier. The
         * ring stays kStages - 1 tiles ahead. */
        int st_prev = 0;
        for (int t0 = u_first, i = 0; t0 < u_last; t0 += kBlockN, i++) {
            const int st = i % kStages;
            ring_wait_empty(&empty[st], i, kStages); /* the consumers are done with the tile kStages back */
            copy_tile(sKV + (size_t)st * 2 * kBlockN * kHeadDim, t0);
            if (i > 0) {
                cp_async_wait<1>();
                fence_async_smem();
                mbar_arrive(&full[st_prev]);
            }
            st_prev = st;
        }
        cp_async_wait_all();
        fence_async_smem();
        mbar_arrive(&full[st_prev]);
        return;
    }

    /* ---- consumer c: 64 query rows ---- */
    if constexpr (C::kSetMaxNReg)
        setmaxnreg_inc<C::kConsumerRegs>();
    const int c = wg - 1;
    const row_block blk = block_of(c);
    const int m0 = blk.m0, h = blk.h; /* this consumer's rows [m0, m0 + 64) of head h */
    const int64_t lse_row0 = seq.row0 + h * fad_lse_head_stride(&p); /* flat row of query 0 */
    const int m_end = min(m0 + kBlockM, len_q);
    const walk mine = s_walk[c];
    const bool walked = mine.walks;
    const int my_first = walked ? mine.first : u_last, my_last = walked ? mine.last : u_last;
    const bool partial = a.plan.cta_per_split;

    const int row0 = (warp % 4) * 16 + lane / 4; /* this thread's rows: row0 + 8r */
    const fad_key_range first_row = fad_row_keys(m0, len_q, len_k, p.window_left, p.window_right);
    const fad_key_range last_row = fad_row_keys(max(m_end - 1, m0), len_q, len_k, p.window_left, p.window_right);
    const int unmasked_lo = last_row.lo, unmasked_hi = first_row.hi;
    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, false);
    const rows_prefill rows = {m0 + row0, 0.f};
    fad_dropout drop = {}; /* (read only under kDrop) */
    int i_pos[2] = {0, 0}; /* this thread's rows' key-space positions, dropout's counter */
    if constexpr (kDrop) {
        drop = fad_dropout_of(&p, b);
#pragma unroll
        for (int r = 0; r < 2; r++)
            i_pos[r] = rows.qrow(r) + len_k - len_q;
    }
    const dropout_bytes keep(drop);

    float mR[2], lR[2], m_s[2], l_s[2];
    float oR[1][C::kRSmem ? 1 : kHeadDim / 8][4] = {}; /* R's o in registers: the empty state's */
    float *sR = reinterpret_cast<float *>(smem_raw + C::kROffset + c * C::kRBytes); /* (kRSmem) */
    /* (kRGlobal) this lane's first value in its warp's shared part */
    float *sR_lane = sR + (warp % 4) * (C::kRBytes / 4 / sizeof(float)) + lane;
    /* kRGlobal: this warp's slot (r_lane: its lane's first value; until its
     * first fold, a valid address that no fold reads, R being empty). The
     * pool holds a slot for every consumer warp that can be resident at once
     * (this kernel's shared memory keeps it to one CTA an SM), so a free one
     * always exists and the scan, lane 0's compare-and-swaps, ends. It starts
     * at the slot of this SM (%smid) and warp, which the CTA that ran here
     * before gave back before it ended: one compare-and-swap as a rule.
     * (Started by the CTA's index instead, with nearly every slot held, the
     * scans took longer than the folds: 0.78-0.80x at L4k-16k.) */
    int r_slot = -1;
    float *r_lane = a.ws_r + lane;
    auto take_slot = [&]() {
        if (lane == 0) {
            const unsigned n = (unsigned)a.plan.r_slots;
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            /* (consumer warps are 4 .. 4 kConsumers + 3, after the producer's
             * 4; fad_make_plan's 4 x FAD_WS_D256_CONSUMERS slots an SM) */
            unsigned sl = (sm * (unsigned)(4 * C::kConsumers) + (unsigned)(warp - 4)) % n;
            while (atomicCAS(&a.ws_r_flag[sl], 0u, 1u) != 0u)
                sl = sl + 1 == n ? 0u : sl + 1;
            r_slot = (int)sl;
        }
        r_slot = __shfl_sync(0xffffffffu, r_slot, 0);
        r_lane = a.ws_r + (size_t)r_slot * FAD_WS_R_SLOT_FLOATS + lane;
    };
    auto give_slot = [&]() { /* after the last fold's reads */
        __syncwarp();
        if (lane == 0 && r_slot >= 0) {
            __threadfence(); /* (this warp's reads and writes of the slot before it is free) */
            atomicExch(&a.ws_r_flag[r_slot], 0u);
        }
    };
    float acc[1][kHeadDim / 8][4] = {}; /* (written by a split's first P V, as in fwd_kernel) */
#pragma unroll
    for (int r = 0; r < 2; r++)
        mR[r] = m_s[r] = -INFINITY, lR[r] = l_s[r] = 0.f;
    bool have_R = false;
    auto fold = [&](bool to_R) {
        if constexpr (C::kRGlobal) {
            if (to_R && r_slot < 0)
                take_slot();
            fold_split(acc, m_s, l_s, mR, lR,
                       r_in_smem_global<1, kHeadDim / 8, C::kRSmemNB, C::kRBatch>{sR_lane, r_lane}, have_R,
                       to_R);
            if (!to_R)
                give_slot();
        } else if constexpr (C::kRSmem)
            fold_split(acc, m_s, l_s, mR, lR, r_in_smem<1, kHeadDim / 8, 128>{sR, tid % 128}, have_R, to_R);
        else
            fold_split(acc, m_s, l_s, mR, lR, r_in_regs<1, kHeadDim / 8>{oR}, have_R, to_R);
    };

    const uint32_t q_addr = smem_addr(sQ + c * kBlockM * kHeadDim);
    const uint32_t kv_addr0 = smem_addr(sKV);
    /* Tile i of the union walk sits in stage i % kStages, and its copy
     * completes phase i / kStages of that stage's `full` barrier. In the
     * tile loop a (stage, phase) pair steps along with the tile (next()):
     * no division per tile. */
    struct ring_pos {
        int stage, phase;
        __device__ __forceinline__ ring_pos next() const
        {
            return stage + 1 == kStages ? ring_pos{0, phase ^ 1} : ring_pos{stage + 1, phase};
        }
    };
    auto pos_of = [&](int t0) {
        const int i = (t0 - u_first) / kBlockN;
        return ring_pos{i % kStages, (i / kStages) & 1};
    };
    auto k_addr = [&](ring_pos r) { return kv_addr0 + (uint32_t)r.stage * 2 * (uint32_t)C::kTileBytes; };
    /* Waits until the tile at r has landed (the producer fenced it for the
     * async proxy before it arrived; kKVApart: its K half), and until its V
     * half has (kKVApart; else a no-op). */
    auto wait_full = [&](ring_pos r) { mbar_wait(&full[r.stage], r.phase); };
    auto wait_v = [&](ring_pos r) {
        if constexpr (C::kKVApart)
            mbar_wait(&full_v[r.stage], r.phase);
    };
    /* This consumer is done with the tile at r's K half (kKVApart; else a
     * no-op), with the whole tile at r. */
    auto release_k = [&](ring_pos r) {
        if constexpr (C::kKVApart)
            warp_arrive(&empty[r.stage], lane);
    };
    auto release = [&](ring_pos r) { warp_arrive(C::kKVApart ? &empty_v[r.stage] : &empty[r.stage], lane); };
    /* (K released before V is waited for: a skipping consumer must hold K
     * no longer than a walking one, whose K(i) goes once S(i) retires, since
     * the producer announces a cp.async half only once it has issued the
     * next, and K(i + 2)'s slot waits for K(i)'s release: holding K(i) until
     * V(i) landed deadlocked at D256 with two consumers and cp.async.) */
    auto skip = [&](ring_pos r) { wait_full(r), release_k(r), wait_v(r), release(r); };
    auto need_mask = [&](int t0) { return t0 < unmasked_lo || t0 + kBlockN > unmasked_hi; };

    /* Q's copies complete q_full as they land (the producer does not wait
     * for them), so the reader fences, once: wgmma reads Q from shared memory
     * where it is not held in registers, and cp.async wrote the cut tiles. */
    mbar_wait(q_full, 0);
    fence_async_smem();
    for (int t0 = u_first; t0 < my_first; t0 += kBlockN) /* the other consumer's tiles */
        skip(pos_of(t0));

    /* Q's A fragments in registers (kQInRegs): S = Q K^T then reads only K
     * from shared memory. With Q there too, an m64n64k16 wgmma reads 4 KB
     * per 32 tensor-core clocks, the whole 128 B/clk of shared memory. With
     * dropout (FAD_WS_DROP_Q_SMEM) Q stays in shared memory: its 32 registers
     * go to the draws, which spilled beside them. */
    constexpr bool kQInRegs = C::kQInRegs && !(kDrop && FAD_WS_DROP_Q_SMEM);
    /* Where Q is read from shared memory, its first C::kQRegK k-chunks may be
     * held in registers all the same (RS products; fwd_ws_cfg): an SS
     * product reads Q's 2 KB a k-chunk there beside K's. */
    constexpr int kQRegK = kQInRegs ? kHeadDim / 16 : !kDrop && !kPaged ? C::kQRegK : 0;
    uint32_t qf[1][kQRegK > 0 ? kQRegK : 1][4];
    if constexpr (kQRegK > 0)
        if (walked)
#pragma unroll
            for (int kk = 0; kk < kQRegK; kk++)
                ldmatrix_x4(qf[0][kk], smem_addr(sQ + c * kBlockM * kHeadDim +
                                                 swz128<kBlockM>((warp % 4) * 16 + lane % 16,
                                                                 16 * kk + 8 * (lane / 16))));
    if (walked) {
        float s[1][kBlockN / 8][4];
        float m_tile[2], scale[2]; /* scale: acc's factors for the tile in s (softmax_exp_p) */
        bool all_one;
        uint32_t pf[kBlockN / 16][4];
        /* S = Q K^T of the tile at r into s (zeroed: the chain adds to it) */
        auto issue_s = [&](ring_pos r) {
#pragma unroll
            for (int j = 0; j < kBlockN / 8; j++)
                s[0][j][0] = s[0][j][1] = s[0][j][2] = s[0][j][3] = 0.f;
            issue_qk_wgmma<T, kHeadDim, kBlockN, kBlockM, kQInRegs, kQRegK>(s, qf, q_addr, k_addr(r));
        };
        /* Prologue: S and the softmax of the first tile. */
        int t0 = my_first;
        ring_pos pos = pos_of(t0); /* tile t0's */
        wait_full(pos);
        issue_s(pos);
        wgmma_wait<0>();
        wgmma_fence_operand(s[0]);
        release_k(pos);
        softmax_max<false>(s, m_tile, need_mask(t0), mod, rows, t0, len_q, len_k, p.window_left,
                           p.window_right);
        softmax_exp_p(s, m_s, l_s, m_tile, mod, scale, all_one);
        int split_left = fad_split_tiles_left(t0, S, kBlockN);
        bool acc_live = false; /* acc holds this split's o: false until its first P V */
        /* pv_open: O += P V of the tile at pos_open still runs (its wait and
         * its stage's release are the next turn's first steps) */
        bool pv_open = false;
        ring_pos pos_open = pos;
        /* Each turn of the loop: s holds P of tile t0, and scale its factors
         * for acc. Issue S of the next tile into s, rescale acc meanwhile,
         * then issue O += P V of tile t0 (the tensor cores run the two in
         * that order); the next tile's softmax, its exponentials included,
         * then runs while O += P V does, which the next turn waits for
         * before it packs P into pf. (Waited for in the turn that issued it,
         * after the exponentials in the source, the wait came before them in
         * ptxas's schedule: their results took pf's registers, which the
         * product still reads. Waiting here, across the loop's back edge,
         * measured 1.07-1.12x at D64 from 2k keys, 1.00-1.09x at D256,
         * 0.98-1.05x at D128: docs/design.md, "warp-specialized-prefill".)
         * acc gets the same operations in the same order as in fwd_kernel (a
         * split's first P V overwrites acc, so its rescale is skipped). Each
         * path issues its groups on straight-line code, so ptxas sees which
         * group each wgmma_wait retires. */
        for (;;) {
            wgmma_wait<0>(); /* O += P V of the last turn, if open (else nothing is in flight) */
            wgmma_fence_operand(acc[0]);
            wgmma_fence_operand(pf);
            if (pv_open)
                release(pos_open);
            pv_open = false;
            p_fragments<T, kBlockN>(s, pf);
            if constexpr (kDrop) {
                fad_u32x4 dbits[2][1];
                dropout_draw_tile<2, kBlockN / 8>(dbits, drop, h, i_pos, t0);
                dropout_pf(pf, keep, dbits);
            }
            const uint32_t v_addr = k_addr(pos) + (uint32_t)C::kTileBytes;
            const ring_pos pos_done = pos;
            auto pv_done = [&]() { /* O += P V of the tile at pos_done has finished */
                wgmma_wait<0>();
                wgmma_fence_operand(acc[0]);
                wgmma_fence_operand(pf);
                release(pos_done);
            };
            if (t0 + kBlockN >= my_last) {
                if (acc_live)
                    rescale_acc<true>(acc, scale, all_one);
                wait_v(pos_done);
                issue_pv_wgmma_pf<T, kHeadDim, kBlockN>(acc, pf, v_addr, acc_live);
                pv_done();
                break;
            }
            t0 += kBlockN;
            pos = pos.next();
            wait_full(pos);
            issue_s(pos);
            if (acc_live)
                rescale_acc<true>(acc, scale, all_one);
            wait_v(pos_done);
            issue_pv_wgmma_pf<T, kHeadDim, kBlockN>(acc, pf, v_addr, acc_live);
            acc_live = true;
            wgmma_wait<1>(); /* S of tile t0 (the older group) */
            wgmma_fence_operand(s[0]);
            release_k(pos);
            softmax_max<false>(s, m_tile, need_mask(t0), mod, rows, t0, len_q, len_k,
                               p.window_left, p.window_right);
            if (--split_left == 0) { /* the split ends with the tile at pos_done: fold, fresh state */
                pv_done();
                fold(true);
                split_left = S / kBlockN;
                start_split_ml<1>(m_s, l_s);
                acc_live = false;
                softmax_exp_p(s, m_s, l_s, m_tile, mod, scale, all_one);
            } else {
                softmax_exp_p(s, m_s, l_s, m_tile, mod, scale, all_one);
                pv_open = true, pos_open = pos_done; /* (waited for at the next turn's start) */
            }
        }
    }
    /* The other consumers' tiles after this one's last. my_last need not be a
     * tile boundary (a row's last key): start at the tile after the one that
     * holds it, so that no tile is released twice and none is skipped. */
    const int my_end = walked ? my_first + (my_last - my_first + kBlockN - 1) / kBlockN * kBlockN : u_last;
    for (int t0 = my_end; t0 < u_last; t0 += kBlockN)
        skip(pos_of(t0));
    if (m0 >= len_q)
        return;
    /* kPaged: a page outside the cache met in the CTA's walk (every tile is announced by now) */
    const bool poison = kPaged && *reinterpret_cast<volatile int *>(s_bad) != 0;

    if (partial) { /* the CTA's one split ends: write its (m, l, o) out */
        if (walked)
            store_split_rows(a, D, fad_split_of(my_first, S), lse_row0, m0, row0, len_q, acc, m_s, l_s, poison);
        return;
    }
    if (walked) /* R is now in acc, mR, lR (else: no key; acc is zeros, R empty, as in fwd_kernel) */
        fold(false);
    /* O staged in the consumer's Q tile, 16 rows' worth a warp, which no one
     * reads any more. Held in registers, Q was read by each warp before
     * its first wgmma, which the whole warpgroup issues together, so no warp
     * gets here before the others' reads (a warp's stage also holds other
     * warps' Q rows: swz128's layout is not row-major). Read by the S
     * products (SS), the consumer's warps first meet, so that every warp's
     * share of the last one has retired. */
    if constexpr (!kQInRegs)
#pragma unroll
        for (int i = 0; i < C::kConsumers; i++) /* (barrier 1 + c, a constant to ptxas) */
            if (c == i)
                warpgroup_sync(1 + i);
    store_result_staged<T, kHeadDim, 1>(p, D, seq, h, lse_row0, m0 + (warp % 4) * 16, len_q, acc, mR, lR, poison,
                                        kDrop ? drop.rp : 1.f,
                                        smem_addr(sQ + (c * kBlockM + (warp % 4) * 16) * kHeadDim), lane,
                                        kHeadDim == 128 && wa.tma_o ? &wa.o_map : nullptr,
                                        kHeadDim == 128 && wa.tma_o ? seq.o_off / p.out_row_stride : 0);
}

template <typename T, int kHeadDim, ws_shape kShape, int kPagedBox>
static fad_status launch_ws(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    constexpr bool kPaged = kPagedBox != 0;
    using C = fwd_ws_cfg<kHeadDim, kShape>;
    static int smem_set[FAD_MAX_DEVICES], smem_set_drop[FAD_MAX_DEVICES];
    const bool drop = a.p.dropout_p > 0.f;
    if (kPaged && drop) /* (no dropout build of the paged kernel: plan_kernel sends it to mma.sync) */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: dropout on the paged warp-specialized kernel");
    void (*kernel)(fwd_ws_args) = fwd_ws_kernel<T, kHeadDim, kShape, false, kPagedBox>;
    if constexpr (!kPaged)
        if (drop)
            kernel = fwd_ws_kernel<T, kHeadDim, kShape, true, 0>;
    fad_status st = allow_smem(kernel, drop ? smem_set_drop : smem_set, C::kSmemBytes, msg, msg_len);
    if (st != FAD_OK)
        return st;
    /* (the kernel's CTAs, its own row blocks per CTA, block_of: kByKv's of a (sequence, kv head), else
     * rows of a (sequence, query head); the plan's row blocks only size the grid of fwd_kernel) */
    const int group = a.p.num_heads / a.p.num_heads_k;
    const int heads = C::kByKv ? a.p.num_heads_k : a.p.num_heads;
    const int64_t blocks = (int64_t)(C::kByKv ? group : 1) * ((a.p.seqlen_q + C::kBlockM - 1) / C::kBlockM);
    const int ctas = (int)((blocks + C::kConsumers - 1) / C::kConsumers);
    const dim3 grid = split_grid((int64_t)ctas * a.p.batch * heads, a.plan);
    fwd_ws_args wa;
    wa.a = a;
    wa.div_ctas = fad_make_fastdiv((uint32_t)ctas);
    wa.div_heads = fad_make_fastdiv((uint32_t)heads);
    wa.div_group = fad_make_fastdiv((uint32_t)group);
    /* (the producer's whole K/V tiles through the copy engine where it can) */
    const fad_fwd_params &p = a.p;
    wa.tma = kPaged ? fad_make_paged_kv_maps(p, kPagedBox, &wa.k_map, &wa.v_map)
                    : fad_make_kv_maps(p, C::kBlockN, &wa.k_map, &wa.v_map);
    wa.tma_q = fad_make_q_map(p, C::kBlockM, &wa.q_map); /* (Q's whole tiles too) */
    /* (the output through the copy engine at D128 only: at D256 its four
     * boxes a warp measured 0.96-1.00x the threads' stores, at D64 0.98-1.00x;
     * docs/performance.md, "What won") */
    wa.tma_o = kHeadDim == 128 && fad_make_o_map(p, 16, &wa.o_map);
    if constexpr (C::kRGlobal)
        if (!a.plan.cta_per_split) { /* the R slots' pool, all free */
            if (!a.ws_r || a.plan.r_slots < C::kConsumers * 4)
                return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: no R slots in the plan at D256");
            CUDA_TRY(cudaMemsetAsync(a.ws_r_flag, 0, (size_t)a.plan.r_slots * sizeof(unsigned), stream));
        }
    kernel<<<grid, C::kThreads, C::kSmemBytes, stream>>>(wa);
    return FAD_OK;
}

/* The shape the plan chose (fad_plan.kernel: make_gpu_plan's plan_kernel, in
 * fad_core.c, by the longest sequence's keys): D128's narrow variant, where a
 * CTA's prologue and epilogue weigh against its few tiles; D64's lean
 * variant; D256's long variant, where rows fold often; else the main one. Each
 * row gets the same bits from any shape (the same consumer code on its 64
 * rows, and the same operations on R wherever it lives). A shape this head
 * dim does not build is a bug, refused. */
template <typename T, int kHeadDim, int kPagedBox>
static fad_status launch_ws_shape(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    constexpr bool kPaged = kPagedBox != 0;
    switch (a.plan.kernel) {
    case FAD_FWD_WS_MAIN:
        return launch_ws<T, kHeadDim, ws_main, kPagedBox>(a, stream, msg, msg_len);
    case FAD_FWD_WS_NARROW:
        if constexpr (kHeadDim == 128 && FAD_WS_NARROW_MAX_SK > 0)
            return launch_ws<T, kHeadDim, ws_narrow, kPagedBox>(a, stream, msg, msg_len);
        break;
    case FAD_FWD_WS_LEAN:
        if constexpr (kHeadDim == 64 && FAD_WS_D64_LEAN_MAX_SK > 0 && !kPaged)
            return launch_ws<T, kHeadDim, ws_lean, kPagedBox>(a, stream, msg, msg_len);
        break;
    case FAD_FWD_WS_LONG:
        if constexpr (kHeadDim == 256 && FAD_WS_D256_CONSUMERS > 1 && FAD_WS_D256_LONG_MIN_SK > 0 && !kPaged)
            return launch_ws<T, kHeadDim, ws_long, kPagedBox>(a, stream, msg, msg_len);
        break;
    default:
        break;
    }
    return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: warp-specialized shape %d at head dim %d",
                    a.plan.kernel, kHeadDim);
}

/* A paged cache's whole tiles go as one box a 64-column block where its pages
 * hold whole tiles (page_size a multiple of kBlockN, no leftpad: every tile
 * then starts a page's row that is a multiple of 64), else as a box per
 * 16-row group, each with its own page look-up: pages of 64 and 256 rows
 * measured 1.67-1.78x the 16-row boxes (H200;
 * benchmarks/results/2026-11-30_h200_fwd_fold_probes.md, section 3). */
template <typename T, int kHeadDim, bool kPaged>
fad_status launch_prefill_ws(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    constexpr int kBlockN = fwd_ws_cfg<kHeadDim>::kBlockN;
    if constexpr (!kPaged)
        return launch_ws_shape<T, kHeadDim, 0>(a, stream, msg, msg_len);
    else if (a.p.page_size % kBlockN == 0 && !a.p.cache_leftpad)
        return launch_ws_shape<T, kHeadDim, kBlockN>(a, stream, msg, msg_len);
    else
        return launch_ws_shape<T, kHeadDim, 16>(a, stream, msg, msg_len);
}

template fad_status launch_prefill_ws<__half, 128, false>(const fwd_args &, cudaStream_t, char *, size_t);
template fad_status launch_prefill_ws<__nv_bfloat16, 128, false>(const fwd_args &, cudaStream_t, char *, size_t);
#if FAD_WS_PAGED
template fad_status launch_prefill_ws<__half, 128, true>(const fwd_args &, cudaStream_t, char *, size_t);
template fad_status launch_prefill_ws<__nv_bfloat16, 128, true>(const fwd_args &, cudaStream_t, char *, size_t);
#endif
#if FAD_WS_D256
template fad_status launch_prefill_ws<__half, 256, false>(const fwd_args &, cudaStream_t, char *, size_t);
template fad_status launch_prefill_ws<__nv_bfloat16, 256, false>(const fwd_args &, cudaStream_t, char *, size_t);
#endif
#if FAD_WS_D64_CONSUMERS
template fad_status launch_prefill_ws<__half, 64, false>(const fwd_args &, cudaStream_t, char *, size_t);
template fad_status launch_prefill_ws<__nv_bfloat16, 64, false>(const fwd_args &, cudaStream_t, char *, size_t);
#endif
