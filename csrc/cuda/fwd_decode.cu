/*
 * fwd_decode.cu — the packed kernel (fwd_packed_kernel) for short query blocks
 * such as decode: GQA heads packed into M, a deep cp.async pipeline; and its
 * launch. Shapes: as fwd_kernel (fwd_prefill_kernel.cuh's header).
 */
#include "fwd_block.cuh"

/* The packed kernel, for short query blocks (decode): one CTA per (sequence,
 * kv head, kBlockM packed rows [, split]; kRuns: [, run of splits], see
 * packed_walk). Packed row pr = i * G + g is query
 * row i of head hk * G + g (G = Hq / Hkv), so a kv head's K/V tiles are read
 * once for all the query heads of its group: a decode step (Sq = 1) is G rows
 * of one 16-row warp, where the prefill kernel would run G CTAs of kBlockM
 * rows with one valid row each. Few warps and a kStages-deep cp.async
 * pipeline, so each SM keeps enough bytes in flight for a memory-bound walk.
 *
 * Bits: a row walks the same kBlockN tiles (fwd_cfg's) in the same order,
 * split by split, through the same qk_tile / softmax_max / softmax_exp /
 * pv_tile / fold_split / store_* code as in fwd_kernel (here with S = Q K^T
 * one tile ahead, see the tile loop); only the row's address, its head and
 * its query index (mask, ALiBi position) are computed differently, and MMA
 * rows are independent. The
 * tiles a CTA walks beyond a row's own key range are fully masked for that
 * row, an exact identity (fad_math.h), as they are in the prefill kernel. */
/* Column warps for head dim d: the knob, halved until each warp owns whole
 * 16-column blocks of the output. */
constexpr int packed_col_warps(int d, int want)
{
    return want <= 1 ? 1 : (d / 16) % want == 0 ? want : packed_col_warps(d, want / 2);
}

template <int kHeadDim, bool kMod> struct packed_cfg {
    /* kRowWarps groups of 16 packed rows (FAD_PACKED_WARPS); each group is run
     * by kColWarps warps (FAD_PACKED_COL_WARPS) that split the output columns
     * and the S = Q K^T key blocks of a tile (kKeyParts = kColWarps parts). */
    static constexpr int kRowWarps = FAD_PACKED_WARPS;
    static constexpr int kColWarps = packed_col_warps(kHeadDim, FAD_PACKED_COL_WARPS);
    static constexpr int kWarps = kRowWarps * kColWarps;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kBlockM = kRowWarps * 16;
    static constexpr int kBlockN = fwd_cfg<kHeadDim>::kBlockN; /* the prefill kernel's walk */
    static constexpr int kColBlocks = kHeadDim / 16 / kColWarps; /* per warp */
    static constexpr int kDBlocks = 2 * kColBlocks;              /* n8 blocks per warp */
    static constexpr int kKeyParts = kColWarps;
    static constexpr int kKeyBlocks = kBlockN / 16 / kKeyParts; /* 16-key blocks of S per warp */
    static constexpr bool kQInRegs = FAD_PACKED_Q_IN_REGS && kHeadDim <= 128;
    static constexpr int kStageElems = 2 * kBlockN * kHeadDim; /* one K + one V tile */
    static constexpr size_t kSmemQ = (size_t)kBlockM * kHeadDim * 2;
    /* the S exchange, double-buffered: fp32 fragments of kBlockN keys per row group */
    static constexpr int kXchgFloats = kBlockN / 8 * 4 * 32; /* one row group's S */
    static constexpr size_t kSmemX = (size_t)2 * kRowWarps * kXchgFloats * 4;
    /* K/V stages: the knob, fewer where it would not fit in shared memory. */
    static constexpr int kStagesWant = kMod ? FAD_PACKED_STAGES_MOD : FAD_PACKED_STAGES;
    static constexpr size_t kStageBytes = (size_t)kStageElems * 2;
    static constexpr int kStagesFit = (int)((200 * 1024 - kSmemQ - kSmemX) / kStageBytes);
    static constexpr int kStages = kStagesWant < kStagesFit ? kStagesWant : kStagesFit;
    /* sQ; kStages x (sK, sV); 2 S exchanges. (The merged result R of a
     * one-CTA schedule lives in registers: a warp's R is its acc's columns.) */
    static constexpr size_t kSmemBytes = kSmemQ + (size_t)kStages * kStageBytes + kSmemX;
    static_assert(kStages >= 2, "at least double buffering");
    static_assert((kBlockN / 16) % kKeyParts == 0, "whole key blocks per part");
    static_assert(kRowWarps < 16, "named barriers 1 .. kRowWarps");
    static_assert(kBlockM * (kHeadDim / 8) % kThreads == 0, "whole Q chunks per thread");
    static_assert(kSmemBytes <= 227 * 1024, "shared memory");
};

/* The tiles a packed CTA walks, one after the other, as a cursor. Without
 * kRuns, tile_walk's [t_first, t_last): a one-CTA plan's every split of the
 * rows' keys (folded here), or a CTA-per-split plan's split_of_cta(). With
 * kRuns (a CTA-per-split plan whose grid has fewer split CTAs than splits,
 * launch_packed): the splits y, y + n, y + 2n, .. of the rows' keys (y =
 * split_of_cta(), n = the grid's split CTAs a row block), each split's tiles
 * by tile_walk's rule and each written as its own partial, so that the copy
 * pipeline runs on from one split into the next and the splits done are at
 * any time a prefix of the row's, as a polling combine folds them. Which CTA
 * walks a split changes none of its bits. */
template <int kBlockN, bool kRuns> struct packed_walk {
    int t, end;     /* the tile's first key, its segment's end (t >= end: walked) */
    int s, stride;  /* kRuns: the segment's split, and the splits between segments */
    int s_end, lo, hi, S; /* kRuns: the rows' splits [.., s_end), their keys [lo, hi) cut at len_k */

    __device__ __forceinline__ bool valid() const { return t < end; }
    /* kRuns: split `split`'s tiles within [lo, hi) (split_tiles, fwd_block.cuh) */
    __device__ __forceinline__ void enter(int split)
    {
        s = split;
        if (split >= s_end) {
            t = end = 0;
            return;
        }
        split_tiles<kBlockN>(split, split + 1, S, lo, hi, &t, &end);
    }
    __device__ __forceinline__ void next()
    {
        t += kBlockN;
        if (t >= end) {
            if constexpr (kRuns)
                enter(s + stride);
            else
                t = end = 0;
        }
    }
    /* kRuns: the segment is one of the CTA's last k (k >= 1; 1: its last) */
    __device__ __forceinline__ bool late_segment(int k) const { return s + k * stride >= s_end; }
    /* the rows' keys first.lo .. last.hi; false: nothing to write (tile_walk's
     * false, or no split of a run). (A one-CTA plan's empty walk, a row that
     * sees no key, is true: it still writes the row's empty result.) */
    __device__ __forceinline__ bool start(const fad_plan &plan, fad_key_range first, fad_key_range last,
                                          int len_k)
    {
        if constexpr (!kRuns) {
            return tile_walk<kBlockN>(plan, first, last, len_k, &t, &end);
        } else {
            S = plan.split_size;
            lo = first.lo;
            hi = min(last.hi, len_k);
            const fad_key_range keys = {first.lo, last.hi};
            const int s_begin = fad_first_split(keys, S);
            s_end = fad_end_split(keys, S);
            stride = (int)(gridDim.y * gridDim.z);
            int y = split_of_cta();
            if (y < s_begin) /* (a window: the rows' first split, rounded up to one of this CTA's) */
                y += (s_begin - y + stride - 1) / stride * stride;
            enter(y);
            return valid();
        }
    }
};

template <typename T, int kHeadDim, bool kMod, bool kPaged, bool kRuns>
__global__ void __launch_bounds__(packed_cfg<kHeadDim, kMod>::kThreads)
fwd_packed_kernel(const __grid_constant__ fwd_args a)
{
    /* Launched early itself (FAD_ATTN_PDL): nothing in global memory is read or
     * written before the kernel ahead of it in the stream is done (a no-op when
     * launched plainly). Only then may the combine start launching (it waits
     * for us, and reads our inputs before that). */
    pdl_wait_primary();
    /* a.ws_flag (a combine that polls): this CTA's flag is cleared before the
     * combine may launch, which is once every CTA of this grid has passed
     * pdl_launch_dependents, and set once its partials are written. */
    /* (the CTA's splits: split_of_cta() and every stride-th after it, below
     * the plan's last; packed_walk) */
    const int split_stride = (int)(gridDim.y * gridDim.z);
    auto flag_of = [&](int s) { return a.ws_flag + (size_t)s * gridDim.x + blockIdx.x; };
    if (a.ws_flag) {
        if (threadIdx.x == 0) {
            for (int s = split_of_cta(); s < a.plan.num_splits; s += split_stride)
                *flag_of(s) = 0;
            __threadfence();
        }
        __syncthreads();
    }
    /* (kRuns: once this CTA enters its second to last split, below. A
     * polling combine CTA resident beside a run from its start measured
     * 0.74-0.79x; launched at each run's last split, the combine met 256
     * splits of backlog at B1 128k and ended 10 us after the last run, at
     * the second to last 5 us.) */
    if constexpr (!kRuns)
        pdl_launch_dependents();
    using C = packed_cfg<kHeadDim, kMod>;
    constexpr int kMT = 1, kRows = 2, kBlockM = C::kBlockM, kBlockN = C::kBlockN;
    constexpr int kDB = C::kDBlocks, kStages = C::kStages, kColBlocks = C::kColBlocks;
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size;
    const int G = p.num_heads / p.num_heads_k;

    const int m_block = blockIdx.x % a.plan.m_blocks; /* (packed_cta_x, fwd_launch.h, inverted) */
    const int bh = blockIdx.x / a.plan.m_blocks;
    const int b = bh / p.num_heads_k, hk = bh % p.num_heads_k;
    const fad_seq seq = fad_get_seq(&p, b);
    const int len_q = seq.len_q, len_k = seq.len_k;
    const int n_rows = len_q * G; /* packed rows of (b, hk); the plan bounds seqlen_q * G */
    const int m0 = m_block * kBlockM;
    if (!seq.valid && p.cache_seqlens && !a.plan.cta_per_split) { /* (else the combine does it) */
        for (int pr = m0 + (int)threadIdx.x / 32; pr < m0 + kBlockM && pr < p.seqlen_q * G;
             pr += C::kThreads / 32)
            poison_row(p, seq, hk * G + pr % G, pr / G, threadIdx.x % 32, 32);
        return;
    }
    if (m0 >= n_rows)
        return;
    const int m_end = min(m0 + kBlockM, n_rows);

    /* Keys any row of this tile may see: its query rows are m0/G .. (m_end-1)/G. */
    const fad_key_range first_row = fad_row_keys(m0 / G, len_q, len_k, p.window_left, p.window_right);
    const fad_key_range last_row =
        fad_row_keys((m_end - 1) / G, len_q, len_k, p.window_left, p.window_right);
    const bool partial = a.plan.cta_per_split;
    packed_walk<kBlockN, kRuns> walk; /* the consumers' tile; the copies run kStages tiles ahead (load_walk) */
    if (!walk.start(a.plan, first_row, last_row, len_k))
        return; /* this CTA's splits are masked for every row: the combine skips them too */
    if constexpr (kRuns)
        if (walk.late_segment(1))
            pdl_launch_dependents();
    packed_walk<kBlockN, kRuns> load_walk = walk;
    int v_t = -1; /* the tile whose V the next group copies (-1: none) */

    extern __shared__ __align__(1024) unsigned char smem_raw[];
    T *sQ = reinterpret_cast<T *>(smem_raw);
    T *sK = reinterpret_cast<T *>(smem_raw + C::kSmemQ); /* stage s: + s * kStageElems */
    T *sV = sK + kBlockN * kHeadDim;
    float *sX = reinterpret_cast<float *>(smem_raw + C::kSmemQ + kStages * C::kStageBytes);

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    /* row group rw (16 packed rows), column part cw (output columns
     * [cw, cw + 1) * kColBlocks * 16, and key part cw of S when shared) */
    const int rw = warp % C::kRowWarps, cw = warp / C::kRowWarps;
    const int D = p.head_dim;
    const int64_t head_stride = fad_lse_head_stride(&p);
    const T *k_g = (const T *)p.k + seq.k_off + hk * p.k_head_stride;
    const T *v_g = (const T *)p.v + seq.v_off + hk * p.v_head_stride;

    /* This thread's rows: packed row m0 + row0 + 8r, r = 0, 1. A warp with no
     * valid row only helps with the loads. */
    const int row0 = rw * 16 + lane / 4;
    const bool warp_active = m0 + rw * 16 < m_end;
    rows_packed<kRows> rows;
#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int pr = m0 + row0 + 8 * r;
        rows.qrow_[r] = pr / G;
        rows.slope_[r] = fad_alibi_slope_log2(&p, b, hk * G + pr % G);
    }
    const int unmasked_lo = last_row.lo, unmasked_hi = first_row.hi;
    const fad_score_mod mod = fad_make_score_mod(p.softmax_scale, p.softcap, p.alibi_slopes != NULL);

    float mR[kRows], lR[kRows], oR[kMT][kDB][4] = {}; /* R: the splits folded so far */
    bool have_R = false;
    float acc[kMT][kDB][4] = {}, m_s[kRows], l_s[kRows];
#pragma unroll
    for (int r = 0; r < kRows; r++)
        mR[r] = m_s[r] = -INFINITY, lR[r] = l_s[r] = 0.f;
    int cur_split = -1;

    /* The pipeline. Tile j (the walk's j-th) lives in stage
     * j % kStages. The copies run K one tile ahead of V: commit group g holds
     * K(g) and V(g - 1) (and Q with K(0)), and iteration j commits group
     * j + kStages. Iteration j reads K(j + 1) and V(j), both in group j + 1.
     * S = Q K^T runs one tile ahead of the softmax: iteration j issues this
     * warp's key part of S(j + 1) between the two halves of tile j's softmax,
     * so those MMAs run under its exponentials and O += P V; the parts meet in
     * the S exchange sX[(j + 1) % 2] at iteration j + 1's barrier, the one
     * barrier per tile. Every operation is the one attend_tile does on the
     * same operands, in the same order per value: no bit changes. */
    bool bad_page = false; /* paged: this thread met a page outside the cache */
    int64_t v_src[kPaged ? kBlockN * (kHeadDim / 8) / C::kThreads : 1]; /* paged: V(g - 1)'s rows */
    const T *k_h = (const T *)p.k + hk * p.k_head_stride; /* paged: the cache at this kv head */
    const T *v_h = (const T *)p.v + hk * p.v_head_stride;
    /* stage offsets (elements) one tile on and one tile back */
    constexpr int kRing = kStages * C::kStageElems;
    auto next_stage = [](int st) { return st + C::kStageElems == kRing ? 0 : st + C::kStageElems; };
    auto prev_stage = [](int st) { return (st == 0 ? kRing : st) - C::kStageElems; };
    /* group g: V(g - 1) into stage st_v, K(g) into stage st_k; V first, since
     * a paged K(g) overwrites v_src. Called for g = 0, 1, .. in turn: tile g
     * is load_walk's, whose V the next group copies. */
    auto load_group = [&](int st_v, int st_k) {
        if (v_t >= 0) {
            const int t0 = v_t;
            if constexpr (kPaged)
                load_v_paged<T, kHeadDim, kBlockN, C::kThreads>(sV + st_v, v_h, v_src);
            else
                load_tile_lean<T, kHeadDim, kBlockN, C::kThreads>(
                    sV + st_v, v_g + (int64_t)t0 * p.v_row_stride, (int)p.v_row_stride, len_k - t0, D);
        }
        v_t = -1;
        if (load_walk.valid()) {
            const int t0 = v_t = load_walk.t;
            load_walk.next();
            if constexpr (kPaged)
                bad_page |= load_kv_paged<T, kHeadDim, kBlockN, C::kThreads>(
                    sK + st_k, nullptr, p, seq, k_h, v_h, t0, len_k - t0, D, &v_src);
            else
                load_tile_lean<T, kHeadDim, kBlockN, C::kThreads>(
                    sK + st_k, k_g + (int64_t)t0 * p.k_row_stride, (int)p.k_row_stride, len_k - t0, D);
        }
        cp_async_commit(); /* empty groups past the walk keep the count uniform */
    };

    /* Prologue: Q (row by row: each packed row has its own address) joins
     * group 0; groups 0 .. kStages - 1. */
    {
        constexpr int kChunks = kHeadDim / 8;
#pragma unroll
        for (int it = 0; it < kBlockM * kChunks / C::kThreads; it++) {
            const int c = tid + it * C::kThreads;
            const int row = c / kChunks, col = (c % kChunks) * 8, pr = m0 + row;
            const bool ok = pr < m_end && col < D;
            const T *src = (const T *)p.q;
            if (ok)
                src += seq.q_off + (int64_t)(pr / G) * p.q_row_stride +
                       (int64_t)(hk * G + pr % G) * p.q_head_stride + col;
            cp_async16(sQ + swz<kHeadDim>(row, col), src, ok ? 16 : 0);
        }
    }
#pragma unroll
    for (int g = 0; g < kStages; g++)
        load_group((g == 0 ? kStages - 1 : g - 1) * C::kStageElems, g * C::kStageElems);

    uint32_t qf[kMT][C::kQInRegs ? kHeadDim / 16 : 1][4];
    const lds_base<kHeadDim> q_lds(sQ, rw * 16 + lane % 16, lane / 16);
    const lds_base<kHeadDim> k_lds0(sK, lane % 8 + (lane / 16) * 8, (lane / 8) % 2);
    const lds_base<kHeadDim> v_lds0 =
        lds_cols<kHeadDim>(sV, lane % 8 + ((lane / 8) % 2) * 8, lane / 16, cw * kColBlocks);
    /* this row group's two S exchanges; this warp's part starts at key block kp0 */
    float *const xchg0 = sX + rw * C::kXchgFloats;
    float *const xchg1 = sX + (C::kRowWarps + rw) * C::kXchgFloats;
    constexpr int kNB = kBlockN / 8, kJ = C::kKeyBlocks;
    const int kp0 = cw * kJ;
    /* this warp's part of S = Q K^T (sp zeroed) for the K tile in stage st */
    auto qk_part = [&](float (&sp)[kMT][2 * kJ][4], int st) {
        qk_tile<T, kHeadDim, kMT, kJ, C::kQInRegs>(sp, qf, q_lds, k_lds0.reload(st * 2), kp0 * 16);
    };
    auto publish = [&](const float (&sp)[kMT][2 * kJ][4], float *xchg) {
#pragma unroll
        for (int mt = 0; mt < kMT; mt++)
#pragma unroll
            for (int nb = 0; nb < 2 * kJ; nb++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    xchg[((mt * kNB + 2 * kp0 + nb) * 4 + e) * 32 + lane] = sp[mt][nb][e];
    };

    cp_async_wait<kStages - 1>(); /* group 0: Q and K(0) (this thread's copies) */
    __syncthreads();              /* ... everyone's */
    if (warp_active) {
        if constexpr (C::kQInRegs)
#pragma unroll
            for (int kk = 0; kk < kHeadDim / 16; kk++)
                ldmatrix_x4(qf[0][C::kQInRegs ? kk : 0], q_lds.at(0, kk));
        float sp[kMT][2 * kJ][4] = {};
        qk_part(sp, 0);
        publish(sp, xchg0);
        cur_split = fad_split_of(walk.t, S);
        start_split(acc, m_s, l_s);
    }

    /* (partial) split s's (m, l, o) out by flat row, then, where the combine
     * polls, its flag (every warp's partials first; warp_active is
     * CTA-uniform) */
    auto emit_partial = [&](int s, bool poison) {
        const size_t split_base = (size_t)s * fad_flat_rows(&p);
#pragma unroll
        for (int r = 0; r < kRows; r++) {
            const float nan = __int_as_float(0x7fffffff);
            const float l_row = poison ? nan : quad_sum(l_s[r]);
            const int pr = m0 + row0 + 8 * r;
            if (pr < m_end) {
                const size_t row = split_base + seq.row0 + (hk * G + pr % G) * head_stride + pr / G;
                store_partial_row(acc, r, poison ? nan : m_s[r], l_row, a.ws_o + row * D,
                                  a.ws_ml + row * 2, D,
                                  cw * kColBlocks * 16, cw == 0);
            }
        }
        if (a.ws_flag) {
            /* The CTA barrier orders every thread's partial stores before
             * thread 0's release, which is cumulative: a combine that
             * acquires the flag sees them all (PTX memory model; no fence in
             * every thread, which a run paid at each split: B1 32k-128k
             * 1.02-1.025x without it). */
            static_assert(C::kRowWarps == 1, "every warp of the CTA reaches the flag");
            __syncthreads();
            if (threadIdx.x == 0)
                st_release_gpu(flag_of(s), 1);
        }
    };

    int st = 0; /* tile j's stage */
#pragma unroll 1
    for (int j = 0; walk.valid(); j++) {
        const int t0 = walk.t, st_next = next_stage(st);
        packed_walk<kBlockN, kRuns> next = walk;
        next.next();
        cp_async_wait<kStages - 2>(); /* group j + 1: K(j + 1), V(j) (this thread's copies) */
        __syncthreads(); /* ... everyone's; S(j) is whole; K(j)'s and V(j - 1)'s stages are free */
        load_group(prev_stage(st), st); /* group j + kStages */

        if (warp_active) {
            float s[kMT][kNB][4];
            const float *xchg = j % 2 ? xchg1 : xchg0;
#pragma unroll
            for (int mt = 0; mt < kMT; mt++)
#pragma unroll
                for (int nb = 0; nb < kNB; nb++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        s[mt][nb][e] = xchg[((mt * kNB + nb) * 4 + e) * 32 + lane];
            float m_tile[kRows];
            softmax_max<kMod>(s, m_tile, t0 < unmasked_lo || t0 + kBlockN > unmasked_hi, mod, rows,
                              t0, len_q, len_k, p.window_left, p.window_right);
            /* S(j + 1), branch-free so that it shares softmax_exp's basic
             * block; on the last tile it recomputes S(j) from K(j) (intact:
             * no copy follows it) into the exchange nobody reads. */
            const bool has_next = next.valid();
            float sp[kMT][2 * kJ][4] = {};
            qk_part(sp, has_next ? st_next : st);
            softmax_exp<false>(s, acc, m_s, l_s, m_tile, mod);
            pv_tile<T, kBlockN, kMT, kColBlocks>(acc, s, v_lds0.reload(st * 2));
            publish(sp, j % 2 ? xchg0 : xchg1);
            /* the next tile starts a split: fold this one into R (kRuns:
             * write it out; a run's segments are its splits), fresh state */
            if (has_next && (kRuns ? next.t >= walk.end : fad_split_of(next.t, S) != cur_split)) {
                if constexpr (kRuns) {
                    emit_partial(cur_split, false);
                    if (next.late_segment(FAD_PACKED_RUN_LAUNCH_SEGMENTS))
                        pdl_launch_dependents();
                    cur_split = next.s;
                } else {
                    fold_split(acc, m_s, l_s, mR, lR, r_in_regs<kMT, kDB>{oR}, have_R, true);
                    cur_split = fad_split_of(next.t, S);
                }
                start_split(acc, m_s, l_s);
            }
        }
        walk = next;
        st = st_next;
    }
    cp_async_wait_all();
    /* a page outside the cache: every row of the CTA gets NaN (CTA-uniform branch) */
    const bool poison = kPaged ? __syncthreads_or(bad_page) != 0 : false;
    if (!warp_active)
        return;

    if (partial) { /* the CTA's last split ends */
        if (cur_split >= 0)
            emit_partial(cur_split, poison);
        return;
    }
    if (cur_split >= 0)
        fold_split(acc, m_s, l_s, mR, lR, r_in_regs<kMT, kDB>{oR}, have_R, false);

#pragma unroll
    for (int r = 0; r < kRows; r++) {
        const int pr = m0 + row0 + 8 * r;
        if (pr < m_end) {
            const int i = pr / G, h = hk * G + pr % G;
            store_row(acc, r, mR[r], lR[r],
                      (T *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride,
                      p.softmax_lse + seq.row0 + h * head_stride + i, D, cw * kColBlocks * 16,
                      cw == 0 && p.softmax_lse, poison);
        }
    }
}

/* The runs a packed plan gets (launch() asks before the combine's flags): a
 * one-sequence CTA-per-split plan (packed_runs_shape) whose split CTAs fill
 * more than a wave walks runs of splits (packed_walk), a row block's split
 * CTAs numbering floor(wave / row blocks), so that the grid is one wave and
 * no CTA's copies drain and start again at each split. Only where that leaves
 * a row block at least FAD_PACKED_RUN_MIN_CTAS of them (else the CTA per
 * split, whose waves the SMs take as they free). (Not paged: a page outside
 * the cache poisons the partial of the split whose tiles met it, and the K
 * copies run tiles ahead of the consumers.) */
template <typename T, int kHeadDim, bool kMod, bool kPaged>
fad_status packed_run_ctas(const fwd_args &a, int *ctas, char *msg, size_t msg_len)
{
    *ctas = 0;
    if constexpr (!kMod && !kPaged) {
        using C = packed_cfg<kHeadDim, kMod>;
        if (!packed_runs_shape(a))
            return FAD_OK;
        static int per_sm[FAD_MAX_DEVICES]; /* CTAs an SM, asked once per device */
        int dev = 0, sms = 0;
        const fad_status st = fad_cuda_num_sms(&sms, msg, msg_len);
        if (st != FAD_OK)
            return st;
        CUDA_TRY(cudaGetDevice(&dev));
        if (!per_sm[dev])
            CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &per_sm[dev], fwd_packed_kernel<T, kHeadDim, kMod, kPaged, false>, C::kThreads, C::kSmemBytes));
        const int64_t wave = (int64_t)sms * max(per_sm[dev], 1), x = packed_grid_x(a), n = a.plan.num_splits;
        const int64_t groups = wave / x;
        if (x * n > wave && groups >= FAD_PACKED_RUN_MIN_CTAS && groups < n)
            *ctas = (int)groups;
    }
    return FAD_OK;
}

/* One CTA per (sequence, kv head, kBlockM packed rows [, split or run of
 * splits: a.run_ctas]), launched as a programmatic dependent of the kernel
 * before it (FAD_ATTN_PDL). */
template <typename T, int kHeadDim, bool kMod, bool kPaged>
fad_status launch_packed(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    const fad_plan &plan = a.plan;
    using C = packed_cfg<kHeadDim, kMod>;
    /* (runs: neither softcap/ALiBi nor pages, packed_run_ctas) */
    constexpr bool kHasRuns = !kMod && !kPaged;
    static int smem_set[2][FAD_MAX_DEVICES];
    fad_status st = allow_smem(fwd_packed_kernel<T, kHeadDim, kMod, kPaged, false>, smem_set[0], C::kSmemBytes,
                               msg, msg_len);
    if (st != FAD_OK)
        return st;
    if constexpr (kHasRuns) {
        st = allow_smem(fwd_packed_kernel<T, kHeadDim, kMod, kPaged, kHasRuns>, smem_set[1], C::kSmemBytes, msg,
                        msg_len);
        if (st != FAD_OK)
            return st;
    }
    if (C::kBlockM != fad_packed_block_m()) /* the plan's m_blocks assume this tile */
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: packed tile rows %d != plan's %d",
                        C::kBlockM, fad_packed_block_m());
    if (a.run_ctas && !kHasRuns)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: runs of splits in a paged or score-mod call");
    const dim3 grid = split_grid(packed_grid_x(a), plan, a.run_ctas);
    if (a.run_ctas)
        return launch_kernel(fwd_packed_kernel<T, kHeadDim, kMod, kPaged, kHasRuns>, grid, C::kThreads,
                             C::kSmemBytes, stream, FAD_ATTN_PDL, a, msg, msg_len);
    return launch_kernel(fwd_packed_kernel<T, kHeadDim, kMod, kPaged, false>, grid, C::kThreads, C::kSmemBytes,
                         stream, FAD_ATTN_PDL, a, msg, msg_len);
}

#define FAD_INST(T, D, MOD, PAGED) \
    template fad_status launch_packed<T, D, MOD, PAGED>(const fwd_args &, cudaStream_t, char *, size_t); \
    template fad_status packed_run_ctas<T, D, MOD, PAGED>(const fwd_args &, int *, char *, size_t);
FAD_FWD_VARIANTS(FAD_INST)
