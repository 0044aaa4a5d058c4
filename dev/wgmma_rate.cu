// wgmma_rate.cu: How many FLOP a cycle one SM's warpgroup MMAs reach per instruction shape and operand source, alone and beside shared-memory stores. Verdict: every n64/n128 shape reaches the peak alone; beside 4-8 KB of shared stores a group the m64n64 SS shapes lose a fifth, m64n128 SS 1%, RS none; m64n32 SS (either A layout) reaches 67% alone and 48-49% beside stores (benchmarks/results/2026-11-29_h200_bwd_early_store_epilogue_b5f25c9.md, benchmarks/results/2026-11-29_h200_wgmma_n32_d256_2139cc1.md).
// wgmma_rate.cu — the tensor pipe's rate per wgmma shape, in FLOP per SM cycle (clock64), so that
// a kernel's products can be judged against what their shape can reach (the five-product
// backward's D128 step: tensor pipe 56% busy; docs/performance.md).
//
// One CTA per SM, W math warpgroups (1 or 2), each issuing `groups` groups of 8 k16 wgmmas
// (K = 128) into two accumulators in turn (as S^T then dP^T), at most two groups in flight
// (wait_group 1 after each commit). Shapes and operand sources:
//   ss64:   m64n64k16,  A and B from shared memory (K-major)     the backward's S^T, dP^T
//   ssmn64: m64n64k16,  A K-major, B MN-major (both shared)      the backward's dQ = dS K
//   ss128:  m64n128k16, A and B from shared memory
//   rs64:   m64n64k16,  A from registers, B K-major
//   rs128:  m64n128k16, A from registers, B MN-major             the backward's dV, dK
//   ss32:   m64n32k16,  A and B from shared memory (K-major)     a D256 step of 32 query rows: S^T, dP^T
//   ssta32: m64n32k16,  A MN-major (transposed), B K-major       its dQ^T = K^T dS^T (A: sK read [key][col])
// Shared memory per k16 instruction: SS reads 64x16 + Nx16 bf16, RS Nx16; at 4096 FLOP a cycle
// an m64n64k16 SS instruction (131072 FLOP, 32 cycles) reads 4 KB: 128 B a cycle, all of the
// SM's shared-memory bandwidth. In the `sts` runs each math warpgroup also stores `sts` KB of
// 16-byte chunks into a buffer of its own after issuing each group, while the group runs (as the
// backward's math warps store the dQ tile and dS while products are in flight; the copy engine's
// landing traffic competes so too), to show what the SS shapes lose to other shared traffic.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc dev/wgmma_rate.cu -o /tmp/wgmma_rate
//   /tmp/wgmma_rate            (prints one line per case: FLOP/cycle/SM and % of 4096)
#include <cstdio>
#include <cstdlib>
#include <cuda_bf16.h>

#include "cuda/wgmma.cuh"

#include "cuda_check.h"

using T = __nv_bfloat16;
enum Kind { kSS64, kSSMN64, kSS128, kRS64, kRS128, kSS32, kSSTA32 };

// m64n32k16 with A stored [k][m] (MN-major: trans-a), B K-major; no kernel uses it yet.
__device__ __forceinline__ void wgmma_ss_ta32(float (&d)[4][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " FAD_R16 ", %16, %17, p, 1, 1, 1, 0;\n}\n"
                 : FAD_ACC16
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
constexpr int kK = 128;                      // reduction dim of a group: 8 k16 instructions
constexpr int kOperandBytes = 128 * kK * 2;  // one 128-row swz128 operand tile
constexpr int kStsBytes = 32 * 1024;         // the store warp's buffer

struct result {
    long long cycles; // of the slowest math warpgroup's loop
    float sink;       // keeps the accumulators live
};

template <int NB> __device__ __forceinline__ float sum_acc(float (&d)[NB][4])
{
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < NB; j++)
        s += d[j][0] + d[j][1] + d[j][2] + d[j][3];
    return s;
}

// One group: 8 k16 instructions of the kind into d (the first overwrites it).
template <Kind kKind, int NB>
__device__ __forceinline__ void group(float (&d)[NB][4], uint32_t (&a)[kK / 16][4], uint32_t a_addr,
                                      uint32_t b_addr)
{
    const uint64_t a_desc = gmma_desc(a_addr, 16, 1024);
    const uint64_t b_k = gmma_desc(b_addr, 16, 1024), b_mn = gmma_desc(b_addr, kK * 128, 1024);
    const uint64_t a_mn = gmma_desc(a_addr, kK * 128, 1024);
    if constexpr (kKind == kRS64 || kKind == kRS128) /* (as the kernels' fragments: fresh values to ptxas) */
        wgmma_fence_operand(a);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk++) {
        const uint32_t k_off = ((kk / 4) * 128 * 64 + (kk % 4) * 16) * 2; // K-major chunk (bwd_tile_wgmma.cuh)
        if constexpr (kKind == kSSTA32) // (A [k][m]: 16 k rows of 128 bytes per chunk, as V in P V)
            wgmma_ss_ta32(d, gmma_desc_at(a_mn, kk * 16 * 128), gmma_desc_at(b_k, k_off), kk > 0);
        else if constexpr (kKind == kSS64 || kKind == kSS128 || kKind == kSS32)
            wgmma_ss(d, gmma_desc_at(a_desc, k_off), gmma_desc_at(b_k, k_off), (const T *)nullptr, kk > 0);
        else if constexpr (kKind == kSSMN64)
            wgmma_ss_mnb(d, gmma_desc_at(a_desc, k_off), gmma_desc_at(b_mn, kk * 16 * 128), (const T *)nullptr, kk > 0);
        else if constexpr (kKind == kRS64)
            wgmma_rs_kmajor(d, a[kk], gmma_desc_at(b_k, k_off), (const T *)nullptr, kk > 0);
        else
            wgmma_rs_mnmajor(d, a[kk], gmma_desc_at(b_mn, kk * 16 * 128), (const T *)nullptr, kk > 0);
    }
    wgmma_commit();
}

// Shapes: blockDim = 128 W; shared: the A and B tiles, then the warpgroups' store buffers.
template <Kind kKind, int NB>
__global__ void __launch_bounds__(256, 1) rate_kernel(int groups, int math_wgs, int sts_chunks, result *out)
{
    extern __shared__ __align__(1024) unsigned char smem[];
    const uint32_t a_addr = smem_addr(smem), b_addr = a_addr + kOperandBytes;
    // operands: small nonzero bf16 values (what they are does not change the rate)
    for (int i = threadIdx.x; i < 2 * kOperandBytes / 2; i += blockDim.x)
        reinterpret_cast<T *>(smem)[i] = __float2bfloat16(0.001f * (i % 7));
    fence_async_smem();
    __syncthreads();
    const int wg = threadIdx.x / 128;
    uint4 *buf = reinterpret_cast<uint4 *>(smem + 2 * kOperandBytes + wg * kStsBytes);
    const uint4 v = make_uint4(threadIdx.x, 1, 2, 3);
    auto stores = [&]() { // this warpgroup's sts_chunks, while its group runs
        for (int c = threadIdx.x % 128; c < sts_chunks; c += 128)
            buf[c] = v;
    };
    uint32_t a[kK / 16][4];
#pragma unroll
    for (int kk = 0; kk < kK / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++)
            a[kk][r] = 0x3c003c00u ^ (threadIdx.x + kk + r); // bf16 pairs near 1
    float d0[NB][4], d1[NB][4];
    const uint32_t wg_a = a_addr + (uint32_t)(wg % 2) * 64 * 128; // each warpgroup its 64 rows
    __syncwarp();
    const long long t0 = clock64();
    for (int g = 0; g < groups; g += 2) {
        group<kKind>(d0, a, wg_a, b_addr);
        stores();
        wgmma_wait<1>();
        group<kKind>(d1, a, wg_a, b_addr);
        stores();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    wgmma_fence_operand(d0);
    wgmma_fence_operand(d1);
    const long long t1 = clock64();
    if (threadIdx.x % 128 == 0) {
        atomicMax(&out[blockIdx.x].cycles, t1 - t0);
        atomicAdd(&out[blockIdx.x].sink, sum_acc(d0) + sum_acc(d1));
    }
}

template <Kind kKind, int NB>
void run(const char *name, int math_wgs, int sts_kb, int sms, result *d_out)
{
    const int groups = 4096, sts_chunks = sts_kb * 1024 / 16;
    const int threads = 128 * math_wgs;
    const size_t smem = 2 * kOperandBytes + 2 * kStsBytes;
    auto kernel = rate_kernel<kKind, NB>;
    CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CHECK(cudaMemset(d_out, 0, sms * sizeof(result)));
    kernel<<<sms, threads, smem>>>(groups, math_wgs, sts_chunks, d_out); // warm-up
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemset(d_out, 0, sms * sizeof(result)));
    kernel<<<sms, threads, smem>>>(groups, math_wgs, sts_chunks, d_out);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    result *h = (result *)malloc(sms * sizeof(result));
    CHECK(cudaMemcpy(h, d_out, sms * sizeof(result), cudaMemcpyDeviceToHost));
    long long worst = 0;
    for (int i = 0; i < sms; i++)
        worst = h[i].cycles > worst ? h[i].cycles : worst;
    free(h);
    const double flop = 2.0 * 64 * (8 * NB) * kK * groups * math_wgs; // one SM's
    printf("%-7s wgs %d  sts %2d KB/group  %7.0f FLOP/cycle/SM  %5.1f%% of 4096\n", name, math_wgs, sts_kb,
           flop / worst, 100.0 * flop / worst / 4096);
}

int main()
{
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    result *d_out;
    CHECK(cudaMalloc(&d_out, sms * sizeof(result)));
    for (int wgs = 1; wgs <= 2; wgs++)
        for (int sts : {0, 4, 8}) {
            if (wgs == 1 && sts)
                continue;
            run<kSS64, 8>("ss64", wgs, sts, sms, d_out);
            run<kSSMN64, 8>("ssmn64", wgs, sts, sms, d_out);
            run<kSS128, 16>("ss128", wgs, sts, sms, d_out);
            run<kRS64, 8>("rs64", wgs, sts, sms, d_out);
            run<kRS128, 16>("rs128", wgs, sts, sms, d_out);
            run<kSS32, 4>("ss32", wgs, sts, sms, d_out);
            run<kSSTA32, 4>("ssta32", wgs, sts, sms, d_out);
        }
    CHECK(cudaFree(d_out));
    return 0;
}
