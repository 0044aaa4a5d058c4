// reduce_bw_probe.cu: How many bytes a second the copy engine's fp32 bulk reduce-adds (cp.reduce.async.bulk .add.f32, the five-product backward's dQ adds) land from every SM at once, against bulk stores and the footprint. Verdict: about 25 B a cycle an SM; 3.7 TB/s from 132 SMs while the tiles stay in L2 (stores 4.6), 1.4-1.7 TB/s once they do not: a D256 five-product backward would need about 3.2 (benchmarks/results/2026-11-30_h200_bwd_d256_by_product.md, section 3).
// reduce_bw_probe.cu — the memory side of a five-product backward at D256 (docs/performance.md):
// each dK/dV step would add a 32-row x 256-column fp32 dQ tile (32 KB) to the accumulator, twice
// the bytes a flop of D128's 64 x 128 tiles a 128-key step. This probe runs only those adds: one
// CTA an SM (a 2 x 32 KB staging buffer keeps a second off), thread 0 hands the copy engine one
// chunk after another (`inflight` in flight, each buffer reused once the engine has read it, as
// bwd_dq_accum.cuh's dq_add_start does), each chunk to a tile of the CTA's own set of `tiles`
// tiles in turn, so the accumulator's footprint is CTAs x tiles x chunk:
//   red:   cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 (the dQ adds)
//   st:    cp.async.bulk.global.shared::cta.bulk_group (a plain bulk store of the same bytes)
//   redsh: red, every CTA adding to the same `tiles` tiles (contention on the same lines)
// It prints, per form and footprint, the landed bytes a second of the whole GPU and a CTA's
// bytes a cycle.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a dev/reduce_bw_probe.cu -o reduce_bw_probe
//   ./reduce_bw_probe [ctas] [reps]
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>

#include "cuda_check.h"

constexpr int kChunk = 32 * 1024; // one 32 x 256 fp32 tile
constexpr int kBufs = 2;
constexpr int kThreads = 128;

enum form { red, st, redsh };

template <int kForm>
__global__ void __launch_bounds__(kThreads, 1) add_kernel(float *acc, int tiles, int reps, int inflight,
                                                          long long *cycles)
{
    extern __shared__ __align__(128) unsigned char smem[];
    float *buf = reinterpret_cast<float *>(smem);
    for (int i = threadIdx.x; i < kBufs * kChunk / 4; i += kThreads)
        buf[i] = 1e-3f * (float)(i % 1000); // (finite, non-zero values)
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); // (the engine reads them)
    __syncthreads();
    if (threadIdx.x != 0)
        return;
    const long long t0 = clock64();
    const size_t base = kForm == redsh ? 0 : (size_t)blockIdx.x * tiles;
    for (int r = 0; r < reps; r++) {
        float *dst = acc + (base + (size_t)(r % tiles)) * (kChunk / 4);
        const uint32_t src = (uint32_t)__cvta_generic_to_shared(smem + (r % kBufs) * kChunk);
        if (kForm == st)
            asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                         "r"(kChunk)
                         : "memory");
        else
            asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                         "r"(src), "r"(kChunk)
                         : "memory");
        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
        // (the next chunk reuses a buffer: keep at most `inflight` groups unread)
        if (inflight == 1)
            asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
        else
            asm volatile("cp.async.bulk.wait_group.read 1;\n" ::: "memory");
    }
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); // every add landed
    cycles[blockIdx.x] = clock64() - t0;
}

template <int kForm>
static void run(const char *name, float *acc, int ctas, int tiles, int reps, int inflight, long long *d_cycles)
{
    CHECK(cudaFuncSetAttribute(add_kernel<kForm>, cudaFuncAttributeMaxDynamicSharedMemorySize, kBufs * kChunk));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    add_kernel<kForm><<<ctas, kThreads, kBufs * kChunk>>>(acc, tiles, reps, inflight, d_cycles); // warm-up
    CHECK(cudaGetLastError());
    CHECK(cudaEventRecord(e0));
    add_kernel<kForm><<<ctas, kThreads, kBufs * kChunk>>>(acc, tiles, reps, inflight, d_cycles);
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    float ms = 0.f;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    std::vector<long long> cyc(ctas);
    CHECK(cudaMemcpy(cyc.data(), d_cycles, ctas * sizeof(long long), cudaMemcpyDeviceToHost));
    long long most = 0;
    for (long long c : cyc)
        most = c > most ? c : most;
    const double bytes = (double)ctas * reps * kChunk;
    const double foot_mb = (kForm == redsh ? 1.0 : (double)ctas) * tiles * kChunk / 1e6;
    printf("%-6s ctas %3d tiles/CTA %4d footprint %8.1f MB inflight %d: %7.3f ms  %6.2f TB/s  %5.1f B/cycle a CTA\n",
           name, ctas, tiles, foot_mb, inflight, ms, bytes / (ms * 1e-3) / 1e12, (double)reps * kChunk / most);
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
}

int main(int argc, char **argv)
{
    const int ctas_max = argc > 1 ? atoi(argv[1]) : 132;
    const int reps = argc > 2 ? atoi(argv[2]) : 2000;
    const int tiles_max = 64; // 132 x 64 x 32 KB = 277 MB: about the D256 L4k accumulator
    float *acc;
    long long *d_cycles;
    CHECK(cudaMalloc(&acc, (size_t)ctas_max * tiles_max * kChunk));
    CHECK(cudaMemset(acc, 0, (size_t)ctas_max * tiles_max * kChunk));
    CHECK(cudaMalloc(&d_cycles, ctas_max * sizeof(long long)));
    for (int inflight = 1; inflight <= 2; inflight++)
        for (int ctas : {1, 16, 66, ctas_max}) {
            if (ctas > ctas_max)
                continue;
            for (int tiles : {4, 16, tiles_max}) {
                run<st>("st", acc, ctas, tiles, reps, inflight, d_cycles);
                run<red>("red", acc, ctas, tiles, reps, inflight, d_cycles);
            }
        }
    for (int tiles : {1, 8, 64})
        run<redsh>("redsh", acc, ctas_max, tiles, reps / 4, 2, d_cycles);
    CHECK(cudaFree(acc));
    CHECK(cudaFree(d_cycles));
    return 0;
}
