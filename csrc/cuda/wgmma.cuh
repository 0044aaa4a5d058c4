/*
 * wgmma.cuh — Hopper warpgroup MMA (wgmma, sm_90a) for the forward kernel:
 * shared-memory matrix descriptors, the instruction shapes the kernel issues
 * (A from shared memory or registers, B K-major or MN-major), and the fences
 * around them.
 *
 * A warpgroup (4 consecutive warps, the first one's index divisible by 4)
 * issues one wgmma for a 64-row M tile; warp w of the group owns rows
 * 16w .. 16w + 15. Per warp the fragments are those of mma.sync.m16n8k16
 * (mma.cuh): the accumulator of an m64nN wgmma is N/8 blocks of 4 floats,
 * block j holding columns 8j + 2*(lane%4) + {0, 1} of rows lane/4 and
 * lane/4 + 8, the layout of N/8 m16n8 accumulators side by side; the A operand
 * from registers is an m16n8k16 A fragment. So the softmax between the two
 * products is the same code, on the same registers, as the mma.sync path's.
 *
 * Shared-memory tiles for wgmma use the 128-byte swizzle (swz128 in
 * mma.cuh): a tile of R rows x kHeadDim 16-bit columns is stored as
 * kHeadDim/64 column blocks of R rows x 128 bytes, block after block; inside
 * a block the 16-byte chunk c of row r sits at chunk c ^ (r % 8). Tiles start
 * 1024-byte aligned, which is what the descriptors' zero base offset assumes.
 * The same bytes serve as a K-major operand (Q, K: rows are M or N, columns
 * the reduction dim) and as an MN-major one (V: rows are the reduction dim).
 *
 * A wgmma reads its register operands and writes its accumulators after it
 * is issued, until its wgmma_wait: nothing may touch them in between. The
 * kernels run this path only in builds where no spilled value is live while
 * a wgmma is in flight (fwd_launch.cu, launch; checked in the SASS: the D128
 * build's few spills are stored before the first wgmma and reloaded after
 * the tile loop's last wait), since a spilled and reloaded operand is the
 * suspect in the one wrong-result case measured (docs/design.md,
 * "wgmma-limits").
 */
#ifndef FAD_WGMMA_CUH
#define FAD_WGMMA_CUH

#include "mma.cuh"

/* Compiled for sm_90a (the wgmma instructions exist only there). */
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FAD_HAS_WGMMA 1
#else
#define FAD_HAS_WGMMA 0
#endif

/* The 64-bit wgmma matrix descriptor of a 128-byte-swizzled operand at shared
 * address addr: lbo = bytes between 64-column blocks along M/N (MN-major; a
 * K-major operand never crosses one inside an instruction), sbo = bytes
 * between groups of 8 rows (1024 here). Fields in 16-byte units. */
__device__ __forceinline__ uint64_t gmma_desc(uint32_t addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((addr & 0x3ffff) >> 4) | (uint64_t)(lbo >> 4) << 16 |
           (uint64_t)(sbo >> 4) << 32 | (uint64_t)1 << 62 /* 128-byte swizzle */;
}

/* The descriptor of the operand `bytes` further on: the address field holds
 * addr / 16 in 14 bits, and every shared address (< 228 KB) stays below 2^18
 * bytes, so the sum never carries out of the field. One add per instruction
 * instead of rebuilding the descriptor from its address. */
__device__ __forceinline__ uint64_t gmma_desc_at(uint64_t desc, uint32_t bytes)
{
    /* The sum stays in the low word: add there, and ptxas keeps one copy of
     * the constant high word instead of a 64-bit add with carry per operand. */
    const uint32_t lo = (uint32_t)desc + (bytes >> 4), hi = (uint32_t)(desc >> 32);
    return (uint64_t)hi << 32 | lo;
}

#if FAD_HAS_WGMMA
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Shared memory written through the generic proxy (cp.async, st.shared) that
 * wgmma or the copy engine reads next (the async proxy). The PTX memory model
 * asks for a proxy fence on the causality path from the write to the read,
 * in any thread on it: each writing thread before the barrier that announces
 * its writes, or the thread that hands the tile to the copy engine, after
 * that barrier (bwd_dq_reduce.cuh's dq_warp: 256 writers then wait for no
 * store to land). */
__device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* mbarriers (shared-memory arrive/wait barriers with a phase bit), for the
 * warp-specialized prefill kernel (fwd_prefill_ws.cu): a producer warpgroup
 * fills pipeline stages with cp.async and consumer warpgroups release them,
 * with no CTA-wide barrier in the loop. A barrier completes a phase when its
 * expected count of arrivals has come; waiters name the phase by its parity. */
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count));
}
/* Makes the initialised barriers visible to the other threads (before a barrier). */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/* One arrival, made when every cp.async this thread issued so far has landed
 * (noinc: the barrier's expected count includes it). */
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
/* Waits until the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t *bar, int parity)
{
    asm volatile("{\n.reg .pred p;\nWAIT:\n"
                 "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 "@!p bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
                 "r"(parity)
                 : "memory");
}
/* Hands registers between warpgroups (every warp of a warpgroup runs the same
 * one): the producer gives its share up, the consumers take it. */
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
#else
__device__ __forceinline__ void mbar_init(uint64_t *, int) {}
__device__ __forceinline__ void mbar_init_fence() {}
__device__ __forceinline__ void mbar_arrive(uint64_t *) {}
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t *) {}
__device__ __forceinline__ void mbar_wait(uint64_t *, int) {}
template <int N> __device__ __forceinline__ void setmaxnreg_dec() {}
template <int N> __device__ __forceinline__ void setmaxnreg_inc() {}
__device__ __forceinline__ void wgmma_fence() {}
__device__ __forceinline__ void wgmma_commit() {}
template <int N> __device__ __forceinline__ void wgmma_wait() {}
__device__ __forceinline__ void fence_async_smem() {}
#endif

/* A producer's announcement of a stage it filled by cp.async: once its copies
 * have landed it fences them (the writer's fence, so that the warps that read
 * the stage fence nothing per step) and arrives on bar, a plain arrival. */
__device__ __forceinline__ void cp_async_announce(uint64_t *bar)
{
    cp_async_commit();
    cp_async_wait_all();
    fence_async_smem();
    mbar_arrive(bar);
}

/* The barriers of a producer / consumer ring, set up by thread 0 (then the
 * CTA syncs): stages pairs (full[st]: full_count arrivals, the producer's;
 * empty[st]: empty_count, the consumers') and one `once` barrier (the
 * operands loaded once, once_count arrivals). */
__device__ __forceinline__ void ring_init(uint64_t *full, uint64_t *empty, int stages, int full_count,
                                          int empty_count, uint64_t *once, int once_count)
{
    if (threadIdx.x == 0) {
        for (int st = 0; st < stages; st++) {
            mbar_init(&full[st], full_count);
            mbar_init(&empty[st], empty_count);
        }
        if (once) /* (nullptr: the caller inited it) */
            mbar_init(once, once_count);
        mbar_init_fence();
    }
    __syncthreads();
}
/* The producer, before it fills a stage (bar: its empty barrier) with the
 * ring's i-th load: once the ring has wrapped, wait until the consumers
 * released the load `stages` before it (their arrivals completed the phase). */
__device__ __forceinline__ void ring_wait_empty(uint64_t *bar, int i, int stages)
{
    if (i >= stages)
        mbar_wait(bar, (i / stages - 1) & 1);
}
/* threadIdx.x / 128, broadcast from lane 0: ptxas then knows that it is the
 * same in every lane, and keeps what derives from it (the warpgroup's walk,
 * ring position, shared-memory addresses, wgmma descriptors) in uniform
 * registers rather than moving it there (R2UR) for every wgmma. */
__device__ __forceinline__ int uniform_warpgroup() { return __shfl_sync(0xffffffffu, (int)threadIdx.x / 128, 0); }
/* A consumer warp is done with a stage (every lane's reads have retired):
 * lane 0 arrives once on its barrier. */
__device__ __forceinline__ void warp_arrive(uint64_t *bar, int lane)
{
    __syncwarp();
    if (lane == 0)
        mbar_arrive(bar);
}

/* Operand lists of the accumulators: block j is d[j][0..3]. */
#define FAD_ACC4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
#define FAD_ACC32 FAD_ACC4(0), FAD_ACC4(1), FAD_ACC4(2), FAD_ACC4(3), FAD_ACC4(4), FAD_ACC4(5), FAD_ACC4(6), FAD_ACC4(7)
#define FAD_ACC64 FAD_ACC32, FAD_ACC4(8), FAD_ACC4(9), FAD_ACC4(10), FAD_ACC4(11), \
                  FAD_ACC4(12), FAD_ACC4(13), FAD_ACC4(14), FAD_ACC4(15)
#define FAD_ACC16 FAD_ACC4(0), FAD_ACC4(1), FAD_ACC4(2), FAD_ACC4(3)
#define FAD_R16 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define FAD_R32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FAD_R64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "   \
                "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
                "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"

/* d (m64 x nN, fp32) += A (shared, K-major) * B (shared, K-major), N = 8 * NB.
 * accumulate = 1 (the forward: d starts from zeros the caller wrote, so every
 * product is added exactly as mma.sync adds it) or 0: d = A * B, d's old
 * values unread (the backward's first k-chunk: the same values, up to the
 * sign of an exact zero, with no zeroing of the registers, which made ptxas
 * wait for the previous wgmma group before issuing this one). */
#define FAD_WGMMA_SS_T(NAME, TRANS, TY, CT, NB, N, ACC, REGS, OPS, ACCUM)                    \
    __device__ __forceinline__ void NAME(float (&d)[NB][4], uint64_t desc_a,                  \
                                         uint64_t desc_b, const CT *, int accumulate = 1)     \
    {                                                                                        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACCUM ", 0;\n"                      \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS    \
                     ", " OPS ", p, 1, 1, 0, " #TRANS ";\n}\n"                              \
                     : ACC                                                                   \
                     : "l"(desc_a), "l"(desc_b), "r"(accumulate));                           \
    }
/* (wgmma_ss: B K-major; wgmma_ss_mnb: B stored [k][n] (MN-major, trans-b),
 * the backward's dQ = dS K with dS and K both from shared memory,
 * bwd_dkdv_wgmma.cu) */
/* d (m64 x nN, fp32) += A (registers: the m16n8k16 A fragment of each warp's
 * 16 rows) * B (shared): wgmma_rs_kmajor for B stored [n][k] (K, for Q K^T),
 * wgmma_rs_mnmajor for B stored [k][n] (V, for P V: trans-b). accumulate as
 * in wgmma_ss (0: d = A * B; the forward's first P V of a split, so that acc
 * is never zeroed). */
#define FAD_WGMMA_RS(NAME, TRANS, TY, CT, NB, N, ACC, REGS, OPS, ACCUM)                      \
    __device__ __forceinline__ void NAME(float (&d)[NB][4], const uint32_t (&a)[4],           \
                                         uint64_t desc_b, const CT *, int accumulate = 1)     \
    {                                                                                        \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " ACCUM ", 0;\n"                      \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS    \
                     ", " OPS ", p, 1, 1, " #TRANS ";\n}\n"                                 \
                     : ACC                                                                   \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b),              \
                       "r"(accumulate));                                                     \
    }

#if FAD_HAS_WGMMA
FAD_WGMMA_SS_T(wgmma_ss, 0, "bf16", __nv_bfloat16, 4, 32, FAD_ACC16, FAD_R16, "%16, %17", "%18")
FAD_WGMMA_SS_T(wgmma_ss, 0, "f16", __half, 4, 32, FAD_ACC16, FAD_R16, "%16, %17", "%18")
FAD_WGMMA_SS_T(wgmma_ss, 0, "bf16", __nv_bfloat16, 8, 64, FAD_ACC32, FAD_R32, "%32, %33", "%34")
FAD_WGMMA_SS_T(wgmma_ss, 0, "f16", __half, 8, 64, FAD_ACC32, FAD_R32, "%32, %33", "%34")
FAD_WGMMA_SS_T(wgmma_ss, 0, "bf16", __nv_bfloat16, 16, 128, FAD_ACC64, FAD_R64, "%64, %65", "%66")
FAD_WGMMA_SS_T(wgmma_ss, 0, "f16", __half, 16, 128, FAD_ACC64, FAD_R64, "%64, %65", "%66")
FAD_WGMMA_SS_T(wgmma_ss_mnb, 1, "bf16", __nv_bfloat16, 8, 64, FAD_ACC32, FAD_R32, "%32, %33", "%34")
FAD_WGMMA_SS_T(wgmma_ss_mnb, 1, "f16", __half, 8, 64, FAD_ACC32, FAD_R32, "%32, %33", "%34")
#define FAD_A32 "{%32, %33, %34, %35}, %36"
#define FAD_A64 "{%64, %65, %66, %67}, %68"
FAD_WGMMA_RS(wgmma_rs_kmajor, 0, "bf16", __nv_bfloat16, 8, 64, FAD_ACC32, FAD_R32, FAD_A32, "%37")
FAD_WGMMA_RS(wgmma_rs_kmajor, 0, "f16", __half, 8, 64, FAD_ACC32, FAD_R32, FAD_A32, "%37")
FAD_WGMMA_RS(wgmma_rs_mnmajor, 1, "bf16", __nv_bfloat16, 8, 64, FAD_ACC32, FAD_R32, FAD_A32, "%37")
FAD_WGMMA_RS(wgmma_rs_mnmajor, 1, "bf16", __nv_bfloat16, 16, 128, FAD_ACC64, FAD_R64, FAD_A64, "%69")
FAD_WGMMA_RS(wgmma_rs_mnmajor, 1, "f16", __half, 8, 64, FAD_ACC32, FAD_R32, FAD_A32, "%37")
FAD_WGMMA_RS(wgmma_rs_mnmajor, 1, "f16", __half, 16, 128, FAD_ACC64, FAD_R64, FAD_A64, "%69")
#else
/* Other targets compile the sm_90a kernels too (one template set); the host
 * launches them only on sm_90 from an sm_90a build (device.cu: use_wgmma). */
template <int NB, typename CT>
__device__ __forceinline__ void wgmma_ss(float (&)[NB][4], uint64_t, uint64_t, const CT *, int = 1) { __trap(); }
template <int NB, typename CT>
__device__ __forceinline__ void wgmma_ss_mnb(float (&)[NB][4], uint64_t, uint64_t, const CT *, int = 1) { __trap(); }
template <int NB, typename CT>
__device__ __forceinline__ void wgmma_rs_kmajor(float (&)[NB][4], const uint32_t (&)[4], uint64_t, const CT *, int = 1) { __trap(); }
template <int NB, typename CT>
__device__ __forceinline__ void wgmma_rs_mnmajor(float (&)[NB][4], const uint32_t (&)[4], uint64_t, const CT *, int = 1) { __trap(); }
#endif

/* Four 8x8 b16 matrices of the m16n8k16 fragment layout (register i: this
 * thread's two elements of matrix i, row lane / 4, columns 2 (lane % 4) ..):
 * lane 8i + c gives the address of row c of matrix i as stored (16 bytes);
 * the rows are stored as they are, or with kTrans transposed. */
template <bool kTrans> __device__ __forceinline__ void stmatrix_x4(uint32_t addr, const uint32_t (&r)[4])
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if constexpr (kTrans)
        asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                     "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
    else
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
                     "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3])
                     : "memory");
#else
    (void)addr, (void)r;
    __trap();
#endif
}

/* The wgmma kernels' epilogues: fp32 accumulators (the forward's O, the
 * backward's dK and dV, or dQ), rounded to T, staged in shared memory as
 * kRows rows of kCols elements (16-byte chunk c of row r at chunk c ^ (r % 8),
 * so that the 8 rows of a stmatrix and the 8 chunks of a quarter warp's load
 * hit distinct banks) by stage_acc, then stored to global memory by
 * store_staged as whole 16-byte chunks, a warp's 32 consecutive ones.
 * Storing each accumulator pair with a 4-byte store, the dK/dV kernel's math
 * warps spent about 2.6 steps' time a CTA in its epilogue, throttled by the
 * LSU queue (Nsight Compute, D128 L8k). The caller meets the threads that
 * share the staging space before stage_acc (that space -- Q's, or K's and
 * V's -- must be done with) and between the two. */
template <typename T, int kCols, int kBoxRows = 0>
__device__ __forceinline__ uint32_t staged_at(uint32_t s, int row, int chunk)
{
    /* kBoxRows: swz128's layout instead (kCols / 64 column blocks of kBoxRows
     * rows x 128 bytes), a bulk tensor store's boxes (tma.cuh) */
    if constexpr (kBoxRows > 0)
        return s + (uint32_t)((chunk / 8) * kBoxRows * 128 + row * 128 + ((chunk % 8) ^ (row % 8)) * 16);
    return s + (uint32_t)(row * kCols + ((chunk ^ (row % 8)) * 8)) * (uint32_t)sizeof(T);
}

/* acc: this thread's kDB n8 blocks (the m64nN accumulator layout) of rows
 * wrow0 + lane / 4 and + 8 (wrow0: its warp's first row), columns col0 + 8 nb
 * + 2 (lane % 4) .., into the staged tile at s. */
template <typename T, int kCols, int kDB, int kBoxRows = 0>
__device__ __forceinline__ void stage_acc(const float (&acc)[kDB][4], uint32_t s, int wrow0, int col0, int lane)
{
    static_assert(kCols / 8 >= 8 && kDB % 2 == 0, "the swizzle spans 8 chunks; stmatrix takes two n8 blocks");
    const int i = lane / 8, row = wrow0 + lane % 8 + 8 * (i % 2);
#pragma unroll
    for (int nb = 0; nb < kDB; nb += 2) { /* matrices (rows 0-7, 8-15) x (blocks nb, nb + 1) */
        const uint32_t r4[4] = {dtype_ops<T>::pack(acc[nb][0], acc[nb][1]), dtype_ops<T>::pack(acc[nb][2], acc[nb][3]),
                                dtype_ops<T>::pack(acc[nb + 1][0], acc[nb + 1][1]),
                                dtype_ops<T>::pack(acc[nb + 1][2], acc[nb + 1][3])};
        stmatrix_x4<false>(staged_at<T, kCols, kBoxRows>(s, row, col0 / 8 + nb + i / 2), r4);
    }
}

/* kTiles staged tiles s[t] to g[t] (row r at g[t] + r * stride[t]), their rows
 * below rows and columns below cols, by kThreads threads (tid). */
template <typename T, int kCols, int kRows, int kThreads, int kTiles>
__device__ __forceinline__ void store_staged(const uint32_t (&s)[kTiles], T *const (&g)[kTiles], const int64_t (&stride)[kTiles],
                                             int rows, int cols, int tid)
{
    constexpr int kChunks = kCols / 8;
    static_assert(kRows * kChunks % kThreads == 0, "whole passes of the threads");
#pragma unroll
    for (int pass = 0; pass < kRows * kChunks / kThreads; pass++) {
        const int c = pass * kThreads + tid, row = c / kChunks, chunk = c % kChunks;
        if (row >= rows || chunk * 8 >= cols)
            continue;
        uint4 x[kTiles];
#pragma unroll
        for (int t = 0; t < kTiles; t++)
            asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(x[t].x), "=r"(x[t].y), "=r"(x[t].z), "=r"(x[t].w)
                         : "r"(staged_at<T, kCols>(s[t], row, chunk)));
#pragma unroll
        for (int t = 0; t < kTiles; t++)
            *reinterpret_cast<uint4 *>(g[t] + (int64_t)row * stride[t] + chunk * 8) = x[t];
    }
}

/* acc (this thread's kDB n8 blocks of an m64nN accumulator: rows r and r + 8,
 * columns 8 nb + 2 (lane % 4) ..) straight to global memory, row r at g and
 * r + 8 at g + 8 stride, the rows below `rows` (counted from r) and the
 * columns below cols: 4-byte stores, each warp's filling whole 32-byte
 * sectors over its n8 blocks, which L2 merges. For an epilogue with no
 * shared memory to stage in: the persistent dK/dV kernel's items without
 * steps, whose zeros go out while the producer may be loading the next
 * item's K/V (bwd_dkdv_wgmma.cu); the values are stage_acc's. */
template <typename T, int kDB>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[kDB][4], T *g, int64_t stride, int rows, int cols,
                                               int lane)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        if (8 * r >= rows)
            continue;
#pragma unroll
        for (int nb = 0; nb < kDB; nb++) {
            const int col = nb * 8 + (lane % 4) * 2;
            if (col < cols)
                *reinterpret_cast<uint32_t *>(g + 8 * r * stride + col) =
                    dtype_ops<T>::pack(acc[nb][2 * r], acc[nb][2 * r + 1]);
        }
    }
}

/* Ties the accumulators to this point of the program: the compiler sees a
 * wgmma write them at issue, so without this it could move their reads above
 * the wgmma_wait that makes them valid. */
template <int NB> __device__ __forceinline__ void wgmma_fence_operand(float (&d)[NB][4])
{
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+f"(d[j][e])::"memory");
}
/* The same for A fragments in registers: an in-flight wgmma still reads them,
 * so they must keep their registers and values until its wgmma_wait. */
template <int NK> __device__ __forceinline__ void wgmma_fence_operand(uint32_t (&a)[NK][4])
{
#pragma unroll
    for (int j = 0; j < NK; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            asm volatile("" : "+r"(a[j][e])::"memory");
}

#endif /* FAD_WGMMA_CUH */
