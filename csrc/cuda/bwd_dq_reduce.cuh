/*
 * bwd_dq_reduce.cuh — the fifth product of the five-product dK/dV kernel
 * (bwd_dkdv_wgmma.cu, kRed; FLASH_ATTN_DET_BWD_DQ=reduce) and its hand-off
 * to the accumulator (bwd_dq_accum.cuh: the tiles, the turns, the barriers,
 * the ordered add):
 *
 *   the math warpgroups (dq_reducer): each stores its dS^T fragments,
 *   transposed, into the step's dS buffer (its keys are one half of the k
 *   dim), issues its 64 x 64 part of the step's dQ tile
 *     dQ (64 rows x 64 cols) = dS K    A: sDs (K-major)   B: sK (MN-major)
 *   once the other's half is there, and stores the part into the step's
 *   fp32 dQ buffer;
 *   the dQ warps (dq_warp): add each buffer to the accumulator in turn.
 *
 * Shapes: kM rows a step (the tile's rows), kN keys a CTA (two warpgroups of
 * 64), kHeadDim 64 or 128 (dq_accum_cfg: one 64 x 64 part a warpgroup).
 * Buffers: two of dS (step parity, kM x kN bf16, swz128) and kBufs of dQ
 * (step t's in buffer t % kBufs, kM x kHeadDim fp32, in dq_accum_cfg's slot
 * order): two, or with dropout one (its draws take the shared memory a
 * second would: bwd_dkdv_wgmma.cu, dkdv_wgmma_smem).
 *
 * kLag (FAD_BWD_DQ_LAG_MAX_D, no score mod): each step's dQ product is issued
 * a step late and the warpgroups take turns at issuing their products
 * (ping-pong), so that one's element-wise work runs under the other's
 * products; without the lag, the product's wait for the other's dS would keep
 * them in lockstep. At D128 the turns lost 2-5%: its element-wise work
 * outlasts the other warpgroup's products, and the turns only delayed them.
 * Without the lag (D128, score mods) the kernel issues dV, then dQ, then dK,
 * and hands dQ's part off while dK still runs (FlashAttention's sm90
 * backward's order; +3-5% at D128 against waiting for all three).
 * The products and their chains are the same either way: no bit changes.
 */
#ifndef FAD_BWD_DQ_REDUCE_CUH
#define FAD_BWD_DQ_REDUCE_CUH

#include <type_traits>

#include "bwd_dq_accum.cuh"
#include "bwd_tile_wgmma.cuh"

/* The math warpgroups' side, for warpgroup wg (thread tid of the math
 * warpgroups), step by step in the kernel's order:
 *   turn_wait, S^T and dP^T, turn_pass, ..., store_ds, turn_wait, dV and dK,
 *   issue (this step's dQ; kLag: the last step's), turn_pass, the wait for
 *   the products, hand_off; after the loop, finish. (Without the lag: dV,
 *   issue, dK, the wait for dQ, hand_off, the wait for dV and dK.) */
template <typename T, int kHeadDim, int kM, int kN, bool kLag, int kBufs> struct dq_reducer {
    using Acc = dq_accum_cfg<kHeadDim>;
    static constexpr int kDqLag = kLag ? 1 : 0;
    /* (kLag, step -1's product: of K and V's tiles, which nobody writes,
     * taken as dS and never stored. Issued under a branch instead, ptxas
     * serialized every wgmma of the kernel, short of registers.) */
    static_assert(kM * kN <= 2 * kN * kHeadDim, "the first step's dummy dS: sK, sV");
    unsigned char *ds_smem; /* dS buffer 0; buffer 1 follows */
    uint32_t k_s;   /* sK: dQ's B operand (and, kLag, the first step's dummy A) */
    float4 *dq0;    /* dQ buffer 0; buffer 1 follows */
    int wg, tid;
    /* The CTA's steps before this item's (the persistent grid: bwd_dkdv_wgmma.cu,
     * kPersist). The buffers and their barriers go by the CTA's step, base +
     * step, so an item's first steps wait for the last item's last ones as
     * any step waits for the one before; what a step's part is (the lag's
     * first, finish) goes by the item's step. */
    int base = 0;

    __device__ __forceinline__ dq_reducer(unsigned char *ds_smem_, unsigned char *dq_smem, uint32_t k_addr, int wg_,
                                          int tid_)
        : ds_smem(ds_smem_), k_s(k_addr), dq0(reinterpret_cast<float4 *>(dq_smem)), wg(wg_), tid(tid_)
    {
    }
    __device__ __forceinline__ uint32_t ds_buf(int t) const
    {
        return smem_addr(ds_smem) + (uint32_t)((base + t) & 1) * (kM * kN * 2);
    }

    /* kLag: warpgroup 1 hands warpgroup 0 the first turn (once a CTA: each
     * item's last step leaves warpgroup 0 the next item's first) */
    __device__ __forceinline__ void start() const
    {
        if (kLag && wg == 1)
            turn_pass();
    }
    /* kLag: this warpgroup's turn at issuing (named barrier kBarTurn + wg) */
    __device__ __forceinline__ void turn_wait() const
    {
        if constexpr (kLag)
            named_bar_sync(kBarTurn + wg, 256);
    }
    __device__ __forceinline__ void turn_pass() const
    {
        if constexpr (kLag)
            named_bar_arrive(kBarTurn + (1 - wg), 256);
    }

    /* dS (dS^T's bf16 fragments sf, as dK's product rounds them) into the
     * step's buffer, transposed by stmatrix: 8x8 matrix i of chunk kk is keys
     * warp*16 + 8 (i % 2) .. of rows 16 kk + 8 (i / 2) .. (p_fragment), once
     * (kLag) the other warpgroup is done reading the buffer (its dQ two steps
     * back; without the lag, it was by its last step's kBarDsStored). Its
     * proxy fence is issue()'s. */
    __device__ __forceinline__ void store_ds(const uint32_t (&sf)[kM / 16][4], int step, int warp, int lane) const
    {
        if (kLag && base + step >= 2)
            named_bar_sync(kBarDsEmpty + 2 * ((base + step) & 1) + (1 - wg), 256);
        const uint32_t ds_s = ds_buf(step);
        const int i = lane / 8;
#pragma unroll
        for (int kk = 0; kk < kM / 16; kk++)
            stmatrix_x4<true>(ds_s + swz128<kM>(kk * 16 + 8 * (i / 2) + lane % 8, warp * 16 + 8 * (i % 2)) * 2,
                              sf[kk]);
    }

    /* Step t's part: dS K over the CTA's keys in increasing k16 order, once
     * the other warpgroup stored its half (kLag: ds_full; else both meet at
     * kBarDsStored). */
    __device__ __forceinline__ void issue_part(float (&dqa)[8][4], int t) const
    {
        if constexpr (kLag) {
            if (t >= 0)
                named_bar_sync(kBarDsFull + 2 * ((base + t) & 1) + (1 - wg), 256);
        } else {
            named_bar_sync(kBarDsStored, 256); /* (both warpgroups: one barrier, no arrival) */
        }
        const int part_row = 64 * (wg / Acc::kColParts), part_col = 64 * (wg % Acc::kColParts);
        issue_ss_mn<T, kM, kN>(dqa, (t >= 0 ? ds_buf(t) : k_s) + (uint32_t)part_row * 128,
                               k_s + (uint32_t)(part_col / 64) * kN * 128);
    }
    /* After dV's issue (and dK's with the lag): this step's part (kLag:
     * this warpgroup's half of dS is stored, and the last step's part). The
     * dS stores' proxy fence is here, not in store_ds: it waits for those
     * stores to land (a MEMBAR), and dV's and dK's products read no dS from
     * shared memory, so they are issued before it (the same bits, 1.01-1.04x
     * at D64, 1.01-1.02x at D128). */
    __device__ __forceinline__ void issue(float (&dqa)[8][4], int step) const
    {
        fence_async_smem(); /* (the dQ product reads dS through the async proxy) */
        if constexpr (kLag)
            named_bar_arrive(kBarDsFull + 2 * ((base + step) & 1) + wg, 256);
        issue_part(dqa, step - kDqLag);
    }

    /* Step t's part (its product waited for) into dQ buffer t % kBufs, once
     * the copy engine read it for step t - kBufs (kBarDqEmpty), then to the
     * dQ warps (kBarDqFull). */
    __device__ __forceinline__ void store_part(float (&dqa)[8][4], int t) const
    {
        wgmma_fence_operand(dqa);
        const int buf = (base + t) % kBufs;
        if (base + t >= kBufs)
            named_bar_sync(kBarDqEmpty + buf, kDqBarThreads);
        float4 *dq_s = dq0 + buf * (Acc::kTileFloats / 4);
#pragma unroll
        for (int nb = 0; nb < 8; nb++)
            dq_s[Acc::slot(wg, nb, tid % 128)] = make_float4(dqa[nb][0], dqa[nb][1], dqa[nb][2], dqa[nb][3]);
        named_bar_arrive(kBarDqFull + buf, kDqBarThreads); /* (its proxy fence is the dQ warp's) */
    }
    /* Once the step's products are done: the part issued with them goes to
     * the dQ warps (kLag: the last step's, and this warpgroup is done reading
     * that step's dS buffer, which the other's next store waits on: every
     * step's, as the next item's stores may wait on it; drain takes the last). */
    __device__ __forceinline__ void hand_off(float (&dqa)[8][4], int step) const
    {
        if constexpr (kLag) {
            if (step >= 1) {
                named_bar_arrive(kBarDsEmpty + 2 * ((base + step - 1) & 1) + wg, 256);
                store_part(dqa, step - 1);
            }
        } else {
            store_part(dqa, step);
        }
    }
    /* kLag: after the item's loop, its last step's part */
    __device__ __forceinline__ void finish(int steps) const
    {
        if constexpr (kLag) {
            if (steps > 0) {
                float dqa[8][4];
                issue_part(dqa, steps - 1);
                wgmma_wait<0>();
                named_bar_arrive(kBarDsEmpty + 2 * ((base + steps - 1) & 1) + wg, 256);
                store_part(dqa, steps - 1);
            }
        }
    }
    /* After the CTA's last item (base: its steps): the arrivals no later step
     * waited for, so that no named barrier is left half met: the other
     * warpgroup's on the last two dS buffers (kLag), the dQ warps' on the
     * last kBufs dQ buffers. */
    __device__ __forceinline__ void drain() const
    {
        for (int t = base - 2; kLag && t < base; t++)
            if (t >= 0)
                named_bar_sync(kBarDsEmpty + 2 * (t & 1) + (1 - wg), 256);
        for (int t = base - kBufs; t < base; t++)
            if (t >= 0)
                named_bar_sync(kBarDqEmpty + t % kBufs, kDqBarThreads);
    }
};

/* The kernels that add no dQ: every step does nothing. */
struct dq_no_reducer {
    template <typename... A> __device__ __forceinline__ explicit dq_no_reducer(A &&...) {}
    template <typename... A> __device__ __forceinline__ void start(A &&...) const {}
    __device__ __forceinline__ void turn_wait() const {}
    __device__ __forceinline__ void turn_pass() const {}
    template <typename... A> __device__ __forceinline__ void store_ds(A &&...) const {}
    template <typename... A> __device__ __forceinline__ void issue(A &&...) const {}
    template <typename... A> __device__ __forceinline__ void hand_off(A &&...) const {}
    template <typename... A> __device__ __forceinline__ void finish(A &&...) const {}
    __device__ __forceinline__ void drain() const {}
    int base = 0;
};

/* A dQ warp of the producer warpgroup, the first of kWarps: its steps (every
 * step, or with two dQ warps those of its parity, FAD_BWD_DQ_WARPS) in the
 * math warps' order: once they stored the step's dQ tile into buffer step %
 * kBufs (barrier kBarDqFull), lane 0 adds it to the accumulator in its turn;
 * once the copy engine has read the buffer it is free (kBarDqEmpty, which the
 * math warps wait on kBufs steps of the CTA later, or for the CTA's last kBufs
 * in dq_reducer::drain), and once the add has landed the turn passes on
 * (dq_add_start, _finish). Two warps keep two adds in flight: a step's add
 * then need not wait for the previous step's to land, nor for its turn. Two
 * warps need two buffers: on one, both would meet the math warps at the same
 * named barrier and either could take the other's step. */
template <int kHeadDim, bool kDown, int kBufs, int kWarps, typename StepH, typename StepM>
__device__ __forceinline__ void dq_warp(const bwd_args &a, const dkdv_work &w, StepH step_h, StepM step_m0,
                                        int first, int base, int steps, int kN, const float *s_dq)
{
    static_assert(kWarps <= kBufs && kBufs <= 2, "a dQ warp a buffer at most");
    using Acc = dq_accum_cfg<kHeadDim>;
    const fad_fwd_params &p = a.p;
    const int n_block = w.n0 / kN;
    /* (the CTA's steps base + step whose index is first mod kWarps) */
    for (int step = ((first - base) % kWarps + kWarps) % kWarps; step < steps; step += kWarps) {
        const int buf = (base + step) % kBufs;
        named_bar_sync(kBarDqFull + buf, kDqBarThreads);
        /* The math warps stored the tile by generic stores; the copy engine
         * reads it through the async proxy. The fence is here, after the
         * barrier, not in each writer before it: there it waited for the
         * writer's stores to land, and the next step's products waited
         * behind it (without it and the math warps' per-step fence, D128
         * 1.03-1.05x; wgmma.cuh's fence_async_smem says why either place
         * is sound). */
        fence_async_smem();
        const int m = step_m0(step) / Acc::kRows;
        const int64_t tile = dq_tile(a, w.b, w.seq, step_h(step), m, Acc::kRows);
        if (threadIdx.x % 32 == 0) {
            const int turn = dq_turn(n_block, kN, m, Acc::kRows, w.seq.len_q, w.seq.len_k, p.window_left,
                                     p.window_right, kDown);
            dq_add_start(a.dq_accum + tile * Acc::kTileFloats, s_dq + buf * Acc::kTileFloats,
                         Acc::kTileFloats * 4, a.dq_sems + tile, turn);
        }
        __syncwarp();
        named_bar_arrive(kBarDqEmpty + buf, kDqBarThreads); /* (the last kBufs: dq_reducer::drain) */
        if (threadIdx.x % 32 == 0)
            dq_add_finish(a.dq_sems + tile);
    }
}

#endif /* FAD_BWD_DQ_REDUCE_CUH */
