/*
 * bwd_dq_accum.cuh — the fp32 dQ accumulator of the five-product backward
 * (FLASH_ATTN_DET_BWD_DQ=reduce, bwd_launch.cu; docs/design.md,
 * "backward-order"): the layout of its tiles, which the dK/dV kernel
 * (bwd_dkdv_wgmma.cu) adds to through the bulk copy engine and the
 * conversion kernel (bwd_dq_post.cu) reads; the turn of each add; and the
 * instructions of one ordered add.
 *
 * One tile per (sequence b, query head h, row tile m of kRows rows, aligned to
 * the sequence's row 0), kRows x kHeadDim floats, contiguous, so one bulk
 * reduce adds a whole tile: tile h * T + first(b) + m (dq_tile). Dense: first(b)
 * = b * m_tiles, T = batch * m_tiles. Varlen: first(b) = q0 / kRows + b, q0 =
 * cu_seqlens_q[b], T = total_q / kRows + batch: sequence b's ceil(len / kRows)
 * tiles end at (q0 + len - 1) / kRows + b, before b + 1's first, so the
 * accumulator is sized by the call's rows plus a tile a sequence (as
 * FlashAttention-2's dq_accum), not by batch x the longest sequence, and the
 * host needs no index array's contents. Inside, the
 * dK/dV kernel's two math warpgroups each own a part of 64 rows x 64 columns
 * (part w: rows 64 (w / kColParts) .., columns 64 (w % kColParts) ..) and
 * store it in their accumulators' order: float4 slot (w * 8 + nb) * 128 + t
 * holds thread t's n8 block nb (elements e = 0..3: row r0 + 8 (e / 2), column
 * c0 + e % 2), so the stores into shared memory are conflict-free 16-byte
 * stores and no thread reorders anything.
 *
 * The order of the adds: the semaphore of a tile (one int, zeroed before the
 * call; the accumulator is not: the first add is a copy) counts the key
 * blocks that added to it. The key blocks that walk row tile m
 * (dkdv_row_tiles) are consecutive, from jlo(m) = lo(r0) / kN to jhi(m) =
 * (hi(r1) - 1) / kN, r0 and r1 the tile's first and last row below len_q
 * (lo, hi: a row's key range, fad_row_keys): a row's key range moves by at
 * most one key a row, so a key block between two that see the tile's rows is
 * seen by one of them too. The turns follow the dK/dV kernel's walk
 * (bwd_dkdv_wgmma.cu, step_h), which depends on the call's group size only:
 *
 *   one query head a kv head: the walk goes from the block's first row tile
 *   up, and key block j adds when the count is jhi(m) - j, from the last
 *   block down: a higher block's first row tile is no lower than a lower
 *   block's, so it reaches a shared tile in no more steps (causal: 1 or 2
 *   steps fewer, the diagonal's offset, so the turns rarely wait);
 *   GQA: the walk goes from the block's last row tile down, the group's heads
 *   inner, and key block j adds when the count is j - jlo(m), from the first
 *   block up: a lower block's last row tile is no higher than a higher
 *   block's, so it reaches a shared tile in no more steps (causal, full: the
 *   same tile, so the adds to a tile follow one another while it is in L2).
 *
 * Either way a function of positions inside the sequence only. No wait can
 * deadlock: the dK/dV kernel's work items put a (sequence, kv head)'s key
 * blocks in turn order (dkdv_work_of_item, adds_in_order), and its persistent
 * CTAs take the items in that order from one ticket (bwd_dkdv_wgmma.cu,
 * kPersist), so the item a waiting item waits for (the key block before it
 * in turn order) was taken before it by a running CTA, which finishes its
 * earlier items first: it is running or done, never waiting for an SM. It
 * waits in turn only for the block before it, and the tile's first adder
 * (turn 0) never waits.
 */
#ifndef FAD_BWD_DQ_ACCUM_CUH
#define FAD_BWD_DQ_ACCUM_CUH

#include "bwd_block.cuh"
#include "wgmma.cuh"

template <int kHeadDim> struct dq_accum_cfg {
    using C = bwd_wg_cfg<kHeadDim>;
    static constexpr int kRows = C::kStepM; /* a tile is one step of the dK/dV kernel */
    static constexpr int kTileFloats = kRows * kHeadDim;
    static constexpr int kColParts = kHeadDim / 64, kRowParts = kRows / 64;
    static_assert(!C::kSplitCols && kColParts * kRowParts == FAD_BWD_WG_DKDV_WGS,
                  "one 64 x 64 part per math warpgroup (D 64 and 128)");
    /* the first row and column of part w, thread t's block nb (element 0) in it */
    static __host__ __device__ __forceinline__ int row_of(int w, int t) { return 64 * (w / kColParts) + (t / 32) * 16 + t % 32 / 4; }
    static __host__ __device__ __forceinline__ int col_of(int w, int nb, int t) { return 64 * (w % kColParts) + nb * 8 + (t % 4) * 2; }
    static __host__ __device__ __forceinline__ int slot(int w, int nb, int t) { return (w * 8 + nb) * 128 + t; }
    /* row tiles of the call's longest sequence; a head's tiles (the layout above) */
    static int m_tiles(const fad_fwd_params &p) { return (p.seqlen_q + kRows - 1) / kRows; }
    static int64_t head_tiles(const fad_fwd_params &p)
    {
        return p.cu_seqlens_q ? (int64_t)p.total_q / kRows + p.batch : (int64_t)p.batch * m_tiles(p);
    }
    /* bytes of the accumulator, the semaphores and the dK/dV grid's ticket of a call */
    static size_t bytes(const fad_fwd_params &p)
    {
        return (size_t)p.num_heads * head_tiles(p) * (kTileFloats * 4 + 4) + sizeof(unsigned);
    }
};

/* The tile of sequence b (seq: fad_get_seq's, row0 its first packed row when
 * varlen), head h, row tile m: the layout above. (Host code too:
 * tests/dq_turn_check.cu checks on the CPU that no two tiles meet and all lie
 * below heads x dq_head_tiles.) */
__host__ __device__ __forceinline__ int64_t dq_tile(const bwd_args &a, int b, const fad_seq &seq, int h, int m,
                                                    int kRows)
{
    const int64_t first = a.p.cu_seqlens_q ? seq.row0 / kRows + b : (int64_t)b * a.dq_m_tiles;
    return h * a.dq_head_tiles + first + m;
}

/* Key block n_block's turn at row tile m (the header's rule; checked against
 * dkdv_row_tiles's walks on the CPU by tests/dq_turn_check.cu). */
__host__ __device__ __forceinline__ int dq_turn(int n_block, int kN, int m, int kRows, int len_q, int len_k, int wl,
                                                int wr, bool from_first)
{
    if (from_first)
        return n_block - fad_row_keys(m * kRows, len_q, len_k, wl, wr).lo / kN;
    const int last_row = ((m + 1) * kRows < len_q ? (m + 1) * kRows : len_q) - 1;
    return (fad_row_keys(last_row, len_q, len_k, wl, wr).hi - 1) / kN - n_block;
}

/* Named barriers. Between the math warpgroups (256 threads) and the dQ warp
 * adding from buffer buf (FAD_BWD_DQ_WARPS: one for both buffers, or one
 * each; with dropout one buffer, one warp): dq_full[buf] (the math warps stored a tile into buffer buf),
 * dq_empty[buf] (the copy engine has read it). Between the math warpgroups
 * (128 threads each): ds_stored (both stored their halves of the step's dS);
 * with bwd_dkdv_wgmma.cu's kLag instead ds_full[buf][w] (warpgroup w stored
 * its half into dS buffer buf), ds_empty[buf][w] (warpgroup w is done reading
 * buffer buf) and turn[w] (warpgroup w may issue its products). 1, 2 are also
 * warpgroup_sync's (dropout's draws: so no kernel with dropout has the lag),
 * 3 split_meet's (none adds dQ) and the epilogues' (after the loop:
 * stage_acc, bwd_tile_wgmma.cuh). */
enum {
    kBarTurn = 1, kBarDqFull = 4, kBarDqEmpty = 6, kBarDsFull = 8, kBarDsEmpty = 12,
    kBarDsStored = kBarDsFull, /* (in the kernels without ds_full) */
    kDqBarThreads = 256 + 32
};

/* One ordered add (one thread), in two halves, so that the shared buffer it
 * reads can be handed back before the add lands: dq_add_start waits for the
 * turn, adds the tile (bytes from shared src) to global dst through the copy
 * engine and returns once the copy engine has READ src (the bulk group's
 * .read wait); dq_add_finish waits until the add has COMPLETED (its writes
 * are performed, not only its shared-memory reads done), then hands the turn
 * on. The proxy fences order the generic-proxy semaphore accesses and the
 * async-proxy add. Turn 0 copies instead of adding, so the accumulator needs
 * no zeroing (only the semaphores do); a tile no key block visits keeps its
 * semaphore at 0, and the conversion kernel writes its dQ as zeros. */
__device__ __forceinline__ void dq_add_start(float *dst, const float *src, uint32_t bytes, const int *sem, int turn)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    int v;
    do {
        asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
    } while (v != turn);
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    if (turn == 0)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst),
                     "r"(smem_addr(src)), "r"(bytes)
                     : "memory");
    else
        asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                     "r"(smem_addr(src)), "r"(bytes)
                     : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
    asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)sem, (void)turn;
    __trap();
#endif
}

__device__ __forceinline__ void dq_add_finish(int *sem)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
    asm volatile("red.release.gpu.global.add.s32 [%0], 1;\n" ::"l"(sem) : "memory");
#else
    (void)sem;
    __trap();
#endif
}

#endif /* FAD_BWD_DQ_ACCUM_CUH */
