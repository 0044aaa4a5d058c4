/*
 * mma.cuh — the CUDA primitives every kernel file shares: the error macro,
 * dtype traits (fp32 pair packing and the matching mma.sync.m16n8k16), cp.async,
 * ldmatrix, the XOR-swizzled shared-memory tile layout and its addressing, the
 * global->shared tile copy, the fixed-order reductions over a row's 4 lanes, and
 * the launch of a kernel as a programmatic dependent of the one before it.
 *
 * Fragment layout of mma.m16n8k16 (PTX ISA, "row.col"): a thread (lane) holds
 * accumulator elements e = 0..3 at row lane/4 + 8*(e/2), column 2*(lane%4) + e%2.
 */
#ifndef FAD_MMA_CUH
#define FAD_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "fad_internal.h"
#include "fad_math.h"

/* Per-device one-time state (kernel attributes, SM counts) is kept for this many devices. */
#define FAD_MAX_DEVICES 64

#define CUDA_TRY(call)                                                                       \
    do {                                                                                     \
        cudaError_t err_ = (call);                                                           \
        if (err_ != cudaSuccess)                                                             \
            return fad_fail(FAD_ERR_CUDA, msg, msg_len, "%s failed: %s", #call,              \
                            cudaGetErrorString(err_));                                       \
    } while (0)

/* Once per device and kernel: allow the dynamic shared memory it needs. */
template <typename Kernel>
static inline fad_status allow_smem(Kernel kernel, int *set, size_t bytes, char *msg, size_t msg_len)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    if (dev >= 0 && dev < FAD_MAX_DEVICES && !set[dev]) {
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        set[dev] = 1;
    }
    return FAD_OK;
}

/* ------------------------------------------------------------------------ */
/* dtype traits: packing fp32 pairs and the matching mma instruction         */
/* ------------------------------------------------------------------------ */

template <typename T> struct dtype_ops;

template <> struct dtype_ops<__half> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __half2 h = __floats2half2_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <> struct dtype_ops<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float a, float b)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ void mma(float *c, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                     "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* ------------------------------------------------------------------------ */
/* shared-memory primitives                                                   */
/* ------------------------------------------------------------------------ */

__device__ __forceinline__ uint32_t smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16-byte async copy; src_bytes 0 zero-fills the destination. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)),
                 "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
/* Named barrier id (1..15: 0 is __syncthreads') among n threads (whole warps):
 * bar.sync waits, bar.arrive does not. */
__device__ __forceinline__ void named_bar_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void named_bar_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
/* A barrier of one warpgroup (128 threads), so one warpgroup syncs without
 * stalling the others. */
__device__ __forceinline__ void warpgroup_sync(int id) { named_bar_sync(id, 128); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n"); }
/* Programmatic dependent launch (sm_90; no-ops before): a kernel lets the
 * next one in the stream start launching (its CTAs are then scheduled as SMs
 * free up and wait in pdl_wait_primary until this grid has finished and its
 * writes are visible). Saves the launch gap between two kernels of one call. */
__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait_primary()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
/* Launches kernel<<<grid, block, smem, stream>>>(a), as a programmatic
 * dependent of the kernel ahead of it in the stream when pdl is set and the
 * GPU has it (sm_90 on): its CTAs may then be scheduled while that kernel's
 * last CTAs still run, and wait in griddepcontrol.wait (pdl_wait_primary)
 * before touching what it wrote (or, like the backward's dQ kernel, which
 * reads nothing it wrote, only before it ends: then the two grids end in
 * stream order). */
template <class Args>
fad_status launch_kernel(void (*kernel)(Args), dim3 grid, int block, size_t smem, cudaStream_t stream,
                         int pdl, const Args &a, char *msg, size_t msg_len)
{
    if (pdl) {
        int major = 0;
        fad_status st = fad_cuda_cc_major(&major, msg, msg_len);
        if (st != FAD_OK)
            return st;
        pdl = major >= 9;
    }
    if (!pdl) {
        kernel<<<grid, block, smem, stream>>>(a);
        CUDA_TRY(cudaGetLastError());
        return FAD_OK;
    }
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)block);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, a));
    return FAD_OK;
}

/* A flag between grids that run at once (gpu scope): the writer's release
 * orders its earlier writes (and, after a barrier, its CTA's) before the
 * flag; a poll that acquires it by its own load orders the reader's later
 * reads after them. (Not a relaxed load and fence.acq_rel.gpu: that fence is
 * MEMBAR.ALL.GPU, which also waits for every copy the reader has in flight.) */
__device__ __forceinline__ void st_release_gpu(int *p, int v)
{
    asm volatile("st.release.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* Waits until at most N of this thread's commit groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t *r, uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Row-major [rows][kHeadDim] tile whose 16-byte chunks are XOR-swizzled by
 * row % 8: the 8 rows an ldmatrix phase reads land in 8 different bank groups. */
template <int kHeadDim> __device__ __forceinline__ int swz(int row, int col)
{
    return row * kHeadDim + ((((col >> 3) ^ row) & 7) | ((col >> 3) & ~7)) * 8 + (col & 7);
}

/* The wgmma tile layout (128-byte swizzle, wgmma.cuh): a tile of kRows
 * rows is kHeadDim/64 column blocks of kRows x 64 elements, block after
 * block; chunk c of row r sits at chunk c ^ (r % 8) of its 128-byte row. */
template <int kRows> __host__ __device__ __forceinline__ int swz128(int row, int col)
{
    return (col >> 6) * kRows * 64 + row * 64 + ((((col >> 3) & 7) ^ (row & 7)) << 3) + (col & 7);
}

/* Element offset of (row, col) in a tile of kRows x kHeadDim: the mma.sync
 * layout (swz) or, kSw128, the wgmma one (swz128). */
template <int kHeadDim, int kRows, bool kSw128> __device__ __forceinline__ int tile_off(int row, int col)
{
    return kSw128 ? swz128<kRows>(row, col) : swz<kHeadDim>(row, col);
}

/* A register copy the compiler cannot see through. Re-taken every tile, it
 * stops loop-invariant code motion from hoisting every (kk, j) ldmatrix
 * address out of the tile loop (64+ live registers at D=128); inside the
 * loop the constant parts fold into the instructions' immediate offsets. */
__device__ __forceinline__ uint32_t opaque(uint32_t x)
{
    asm volatile("mov.b32 %0, %0;" : "+r"(x));
    return x;
}

/* ldmatrix addressing without per-(row, col) index math in the hot loop. A
 * thread always reads rows with the same row % 8 (= lane % 8), and chunk
 * 2 * kk + x of a 16-column block kk. So the swizzled column offset depends
 * only on kk % 4: four shared-memory addresses per thread and operand; the
 * rest are compile-time offsets. */
template <int kHeadDim> struct lds_base {
    uint32_t addr[4];
    /* row0: this thread's first row; x: which chunk of the 16-column block */
    __device__ __forceinline__ lds_base(const void *tile, int row0, int x)
    {
#pragma unroll
        for (int c = 0; c < 4; c++)
            addr[c] = smem_addr(tile) + (row0 * kHeadDim + (((2 * c + x) ^ (row0 % 8)) & 7) * 8) * 2;
    }
    /* this base moved by `bytes` (a pipeline stage), re-taken opaquely */
    __device__ __forceinline__ lds_base reload(uint32_t bytes) const
    {
        lds_base r = *this;
#pragma unroll
        for (int c = 0; c < 4; c++)
            r.addr[c] = opaque(addr[c] + bytes);
        return r;
    }
    /* byte address of (row0 + row_off, 16-column block kk); row_off % 8 == 0 */
    __device__ __forceinline__ uint32_t at(int row_off, int kk) const
    {
        return addr[kk % 4] + (row_off * kHeadDim + (kk / 4) * 64) * 2;
    }
};

/* Copies rows [0, rows) x cols [0, D) of a global tile into a swizzled shared
 * tile of kRows x kHeadDim (layout: tile_off), zero-filling everything
 * outside. Offsets inside a tile are 32-bit (the checks bound row_stride * 256
 * below 2^31), which keeps per-chunk 64-bit pointers out of the registers. */
template <typename T, int kHeadDim, int kRows, int kThreads, bool kSw128 = false>
__device__ __forceinline__ void load_tile(T *smem, const T *g, int row_stride, int rows, int D)
{
    constexpr int kChunks = kHeadDim / 8;
    /* (kThreads need not divide the chunks: the dK/dV kernel's producer
     * loads with 96 or 64 threads when its last warps sum dQ, bwd_dkdv_wgmma.cu;
     * the last round is then partial) */
    constexpr int kTotal = kRows * kChunks, kRounds = (kTotal + kThreads - 1) / kThreads;
    /* kSw128 (the wgmma kernel's Q copy, and its K/V copies with
     * FAD_WG_LEAN_LOADS=0): short of registers, so the offsets are not
     * hoisted out of the caller's tile loop */
    const int tid = kSw128 ? (int)opaque(threadIdx.x) : (int)threadIdx.x;
#pragma unroll
    for (int i = 0; i < kRounds; i++) {
        const int c = tid + i * kThreads;
        if (kTotal % kThreads != 0 && c >= kTotal)
            break;
        const int row = c / kChunks, col = (c % kChunks) * 8;
        const bool ok = row < rows && col < D;
        cp_async16(smem + tile_off<kHeadDim, kRows, kSw128>(row, col),
                   g + (ok ? row * row_stride + col : 0), ok ? 16 : 0);
    }
}

/* load_tile with little index math per chunk, for kernels that re-take their
 * copy offsets every tile rather than hold them in registers (the packed
 * kernel, and the wgmma variant of fwd_kernel, which is short of registers
 * and, with 16 chunks per thread per tile, would otherwise spend more issue
 * slots on copy addresses than on its softmax). When a thread's chunks are
 * one column of rows r0, r0 + kStep, ... (kThreads a multiple of the chunks
 * per row), their swizzled shared offsets repeat every 8 rows (in both
 * layouts), so only up to 8 are computed and the rest are immediate offsets;
 * the global offset advances by an opaque step, and a whole tile (every row
 * and column inside) is copied with no per-chunk predicate. Otherwise the
 * generic copy, with the thread index re-taken opaquely so that no per-chunk
 * offset is hoisted out of the caller's tile loop into registers. */
template <typename T, int kHeadDim, int kRows, int kThreads, bool kSw128 = false>
__device__ __forceinline__ void load_tile_lean(T *smem, const T *g, int row_stride, int rows, int D)
{
    constexpr int kChunks = kHeadDim / 8;
    if constexpr (kThreads % kChunks == 0 && kRows % (kThreads / kChunks) == 0) {
        constexpr int kStep = kThreads / kChunks; /* rows apart */
        constexpr int kIters = kRows / kStep;
        /* iterations after which row % 8 repeats */
        constexpr int kPeriod = kStep % 8 == 0 ? 1 : kStep % 4 == 0 ? 2 : kStep % 2 == 0 ? 4 : 8;
        constexpr int kP = kPeriod < kIters ? kPeriod : kIters;
        constexpr int kPitch = kSw128 ? 64 : kHeadDim; /* elements from a row to the next */
        const int tid = (int)opaque(threadIdx.x);
        const int r0 = tid / kChunks, col = (tid % kChunks) * 8;
        uint32_t dst[kP];
#pragma unroll
        for (int j = 0; j < kP; j++)
            dst[j] = smem_addr(smem + tile_off<kHeadDim, kRows, kSw128>(r0 + j * kStep, col));
        const int step = (int)opaque((uint32_t)(kStep * row_stride));
        const T *src = g + r0 * row_stride + col;
        if (rows >= kRows && D == kHeadDim) { /* a whole tile (block-uniform) */
#pragma unroll
            for (int i = 0; i < kIters; i++) {
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                                 dst[i % kP] + (i / kP) * kP * kStep * kPitch * (int)sizeof(T)),
                             "l"(src));
                src += step;
            }
            return;
        }
        const bool col_ok = col < D;
        int off = 0;
#pragma unroll
        for (int i = 0; i < kIters; i++) {
            const bool ok = col_ok && r0 + i * kStep < rows;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                             dst[i % kP] + (i / kP) * kP * kStep * kPitch * (int)sizeof(T)),
                         "l"(g + (ok ? r0 * row_stride + col + off : 0)), "r"(ok ? 16 : 0));
            off += step;
        }
    } else {
        const int tid = (int)opaque(threadIdx.x);
        constexpr int kTotal = kRows * kChunks, kRounds = (kTotal + kThreads - 1) / kThreads;
#pragma unroll
        for (int i = 0; i < kRounds; i++) {
            const int c = tid + i * kThreads;
            if (kTotal % kThreads != 0 && c >= kTotal) /* (a partial last round: load_tile's) */
                break;
            const int row = c / kChunks, col = (c % kChunks) * 8;
            const bool ok = row < rows && col < D;
            cp_async16(smem + tile_off<kHeadDim, kRows, kSw128>(row, col),
                       g + (ok ? row * row_stride + col : 0), ok ? 16 : 0);
        }
    }
}

/* The A fragment of P (or dS) for key block kk (16 keys) of one m16 row
 * tile, packed to the input dtype straight from the accumulators: blocks 2kk
 * and 2kk+1 of the accumulator are exactly the A layout's two column halves. */
template <typename T, int kNB>
__device__ __forceinline__ void p_fragment(const float (&s)[kNB][4], int kk, uint32_t (&pf)[4])
{
    pf[0] = dtype_ops<T>::pack(s[2 * kk][0], s[2 * kk][1]);
    pf[1] = dtype_ops<T>::pack(s[2 * kk][2], s[2 * kk][3]);
    pf[2] = dtype_ops<T>::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pf[3] = dtype_ops<T>::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

/* Sum over the 4 lanes that hold one row, in a fixed order. */
__device__ __forceinline__ float quad_sum(float x)
{
    x = FAD_ADD(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return FAD_ADD(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

#endif /* FAD_MMA_CUH */
