/*
 * fwd_combine.cu — the combine kernel of the CTA-per-split schedule: folds a
 * row's split partials left to right with fad_merge_* (fad_math.h), in groups
 * of FAD_MERGE_GROUP then the groups' results: within one group the fold a
 * one-CTA schedule runs (fold_split), so both give the same bits; rows of more
 * splits are planned here alone (fad_make_plan); and its launch.
 */
#include <type_traits>

#include "fwd_block.cuh"

/* Shapes: ws_ml (num_splits, flat rows, 2) fp32 (m, l) and ws_o (num_splits,
 * flat rows, D) fp32 o of each split's partial state (a row's splits that its
 * keys never reach are not read); out / softmax_lse as in fad_fwd_params.
 * kParts warps share a query row, each folding a 1/kParts slice of its
 * columns (kParts = 1: 4 rows per CTA, one per warp; kParts = 4: one row per
 * CTA, for short queries such as decode, where the fold's memory round trip
 * is the whole cost and fewer loads per lane shorten it). Every warp of a row
 * computes the same (m, l) chain, and each column's chain is the same
 * operations in the same split order, so kParts changes no bit. */
template <int kHeadDim, int kParts> struct combine_cfg {
    static constexpr int kC = (kHeadDim + 32 * kParts - 1) / (32 * kParts); /* columns per lane */
    /* kStaged (kParts 4, decode): each warp streams its row's partials through
     * shared memory, kChunk splits a cp.async group, kStages groups in flight
     * (FAD_COMBINE_STAGES: 2, 64 splits), in place of two register batches of
     * kBatch (32 splits), whose 64-bit index math and live tests per split made the fold
     * instruction-bound: at decode B1 131k (256 splits a row) 21.3 us against
     * 11.4 staged (fast mode's 32 splits: 5.3; Nsight Compute, L2 warm;
     * docs/design.md, "combine-staged"). A stage holds 4
     * floats a split holding its (m, l) pair, then its o values, split by
     * split, kC x 32 a split (this warp's columns, lane-contiguous). */
    static constexpr bool kStaged = kParts == 4 && FAD_COMBINE_STAGED;
    /* the register path's batch (2 x kBatch x (kC + 2) registers) */
    static constexpr int kBatch = kC <= 1 ? 16 : kC <= 4 ? 8 : 4;
    /* Whether a launch over num_splits splits runs the staged kernel: only
     * rows of more than two register batches take its staged path (one
     * partial chunk's wait made decode B1 8k 2% slower), and a launch none
     * of whose rows is longer runs the kernel without it (no staged code, no
     * shared memory: the staged code beside the register path made B1 8k
     * 3-4% slower). */
    static constexpr bool staged(int num_splits) { return kStaged && num_splits > 2 * kBatch; }
    static constexpr int kChunk = 32, kStages = FAD_COMBINE_STAGES;
    static constexpr int kStageFloats = kChunk * (4 + kC * 32);
    static constexpr size_t kSmemBytes = (size_t)4 * kStages * kStageFloats * sizeof(float);
};

/* kHeadDim: the variant's bound on D. kGroups: the plan's rows may have more
 * than FAD_MERGE_GROUP splits (the two-level order below); without it the
 * kernel is the one chain's code alone, so that an ordinary call's combine
 * carries no group logic. */
template <typename T, int kHeadDim, int kParts, bool kStaged, bool kGroups>
__global__ void __launch_bounds__(128, 1) combine_kernel(const __grid_constant__ fwd_args a)
{
    using ops = dtype_ops<T>;
    using C = combine_cfg<kHeadDim, kParts>;
    constexpr int kRowsPerCta = 4 / kParts;
    constexpr int kC = C::kC;
    const fad_fwd_params &p = a.p;
    const int S = a.plan.split_size, D = p.head_dim, lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32, part = warp % kParts;
    const int q_blocks = (p.seqlen_q + kRowsPerCta - 1) / kRowsPerCta; /* row blocks per (batch, head) */
    const int bh = blockIdx.x / q_blocks, b = bh / p.num_heads, h = bh % p.num_heads;
    const int i = (blockIdx.x % q_blocks) * kRowsPerCta + warp / kParts; /* query row of sequence b */
    /* Launched early (FAD_COMBINE_PDL), it may read the call's inputs before
     * pdl_wait_primary (the attention kernel lets it launch only once its own
     * predecessor is done) but not the partials; and every CTA waits before
     * it ends, so that this grid never ends before the attention kernel. */
    const fad_seq seq = fad_get_seq(&p, b);
    if (!seq.valid && p.cache_seqlens) {
        pdl_wait_primary();
        if (part == 0)
            poison_row(p, seq, h, i, lane, 32);
        return;
    }
    /* polls (a.ws_flag, staged kernel only): the staged rows fold each chunk
     * of splits as soon as the packed kernel's split CTAs have flagged it
     * done, while later splits still run; every other row, and every CTA
     * before it ends, waits for the whole grid. */
    const bool polls = kStaged && a.ws_flag;
    if (!polls)
        pdl_wait_primary();
    pdl_launch_dependents(); /* the next call's attention kernel, if launched early */
    if (i >= seq.len_q) {
        pdl_wait_primary();
        return;
    }
    const int64_t row = seq.row0 + h * fad_lse_head_stride(&p) + i; /* flat row */
    const size_t split_stride = (size_t)fad_flat_rows(&p);

    fad_key_range r = fad_row_keys(i, seq.len_q, seq.len_k, p.window_left, p.window_right);
    float m = -INFINITY, l = 0.f, o[kC];
    int col[kC]; /* this lane's columns */
#pragma unroll
    for (int c = 0; c < kC; c++)
        o[c] = 0.f, col[c] = (part * kC + c) * 32 + lane;
    const int s_end = fad_end_split(r, S);
    bool poison = false; /* a split CTA met a page outside the cache: (m, l) = NaN */
    /* The fold is a chain, its loads are not: each batch of kBatch splits is
     * fetched at once (one memory round trip per batch rather than per split;
     * with few rows, as at decode, this kernel is latency-bound), and the next
     * batch's fetch is issued before this batch is merged (two register sets,
     * A and B), so at long context the round trips overlap the merges. The
     * merges run in split order exactly as before. */
    constexpr int kBatch = C::kBatch;
    auto fetch = [&](float2 (&ml)[kBatch], float (&ov)[kBatch][kC], int s0) {
#pragma unroll
        for (int u = 0; u < kBatch; u++) {
            const size_t idx = (size_t)(s0 + u) * split_stride + row;
            const bool live = s0 + u < s_end;
            ml[u] = live ? *reinterpret_cast<const float2 *>(a.ws_ml + idx * 2) : make_float2(0.f, 0.f);
#pragma unroll
            for (int c = 0; c < kC; c++)
                ov[u][c] = live && col[c] < D ? a.ws_o[idx * D + col[c]] : 0.f;
        }
    };
    /* A split past the row's last is skipped with selects, not a branch: with
     * the batch in one basic block the (m) chain runs ahead while the
     * exponentials and the (l, o) updates of earlier splits trail behind it.
     * (A merge with an empty state is no identity: it would turn a -0 into
     * +0.) Columns past D are merged too, from zeros, and never stored. */
    auto merge_one = [&](float2 ml, const float (&ov)[kC], bool live) {
        /* paged only: NaN inputs stay as before */
        poison |= live && p.block_table && ml.y != ml.y;
        const fad_merge_w w = fad_merge_weights(m, ml.x);
#pragma unroll
        for (int c = 0; c < kC; c++) {
            const float v = fad_merge_value(o[c], ov[c], w);
            o[c] = live ? v : o[c];
        }
        const float lv = fad_merge_value(l, ml.y, w);
        l = live ? lv : l;
        m = live ? w.m : m;
    };
    /* The two-level order (fad_math.h, FAD_MERGE_GROUP): (m, l, o) is the
     * current group's chain, X the groups' before it. A run of splits from s0
     * (a batch or a chunk, at most 32) holds at most one group's last split,
     * g_last; where the row's splits go on past it, the run is merged split
     * by split with the group closed after g_last (a branch once per
     * FAD_MERGE_GROUP splits), else as before. X lives in shared memory, this
     * lane's o (xs[c]), l (xs[kC]) and m (xs[kC + 1]): in registers its
     * kC + 2 values were held through the whole fold (ptxas -v: up to 17 more
     * registers), for a close once per FAD_MERGE_GROUP splits. m is -inf
     * (X empty) until the first close. (!kGroups: no X, no close.) */
    float(*xs)[32] = nullptr;
    if constexpr (kGroups) {
        __shared__ float x_smem[4][kC + 2][32];
        xs = x_smem[warp];
        xs[kC + 1][lane] = -INFINITY;
    }
    /* X (+) R, value by value: put(c, v) gets o[c] (c < kC), then l (kC), then m (kC + 1) */
    auto outer = [&](auto &&put) {
        const fad_outer_w w = fad_outer_weights(xs[kC + 1][lane], m);
#pragma unroll
        for (int c = 0; c < kC; c++)
            put(c, fad_outer_value(xs[c][lane], o[c], w));
        put(kC, fad_outer_value(xs[kC][lane], l, w));
        put(kC + 1, w.w.m);
    };
    auto close_group = [&]() { /* X <- X (+) R, R empty */
        outer([&](int c, float v) { xs[c][lane] = v; });
        m = -INFINITY, l = 0.f;
#pragma unroll
        for (int c = 0; c < kC; c++)
            o[c] = 0.f;
    };
    auto closes_in = [&](int s0, int n) { /* g_last in [s0, s0 + n), splits past it */
        const int g_last = fad_group_last(s0);
        return g_last < s0 + n && g_last + 1 < s_end;
    };
    int s0 = fad_first_split(r, S);
    bool staged_row = false; /* (kStaged: the row takes the staged path) */
    if constexpr (kStaged) {
        staged_row = s_end - s0 > 2 * kBatch;
        if (staged_row) {
            /* Chunk ch (splits s0 + ch kChunk ..) goes to stage ch % kStages of
             * this warp's ring; splits past s_end are zero-filled, the values the
             * register path merges for them. One commit group per chunk, empty
             * ones past the last, so that cp_async_wait counts whole chunks. */
            extern __shared__ __align__(16) unsigned char combine_smem[];
            float *ring = reinterpret_cast<float *>(combine_smem) + warp * C::kStages * C::kStageFloats;
            const int n_chunks = s0 < s_end ? (s_end - s0 + C::kChunk - 1) / C::kChunk : 0;
            /* (Lean per split, since the fold is instruction-bound, ~2 cycles an
             * instruction with one warp a scheduler: a pointer stepped split by
             * split, and the live tests only in a row's last, partial chunk.) */
            const size_t o_step = split_stride * (size_t)D; /* floats from one split's row to the next's */
            /* Chunk copies go to L2 only (cp.async.cg, 16 bytes): a chunk the
             * combine polls for is read while other split CTAs still write
             * lines it shares (the (m, l) of other rows, o rows where D is not
             * a multiple of 32), so no stale line may sit in L1. (m, l): lane
             * u copies the aligned pair of (m, l) pairs holding split c0 + u's
             * (ws_ml is 256-byte aligned, a split's rows start at an even or
             * odd pair by split_stride's parity), into 4 floats of the stage.
             * o: 16 bytes a copy, 8 lanes a 32-column block of one split,
             * 4 splits an instruction; blocks past D are zero-filled (D is a
             * multiple of 8). */
            const int sub = lane % 8, u_off = lane / 8;
            auto issue = [&](int ch) {
                if (ch < n_chunks) {
                    float *st = ring + (ch % C::kStages) * C::kStageFloats;
                    const int c0 = s0 + ch * C::kChunk, n_live = min(s_end - c0, C::kChunk);
                    static_assert(C::kChunk == 32, "one (m, l) pair a lane");
                    const bool live = lane < n_live;
                    const size_t ml_at = live ? (((size_t)(c0 + lane) * split_stride + row) & ~(size_t)1) * 2 : 0;
                    cp_async16(st + 4 * lane, a.ws_ml + ml_at, live ? 16 : 0);
#pragma unroll
                    for (int c = 0; c < kC; c++) {
                        const int col4 = (part * kC + c) * 32 + 4 * sub;
                        const float *src = a.ws_o + ((size_t)(c0 + u_off) * split_stride + row) * D + col4;
                        float *dst = st + 4 * C::kChunk + (u_off * kC + c) * 32 + 4 * sub;
                        if (n_live == C::kChunk && col4 < D) {
#pragma unroll
                            for (int j = 0; j < C::kChunk / 4; j++, src += 4 * o_step)
                                cp_async16(dst + 4 * j * kC * 32, src, 16);
                        } else {
#pragma unroll
                            for (int j = 0; j < C::kChunk / 4; j++, src += 4 * o_step) {
                                const bool ok = 4 * j + u_off < n_live && col4 < D;
                                cp_async16(dst + 4 * j * kC * 32, ok ? src : a.ws_o, ok ? 16 : 0);
                            }
                        }
                    }
                }
                cp_async_commit();
            };
            /* Split c0 + u's (m, l) is the half (c0 + u) split_stride + row
             * (mod 2) of slot u: one half for every even u, the same or the
             * other for every odd u (split_stride's parity). */
            const int stride_odd = (int)(split_stride & 1);
            /* polls: chunk k is issued once the split CTAs of all its splits
             * have flagged (one acquiring load a lane, a warp vote, then
             * the warp's barrier, so that each lane's copies come after every
             * lane's acquire); the flags of the chunks next in line are
             * loaded before a chunk's merges and read after them, so the
             * round trip runs under the merges. Chunks ch + 1 ..
             * ch + kStages may be in flight once chunk ch is merged. */
            const int G = p.num_heads / p.num_heads_k;
            const int *flags = polls ? a.ws_flag + packed_cta_x(a, b, h / G, i * G + h % G) : nullptr;
            const size_t flag_step = (size_t)packed_grid_x(a); /* split s's flag: + s flag_step */
            int issued = 0;                /* chunks issued (polls) */
            int fv[C::kStages];            /* flags of chunks issued + k, loaded ahead */
            auto load_flags = [&](int limit) {
#pragma unroll
                for (int k = 0; k < C::kStages; k++) {
                    const int sp = s0 + (issued + k) * C::kChunk + lane;
                    fv[k] = issued + k < limit && sp < s_end ? ld_acquire_gpu(flags + (size_t)sp * flag_step)
                                                             : (issued + k < limit ? 1 : 0);
                }
            };
            auto issue_ready = [&]() { /* the ready prefix of the chunks loaded */
                int n = 0;
#pragma unroll
                for (int k = 0; k < C::kStages; k++)
                    n += __all_sync(0xffffffffu, fv[k] != 0) && n == k;
                if (n) {
                    __syncwarp(); /* (every lane's acquire before any lane's copies) */
                    for (int k = 0; k < n; k++)
                        issue(issued++);
                }
            };
            auto wait_chunk = [&](int ch) { /* spins until chunk ch is issued */
                while (issued <= ch) {
                    load_flags(min(n_chunks, ch + C::kStages));
                    issue_ready();
                    if (issued <= ch)
                        __nanosleep(256);
                }
            };
            if (polls) {
                if (n_chunks > 0)
                    wait_chunk(0);
            } else {
                for (int ch = 0; ch < C::kStages - 1; ch++)
                    issue(ch);
            }
            for (int ch = 0; ch < n_chunks; ch++) {
                if (polls) {
                    load_flags(min(n_chunks, ch + 1 + C::kStages));
                    switch (issued - ch - 1) { /* chunk ch (this lane's copies) */
                    case 0: cp_async_wait<0>(); break;
                    case 1: cp_async_wait<1>(); break;
                    case 2: cp_async_wait<2>(); break;
                    default: cp_async_wait<3>(); break;
                    }
                    static_assert(C::kStages >= 2 && C::kStages <= 4, "the waits above");
                } else {
                    issue(ch + C::kStages - 1);
                    cp_async_wait<C::kStages - 1>(); /* chunk ch (this lane's copies) */
                }
                __syncwarp();                    /* (and the other lanes') */
                const float *st = ring + (ch % C::kStages) * C::kStageFloats;
                const int c0 = s0 + ch * C::kChunk;
                const int h0 = (int)(((size_t)c0 * split_stride + row) & 1); /* slot 0's half */
                const float *ml_even = st + 2 * h0, *ml_odd = st + 2 * (h0 ^ stride_odd);
                auto split_ov = [&](int u, float(&ov)[kC]) { /* split c0 + u's o from the stage */
#pragma unroll
                    for (int c = 0; c < kC; c++)
                        ov[c] = st[4 * C::kChunk + (u * kC + c) * 32 + lane];
                };
                auto split_ml = [&](int u) { return *reinterpret_cast<const float2 *>((u % 2 ? ml_odd : ml_even) + 4 * u); };
                auto merge_chunk = [&](auto all_live) {
#pragma unroll
                    for (int u = 0; u < C::kChunk; u++) {
                        float ov[kC];
                        split_ov(u, ov);
                        merge_one(split_ml(u), ov, all_live || c0 + u < s_end);
                    }
                };
                /* (a chunk that closes a group: its own loop, so that the
                 * chunks' loop above is the one chain's code) */
                auto merge_chunk_closing = [&]() {
                    const int g_last = fad_group_last(c0);
#pragma unroll
                    for (int u = 0; u < C::kChunk; u++) {
                        float ov[kC];
                        split_ov(u, ov);
                        merge_one(split_ml(u), ov, c0 + u < s_end);
                        if (c0 + u == g_last)
                            close_group();
                    }
                };
                if (kGroups && closes_in(c0, C::kChunk))
                    merge_chunk_closing();
                else if (c0 + C::kChunk <= s_end)
                    merge_chunk(std::true_type{});
                else
                    merge_chunk(std::false_type{});
                __syncwarp(); /* every lane has read the stage before it is refilled */
                if (polls && ch + 1 < n_chunks) {
                    issue_ready();
                    wait_chunk(ch + 1);
                }
            }
        }
    }
    if (!staged_row) {
        if (polls)
            pdl_wait_primary();
        float2 ml_a[kBatch], ml_b[kBatch];
        float ov_a[kBatch][kC], ov_b[kBatch][kC];
        auto merge = [&](const float2 (&ml)[kBatch], const float (&ov)[kBatch][kC], int s0) {
            if constexpr (kGroups)
                if (closes_in(s0, kBatch)) {
                    const int g_last = fad_group_last(s0);
#pragma unroll
                    for (int u = 0; u < kBatch; u++) {
                        merge_one(ml[u], ov[u], s0 + u < s_end);
                        if (s0 + u == g_last)
                            close_group();
                    }
                    return;
                }
#pragma unroll
            for (int u = 0; u < kBatch; u++)
                merge_one(ml[u], ov[u], s0 + u < s_end);
        };
        if (s0 < s_end)
            fetch(ml_a, ov_a, s0);
        for (; s0 < s_end; s0 += 2 * kBatch) {
            if (s0 + kBatch < s_end)
                fetch(ml_b, ov_b, s0 + kBatch);
            merge(ml_a, ov_a, s0);
            if (s0 + kBatch >= s_end)
                break;
            if (s0 + 2 * kBatch < s_end)
                fetch(ml_a, ov_a, s0 + 2 * kBatch);
            merge(ml_b, ov_b, s0 + kBatch);
        }
    }
    if constexpr (kGroups)
        if (xs[kC + 1][lane] != -INFINITY) /* (the row's splits spanned groups: R <- X (+) R) */
            outer([&](int c, float v) { (c < kC ? o[c] : c == kC ? l : m) = v; });
    const float inv = poison ? __int_as_float(0x7fffffff) : fad_out_scale(l, fad_dropout_rp(p.dropout_p));
    T *out = (T *)p.out + seq.o_off + (int64_t)i * p.out_row_stride + h * p.out_head_stride;
#pragma unroll
    for (int c = 0; c < kC; c++)
        if (col[c] < D) {
            uint32_t two = ops::pack(FAD_MUL(o[c], inv), 0.f);
            out[col[c]] = *reinterpret_cast<T *>(&two);
        }
    if (lane == 0 && part == 0 && p.softmax_lse)
        p.softmax_lse[row] = poison ? inv : fad_lse(m, l);
    if (polls)
        pdl_wait_primary(); /* (this grid never ends before the attention kernel) */
}

template <int kHeadDim> bool combine_polls(const fwd_args &a)
{
    return FAD_COMBINE_POLL && a.plan.packed && a.plan.cta_per_split && FAD_COMBINE_BY_COLS &&
           a.p.seqlen_q < 4 && combine_cfg<kHeadDim, 4>::staged(a.plan.num_splits) &&
           a.plan.num_splits > (a.run_ctas ? FAD_COMBINE_POLL_MIN_SPLITS_RUNS : FAD_COMBINE_POLL_MIN_SPLITS);
}

/* CTA-per-split schedule: the combine kernel, for every (batch, head, query
 * row), whichever kernel wrote the partials: 4 rows per block, one warp each,
 * or for fewer than 4 query rows one row per block, its columns split over
 * the 4 warps (decode).
 * On sm_90 it is launched as a programmatic dependent of the attention kernel
 * (FAD_COMBINE_PDL): its CTAs launch while the last split CTAs still run and
 * wait in griddepcontrol.wait, so the gap between the two kernels (a few us
 * at decode, where the attention kernel itself takes ~12) is hidden. Bits:
 * the same kernel reads the same complete partials. */
template <typename T, int kHeadDim>
fad_status launch_combine(const fwd_args &a, cudaStream_t stream, char *msg, size_t msg_len)
{
    if (!a.plan.cta_per_split)
        return FAD_OK;
    /* Short queries (decode): the 4 warps of a CTA share one row's columns. */
    const bool by_cols = FAD_COMBINE_BY_COLS && a.p.seqlen_q < 4;
    if (a.ws_flag && !combine_polls<kHeadDim>(a))
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "internal: ready flags for a combine that does not poll");
    const int64_t blocks = combine_grid_x(a); /* (by_cols: a CTA a row) */
    using C4 = combine_cfg<kHeadDim, 4>;
    const bool staged = by_cols && C4::staged(a.plan.num_splits);
    /* the group logic only where a row may have more splits than one group */
    const bool groups = a.plan.num_splits > FAD_MERGE_GROUP;
    auto pick = [&](auto g) -> void (*)(fwd_args) {
        return staged    ? combine_kernel<T, kHeadDim, 4, C4::kStaged, decltype(g)::value>
               : by_cols ? combine_kernel<T, kHeadDim, 4, false, decltype(g)::value>
                         : combine_kernel<T, kHeadDim, 1, false, decltype(g)::value>;
    };
    void (*kernel)(fwd_args) = groups ? pick(std::true_type{}) : pick(std::false_type{});
    const size_t smem = staged ? C4::kSmemBytes : 0;
    if (smem > 48 * 1024) {
        static int smem_set[2][FAD_MAX_DEVICES]; /* (per kernel: with and without groups) */
        const fad_status st = allow_smem(kernel, smem_set[groups], smem, msg, msg_len);
        if (st != FAD_OK)
            return st;
    }
    return launch_kernel(kernel, dim3((unsigned)blocks), 128, smem, stream, FAD_COMBINE_PDL, a, msg,
                         msg_len);
}

#define FAD_INST(T, D) template fad_status launch_combine<T, D>(const fwd_args &, cudaStream_t, char *, size_t);
FAD_FWD_HEAD_DIMS(FAD_INST)
template bool combine_polls<64>(const fwd_args &);
template bool combine_polls<128>(const fwd_args &);
template bool combine_polls<192>(const fwd_args &);
template bool combine_polls<256>(const fwd_args &);
