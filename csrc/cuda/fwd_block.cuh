/*
 * fwd_block.cuh — what a forward CTA's block of rows shares between the
 * kernels: the prefill tile shape (fwd_cfg, whose kBlockN every kernel walks),
 * the key tiles it walks (tile_walk), paged K/V loads, the NaN rows of a
 * sequence outside the cache, and the end of a prefill row block (a split's
 * partial state to the workspace, or the merged result to out and lse).
 */
#ifndef FAD_FWD_BLOCK_CUH
#define FAD_FWD_BLOCK_CUH

#include "fwd_launch.h"
#include "fwd_tile.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

/* K and V rows [0, rows) of the tile at key t0 of a paged sequence into the
 * swizzled stages sK, sV (rows past `rows` zero-filled): one block-table look-up
 * per row (fad_kv_row, the CPU path's helper), shared by K and V, so a tile may
 * span pages of any multiple-of-16 size. k_h/v_h: k/v at this kv head. Returns
 * true when some row's page lies outside the cache: that row is zero-filled,
 * never read, and the caller poisons the rows it computes (NaN).
 * v_src (a pipeline that copies V one tile after K): the V copies are not
 * issued; each chunk's V source offset (-1: zero-fill) is kept there for
 * load_v_paged, so each row's page is still looked up once. kHalves (1: K,
 * 2: V, 3: both) copies one half alone, for a producer that copies K and V
 * at different times (fwd_ws_kernel's, each half's rows looked up anew). */
template <typename T, int kHeadDim, int kBlockN, int kThreads, bool kSw128 = false, int kVSrc = 1,
          int kHalves = 3>
__device__ __forceinline__ bool load_kv_paged(T *sK, T *sV, const fad_fwd_params &p,
                                              const fad_seq &seq, const T *k_h, const T *v_h,
                                              int t0, int rows, int D,
                                              int64_t (*v_src)[kVSrc] = nullptr)
{
    constexpr int kChunks = kHeadDim / 8;
    static_assert(kBlockN * kChunks % kThreads == 0, "whole chunks per thread");
    const int tid = (int)opaque(threadIdx.x);
    bool bad = false;
#pragma unroll
    for (int i = 0; i < kBlockN * kChunks / kThreads; i++) {
        const int c = tid + i * kThreads;
        const int row = c / kChunks, col = (c % kChunks) * 8;
        int64_t ko = 0, vo = 0;
        bool ok = false;
        if (row < rows) {
            const bool page_ok = fad_kv_row(&p, &seq, t0 + row, &ko, &vo);
            bad |= !page_ok;
            ok = page_ok && col < D;
        }
        const int at = tile_off<kHeadDim, kBlockN, kSw128>(row, col);
        if constexpr ((kHalves & 1) != 0)
            cp_async16(sK + at, k_h + (ok ? ko + col : 0), ok ? 16 : 0);
        if constexpr ((kHalves & 2) != 0) {
            if (v_src)
                (*v_src)[i] = ok ? vo + col : -1;
            else
                cp_async16(sV + at, v_h + (ok ? vo + col : 0), ok ? 16 : 0);
        }
    }
    return bad;
}

/* The V half of load_kv_paged(..., v_src): the copies it left out. */
template <typename T, int kHeadDim, int kBlockN, int kThreads, int kVSrc>
__device__ __forceinline__ void load_v_paged(T *sV, const T *v_h, const int64_t (&v_src)[kVSrc])
{
    constexpr int kChunks = kHeadDim / 8;
    static_assert(kVSrc == kBlockN * kChunks / kThreads, "one offset per chunk");
    const int tid = (int)opaque(threadIdx.x);
#pragma unroll
    for (int i = 0; i < kVSrc; i++) {
        const int c = tid + i * kThreads;
        const bool ok = v_src[i] >= 0;
        cp_async16(sV + tile_off<kHeadDim, kBlockN, false>(c / kChunks, (c % kChunks) * 8),
                   v_h + (ok ? v_src[i] : 0), ok ? 16 : 0);
    }
}

/* A KV-cache sequence whose rows fall outside the cache (fad_seq.valid == 0:
 * its indices are not read back on the host) gets NaN in every element of
 * query row i of head h (out and lse): loud, and the caller needs no NaN
 * pre-fill. Varlen batches cannot say which rows an invalid sequence owns;
 * their callers pre-fill. */
__device__ __forceinline__ void poison_row(const fad_fwd_params &p, const fad_seq &seq, int h,
                                           int i, int lane, int lanes)
{
    const float nan = __int_as_float(0x7fffffff);
    if (i >= p.seqlen_q)
        return;
    uint16_t *o = (uint16_t *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride;
    for (int c = lane; c < p.head_dim; c += lanes)
        o[c] = 0x7fff; /* a quiet NaN in fp16 and bf16 alike */
    if (lane == 0 && p.softmax_lse)
        p.softmax_lse[seq.row0 + h * fad_lse_head_stride(&p) + i] = nan;
}

/* The tiles of splits [s_begin, s_end) over keys [lo, hi) (hi already cut at
 * len_k): from the kBlockN boundary at or below lo, but not before the first
 * split's first key, to the last split's end or hi. The one rule of every
 * walk (tile_walk below, the packed kernel's runs), since it decides bits. */
template <int kBlockN>
__device__ __forceinline__ void split_tiles(int s_begin, int s_end, int S, int lo, int hi, int *t_first, int *t_last)
{
    *t_first = max(fad_split_keys(s_begin, S).lo, lo / kBlockN * kBlockN);
    *t_last = min(fad_split_keys(s_end, S).lo, hi);
}

/* The key tiles a CTA walks, the same rule for both forward kernels (the walk
 * decides bits): the kBlockN-aligned tiles of splits [s_begin, s_end) that
 * intersect keys [first.lo, last.hi) of its rows (first/last: the key ranges of
 * its first and last query row, which only grow with the row index). On the
 * CTA-per-split schedule the CTA walks its split (split_of_cta) only; returns false
 * when that split is masked for every row (the combine skips it too). */
template <int kBlockN>
__device__ __forceinline__ bool tile_walk(const fad_plan &plan, fad_key_range first,
                                          fad_key_range last, int len_k, int *t_first, int *t_last)
{
    const int S = plan.split_size;
    const fad_key_range keys = {first.lo, last.hi};
    int s_begin = fad_first_split(keys, S), s_end = fad_end_split(keys, S);
    if (plan.cta_per_split) {
        const int split = split_of_cta(); /* (fwd_launch.h's split_grid) */
        if (split < s_begin || split >= s_end)
            return false;
        s_begin = split;
        s_end = split + 1;
    }
    split_tiles<kBlockN>(s_begin, s_end, S, keys.lo, min(keys.hi, len_k), t_first, t_last);
    return true;
}

/* kWgmma: the sm_90a variant (D 64 and 128): each warpgroup's 64 rows run
 * attend_tile_wgmma on tiles in the swz128 layout; Q and the merged result R
 * are held in registers or in shared memory by head dim (FAD_WG_Q_REGS_MIN_D,
 * FAD_WG_R_REGS_MIN_D). The same rows per CTA and the same tile walk as the
 * mma.sync variant. */
template <int kHeadDim, bool kWgmma = false> struct fwd_cfg {
    /* Knobs in fad_config.h (each measured by a same-run A/B). Wide (D <=
     * FAD_WIDE_MAX_D): 32 query rows per warp (two m16 tiles), so each K/V
     * fragment read from shared memory feeds four MMAs. Otherwise 16 rows per
     * warp, Q held in registers up to D=128. Several small CTAs per SM beat one
     * big one: their warps are not held in step by a shared barrier, so one
     * CTA's softmax overlaps another's MMAs. */
    static constexpr bool kWide = kHeadDim <= FAD_WIDE_MAX_D;
    static constexpr int kMT = kWide ? 2 : 1;
    static constexpr int kWarps = kHeadDim <= 64 ? FAD_D64_WARPS : kHeadDim <= 128 ? FAD_D128_WARPS : 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBlockM = kWarps * 16 * kMT;
    /* Keys per tile: 32 for wide D=128 keeps S + O within the registers. */
    static constexpr int kBlockN = kWide && kHeadDim == 128 ? 32 : 64;
    static constexpr int kDBlocks = kHeadDim / 8; /* n8 blocks of the output row */
    static constexpr bool kQInRegs = !kWide && kHeadDim <= 128 && (!kWgmma || kHeadDim >= FAD_WG_Q_REGS_MIN_D);
    /* CTAs per SM the register allocation must allow (__launch_bounds__). */
    static constexpr int kMinBlocks = kHeadDim <= 64 ? FAD_D64_MIN_BLOCKS : 1;
    /* K and V are double-buffered: tile t+1 loads while tile t computes. */
    static constexpr int kStageElems = 2 * kBlockN * kHeadDim; /* one K + one V tile */
    /* The merged result's o in registers (r_in_regs) rather than in sR. */
    static constexpr bool kRInRegs = kWgmma && kHeadDim >= FAD_WG_R_REGS_MIN_D;
    /* Shared memory: sR (merged o, fp32, thread-private slots) unless
     * kRInRegs; sQ, which lives inside sR when Q is held in registers (the
     * first fold into sR waits until every warp has read Q); then 2 x (sK, sV). */
    static constexpr size_t kSmemR = kRInRegs ? 0 : (size_t)kBlockM * kHeadDim * 4;
    static constexpr size_t kSmemQ = kQInRegs && kSmemR > 0 ? 0 : (size_t)kBlockM * kHeadDim * 2;
    static constexpr size_t kSmemBytes = kSmemR + kSmemQ + (size_t)2 * kStageElems * 2;
    /* fwd_kernel's kGroups variant on sm_80: then the warps' X slot words
     * (fwd_tile.cuh, x_slot), one a warp */
    static constexpr size_t kSmemXAt = kSmemBytes;
    static constexpr size_t kSmemGroupsBytes = kSmemXAt + (size_t)kWarps * 4;
    static_assert(kHeadDim % 64 == 0, "swizzle needs 8 chunks per row");
    static_assert(!kWgmma || ((kHeadDim == 64 || kHeadDim == 128) && !kWide && kWarps % 4 == 0 &&
                              kSmemR % 1024 == 0 && kSmemQ % 1024 == 0),
                  "wgmma: whole warpgroups, 1024-byte aligned swz128 tiles");
    static_assert(FAD_SPLIT_QUANTUM % kBlockN == 0, "splits are whole tiles");
    static_assert(kSmemGroupsBytes <= 227 * 1024, "shared memory");
};

/* The end of a prefill row block, shared by fwd_kernel and fwd_ws_kernel.
 * This thread's rows are m0 + row0 + 8 r of the sequence; lse_row0 is the
 * flat row of its query 0; D the head dim; poison (a page outside the
 * cache) writes NaN. */

/* CTA-per-split schedule: the block's one split, index `split`, ends: its
 * state (m_s, quad-summed l_s, acc = o) goes to the workspace. */
template <int kMT, int kDB>
__device__ __forceinline__ void store_split_rows(const fwd_args &a, int D, int split, int64_t lse_row0,
                                                 int m0, int row0, int len_q,
                                                 const float (&acc)[kMT][kDB][4],
                                                 const float (&m_s)[2 * kMT],
                                                 const float (&l_s)[2 * kMT], bool poison)
{
    const size_t row_base = (size_t)split * fad_flat_rows(&a.p) + lse_row0 + m0;
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        const float nan = __int_as_float(0x7fffffff);
        const float l_row = poison ? nan : quad_sum(l_s[r]);
        const int row = row0 + 8 * r;
        if (m0 + row < len_q)
            store_partial_row(acc, r, poison ? nan : m_s[r], l_row, a.ws_o + (row_base + row) * D,
                              a.ws_ml + (row_base + row) * 2, D);
    }
}

/* Otherwise: the merged result R (acc after the last fold, mR, lR),
 * normalised (times dropout's rp), to out and lse of head h. */
template <typename T, int kMT, int kDB>
__device__ __forceinline__ void store_result_rows(const fad_fwd_params &p, int D, const fad_seq &seq,
                                                  int h, int64_t lse_row0, int m0, int row0, int len_q,
                                                  const float (&acc)[kMT][kDB][4],
                                                  const float (&mR)[2 * kMT],
                                                  const float (&lR)[2 * kMT], bool poison,
                                                  float rp = 1.f)
{
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++) {
        const int row = m0 + row0 + 8 * r;
        if (row < len_q)
            store_row(acc, r, mR[r], lR[r],
                      (T *)p.out + seq.o_off + (int64_t)row * p.out_row_stride + h * p.out_head_stride,
                      p.softmax_lse + lse_row0 + row, D, 0, p.softmax_lse != nullptr, poison, rp);
    }
}

/* The same, staged: this warp's 16 kMT rows of R (from row wrow0 of the
 * sequence on) normalised as store_row does it (acc times fad_out_scale,
 * rounded to T), staged in shared memory at stage (16 kMT x kHeadDim T,
 * stage_acc) and stored to out as whole 16-byte chunks (store_staged); lse as
 * store_row. The same values as store_result_rows, in 16-byte stores, a
 * warp's 512 consecutive bytes, where each of store_row's 4-byte stores
 * fills half a sector: 1.00-1.04x at D64-D128, 1.01-1.12x at D256 (H200,
 * fwd_ws_kernel). The caller has the stage to itself: only this warp reads or
 * writes it. (sm_90: stmatrix; before it, store_result_rows.)
 * o_map (the output's map, tma.cuh; a 1024-byte aligned stage): a warp slice
 * of 16 rows inside its sequence is staged in the map's boxes' layout and
 * stored by the copy engine, lane 0 issuing and waiting only until the stage
 * has been read. (fwd_ws_kernel at D128: 1.00-1.08x in same-run A/Bs, though
 * the consumers' store phase, stamped, is no shorter than with the threads'
 * stores: 1.1-1.3 us a CTA.) o_row0: the map row of the sequence's first
 * query. */
template <typename T, int kHeadDim, int kMT>
__device__ __forceinline__ void store_result_staged(const fad_fwd_params &p, int D, const fad_seq &seq, int h,
                                                    int64_t lse_row0, int wrow0, int len_q,
                                                    float (&acc)[kMT][kHeadDim / 8][4],
                                                    const float (&mR)[2 * kMT], const float (&lR)[2 * kMT],
                                                    bool poison, float rp, uint32_t stage, int lane,
                                                    const fad_tensor_map *o_map = nullptr, int64_t o_row0 = 0)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    float inv[2 * kMT];
#pragma unroll
    for (int r = 0; r < 2 * kMT; r++)
        inv[r] = poison ? __int_as_float(0x7fffffff) : fad_out_scale(lR[r], rp);
#pragma unroll
    for (int mt = 0; mt < kMT; mt++) {
#pragma unroll
        for (int nb = 0; nb < kHeadDim / 8; nb++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][nb][e] = FAD_MUL(acc[mt][nb][e], inv[2 * mt + e / 2]);
    }
    if (kMT == 1 && o_map && wrow0 + 16 <= len_q) {
        stage_acc<T, kHeadDim, kHeadDim / 8, 16>(acc[0], stage, 0, 0, lane);
        fence_async_smem(); /* (each lane's stmatrix writes, before the engine reads them) */
        __syncwarp();
        if (lane == 0) {
#pragma unroll
            for (int cb = 0; cb < kHeadDim / 64; cb++)
                tma_store_box(o_map, stage + (uint32_t)(cb * 16 * 128), cb * 64, h, (int)(o_row0 + wrow0));
            tma_store_wait_read();
        }
        __syncwarp();
    } else {
#pragma unroll
        for (int mt = 0; mt < kMT; mt++)
            stage_acc<T, kHeadDim, kHeadDim / 8>(acc[mt], stage, 16 * mt, 0, lane);
        __syncwarp();
        const uint32_t s[1] = {stage};
        T *const g[1] = {(T *)p.out + seq.o_off + (int64_t)wrow0 * p.out_row_stride + h * p.out_head_stride};
        const int64_t stride[1] = {p.out_row_stride};
        store_staged<T, kHeadDim, 16 * kMT, 32, 1>(s, g, stride, len_q - wrow0, D, lane);
    }
    if (p.softmax_lse && lane % 4 == 0)
#pragma unroll
        for (int r = 0; r < 2 * kMT; r++) { /* (row r of the thread: 8 r below its first) */
            const int row = wrow0 + lane / 4 + 8 * r;
            if (row < len_q)
                p.softmax_lse[lse_row0 + row] = poison ? inv[r] : fad_lse(mR[r], lR[r]);
        }
#else
    (void)stage, (void)o_map, (void)o_row0;
    store_result_rows<T>(p, D, seq, h, lse_row0, wrow0, lane / 4, len_q, acc, mR, lR, poison, rp);
#endif
}

#endif /* FAD_FWD_BLOCK_CUH */
