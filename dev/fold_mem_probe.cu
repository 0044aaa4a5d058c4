// fold_mem_probe.cu: What a D256 fold's trip through global memory costs, by itself, against the number of CTAs doing it at once. Verdict: an SM writes about 32 B a cycle (128 KB in 3,900-4,300 cycles) by any store form or the copy engine, from 1 CTA to 132; loads 2.5x faster (benchmarks/results/2026-11-30_h200_fwd_d256_fold_stores.md, section 2).
// fold_mem_probe.cu — the memory side of the sm_90a D256 forward's fold (fwd_prefill_ws.cu,
// kRGlobal): at each split's end every consumer thread reads its 128 fp32 values of R's o
// from its warp's slot in global memory (lane-interleaved: value i of lane l at i * 32 + l, so a
// warp's access is one 128-byte line), merges, and writes them back: 64 KB read and 64 KB
// written a consumer, two consumers a CTA, every CTA at the same split boundary. This probe
// runs only that: 256 threads a CTA (two "consumers"), N CTAs (one an SM: 140 KB of shared
// memory each keeps a second off), `reps` folds in a row with a spin of `gap` cycles between
// them (the split's tiles), and reports the cycles a fold takes, per CTA count and access form:
//   ldst:   the kernel's form (4-byte loads in batches of 8, FMA, 4-byte stores)
//   st:     stores only (what the "no R loads" timing probe kept)
//   ld:     loads only (what the "no stores" probe kept, had ptxas not dropped them)
//   ldst4:  16-byte loads and stores (a thread's four values of an n8 block together)
//   st4:    16-byte stores only
//   bstbig: stores only, each warp's whole 16 KB staged at once and handed to the copy engine
//           as one bulk copy, timed until its writes are done (128 KB of staging a CTA: the copy
//           engine's own rate)
//   ldstcg: the kernel's form with st.global.cg (L2 only) stores
//   bst:    stores only, through shared memory: each warp writes 2 KB chunks (16 values a lane,
//           the slot's own order) into one of two 2 KB staging buffers and lane 0 hands each to
//           the copy engine (cp.async.bulk, global from shared), waiting before it reuses a
//           buffer until the engine has read it (32 KB of staging a CTA: the long variant's
//           shared part of R)
//   ldbst:  the kernel's loads and merge, the stores as in bst
// If a fold's cycles stay flat from 1 CTA to 132, the cost is the SM's own store stream; if they
// grow, the GPU's memory system is shared by all the CTAs folding at once.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/fold_mem_probe.cu -o fold_mem_probe
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>

#include "cuda_check.h"

constexpr int kVals = 128;   // fp32 values of R's o a consumer thread (64 rows x 256 cols / 128)
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSlotFloats = kVals * 32; // a warp's slot (16 KB)

enum form { ldst, st, ld, ldst4, ldstcg, bst, ldbst, st4, bstbig };
constexpr int kChunkVals = 16; // a lane's values in a 2 KB chunk of its warp's slot

__device__ __forceinline__ void spin(long long cycles)
{
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
}

template <int kForm>
__global__ void __launch_bounds__(kThreads, 1) fold_kernel(float *slots, int reps, long long gap, long long *cycles)
{
    extern __shared__ unsigned char smem[]; // (only keeps a second CTA off the SM)
    (void)smem;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float *g = slots + ((size_t)blockIdx.x * kWarps + warp) * kSlotFloats + lane;
    float acc[kVals];
#pragma unroll
    for (int i = 0; i < kVals; i++)
        acc[i] = (float)(i + threadIdx.x);
    long long total = 0;
    for (int r = 0; r < reps; r++) {
        spin(gap);
        __syncthreads();
        const long long t0 = clock64();
        if constexpr (kForm == bstbig) {
            float *stage = reinterpret_cast<float *>(smem) + warp * kSlotFloats;
#pragma unroll
            for (int i = 0; i < kVals; i++)
                stage[i * 32 + lane] = acc[i];
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncwarp();
            if (lane == 0) {
                asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                                 slots + ((size_t)blockIdx.x * kWarps + warp) * kSlotFloats),
                             "r"((uint32_t)__cvta_generic_to_shared(stage)), "r"(kSlotFloats * 4)
                             : "memory");
                asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
            }
            __syncwarp();
        } else if constexpr (kForm == bst || kForm == ldbst) {
            float *stage = reinterpret_cast<float *>(smem) + warp * 2 * 32 * kChunkVals;
            float *gw = slots + ((size_t)blockIdx.x * kWarps + warp) * kSlotFloats;
#pragma unroll
            for (int c = 0; c < kVals / kChunkVals; c++) {
                float *buf = stage + (c % 2) * 32 * kChunkVals;
                if (c >= 2) { // (the engine has read the buffer's last chunk)
                    if (lane == 0)
                        asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
                    __syncwarp();
                }
#pragma unroll
                for (int b = 0; b < kChunkVals; b += 8) {
                    float v[8];
#pragma unroll
                    for (int u = 0; u < 8; u++)
                        v[u] = kForm == bst ? 0.f : g[(c * kChunkVals + b + u) * 32];
#pragma unroll
                    for (int u = 0; u < 8; u++)
                        buf[(b + u) * 32 + lane] = fmaf(v[u], 0.5f, acc[c * kChunkVals + b + u]);
                }
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                __syncwarp();
                if (lane == 0) {
                    const uint32_t src = (uint32_t)__cvta_generic_to_shared(buf);
                    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(
                                     gw + c * 32 * kChunkVals),
                                 "r"(src), "r"(32 * kChunkVals * 4)
                                 : "memory");
                    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                }
            }
            if (lane == 0) // (done: before the next fold's loads, as the kernel's next fold would)
                asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
            __syncwarp();
        } else if constexpr (kForm == ldst4 || kForm == st4) {
            float4 *g4 = reinterpret_cast<float4 *>(slots + ((size_t)blockIdx.x * kWarps + warp) * kSlotFloats) + lane;
#pragma unroll
            for (int b = 0; b < kVals / 4; b += 4) {
                float4 v[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    v[u] = kForm == st4 ? make_float4(0.f, 0.f, 0.f, 0.f) : g4[(b + u) * 32];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float4 w = v[u];
                    w.x = fmaf(w.x, 0.5f, acc[4 * (b + u)]);
                    w.y = fmaf(w.y, 0.5f, acc[4 * (b + u) + 1]);
                    w.z = fmaf(w.z, 0.5f, acc[4 * (b + u) + 2]);
                    w.w = fmaf(w.w, 0.5f, acc[4 * (b + u) + 3]);
                    g4[(b + u) * 32] = w;
                }
                __syncwarp();
            }
        } else {
#pragma unroll
            for (int b = 0; b < kVals; b += 8) {
                float v[8];
#pragma unroll
                for (int u = 0; u < 8; u++)
                    v[u] = kForm == st ? 0.f : g[(b + u) * 32];
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const float w = fmaf(v[u], 0.5f, acc[b + u]);
                    if constexpr (kForm == ld)
                        acc[b + u] = w;
                    else if constexpr (kForm == ldstcg)
                        __stcg(&g[(b + u) * 32], w);
                    else
                        g[(b + u) * 32] = w;
                }
                __syncwarp();
            }
        }
        __syncthreads();
        total += clock64() - t0;
    }
    if constexpr (kForm == bst || kForm == ldbst || kForm == bstbig)
        if (lane == 0)
            asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
    float keep = 0.f;
#pragma unroll
    for (int i = 0; i < kVals; i++)
        keep += acc[i];
    if (threadIdx.x == 0)
        cycles[blockIdx.x] = total;
    if (keep == 12345.f) // (keeps the loads-only form's loads)
        slots[0] = keep;
}

template <int kForm> double run(float *slots, long long *d_cycles, int ctas, int reps, long long gap)
{
    const int smem = 140 * 1024;
    CHECK(cudaFuncSetAttribute(fold_kernel<kForm>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    fold_kernel<kForm><<<ctas, kThreads, smem>>>(slots, reps, gap, d_cycles); // (warm-up)
    CHECK(cudaGetLastError());
    fold_kernel<kForm><<<ctas, kThreads, smem>>>(slots, reps, gap, d_cycles);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<long long> c(ctas);
    CHECK(cudaMemcpy(c.data(), d_cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
    double s = 0;
    for (long long x : c)
        s += (double)x;
    return s / ctas / reps;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 16;
    const long long gap = argc > 2 ? atoll(argv[2]) : 20000;
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *slots;
    long long *d_cycles;
    CHECK(cudaMalloc(&slots, (size_t)sms * kWarps * kSlotFloats * sizeof(float)));
    CHECK(cudaMemset(slots, 0, (size_t)sms * kWarps * kSlotFloats * sizeof(float)));
    CHECK(cudaMalloc(&d_cycles, sms * sizeof(long long)));
    printf("cycles a fold (128 KB read and/or written a CTA), %d folds, %lld-cycle gaps\n", reps, gap);
    printf("| CTAs | ldst | st | ld | ldst4 | ldstcg | bst | ldbst | st4 | bstbig |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    const int counts[] = {1, 8, 33, 66, 99, sms};
    for (int n : counts) {
        printf("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", n, run<ldst>(slots, d_cycles, n, reps, gap),
               run<st>(slots, d_cycles, n, reps, gap), run<ld>(slots, d_cycles, n, reps, gap),
               run<ldst4>(slots, d_cycles, n, reps, gap), run<ldstcg>(slots, d_cycles, n, reps, gap),
               run<bst>(slots, d_cycles, n, reps, gap), run<ldbst>(slots, d_cycles, n, reps, gap),
               run<st4>(slots, d_cycles, n, reps, gap), run<bstbig>(slots, d_cycles, n, reps, gap));
    }
    CHECK(cudaFree(slots));
    CHECK(cudaFree(d_cycles));
    return 0;
}
