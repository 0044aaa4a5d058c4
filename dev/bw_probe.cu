// bw_probe.cu: How fast one CTA per SM can stream a decode split's K/V. Verdict: cp.async reaches 3.3 TB/s (10.1 us for 8k keys, H200); 256-byte bulk copies took 35 us, so decode keeps cp.async. `big`: B16 x 8k keys read at best in 123.2 us (4.36 TB/s), where cuDNN's whole decode call takes 122.5; `runs`: the one-sequence runs' reads at 123.9 us, a CTA a split's at 122.6 (benchmarks/results/2026-12-01_h200_decode_even_rows_placement.md, sections 5-6).
// bw_probe.cu — how fast can one CTA per SM stream a decode split's K/V into shared memory?
//
// The read pattern of the packed decode kernel at batch 1 (Hkv 8, D 128, bf16, cache 8k):
// CTA (split s, kv head hk) reads keys [512 s, 512 s + 512) of head hk, K and V, as 64-key
// tiles of 2 x 16 KB; a key's 256 bytes of one head sit 2 KB (Hkv x D x 2) from the next key's.
// 128 CTAs of 128 threads, a ring of `stages` tiles in shared memory. The CTA only touches
// each landed tile (one word per thread), so the time is the memory system's.
// Copy engines compared:
//   lsu:  cp.async.cg 16 B per thread (the kernel's load_tile_lean), one commit group per tile;
//   bulk: cp.async.bulk 256 B per key row (warp 0 issues 4 rows per lane), an mbarrier per stage
//         with complete_tx, the consumers wait on its phase.
// and the layout: "heads" (the cache's (L, Hkv, D), 2 KB stride) or "flat" (each CTA's rows
// contiguous, 256 B stride), as a control.
// `bw_probe big`: the read ceiling of a batched decode call, B16 x 8k keys (537 MB of K and V, as
// one 131,072-key cache: a batch's sequences follow each other), CTAs of 512-8,192 keys a kv
// head, 2-6 stages (3 CTAs an SM at 2, 2 at 3, 1 from 4), cp.async only. `bw_probe runs`: B1 x 128k keys
// in the packed kernel's runs (33 CTAs a kv head, every 33rd split), with and without its barrier
// and release at each split's end, beside one segment a CTA.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Idev dev/bw_probe.cu -o bw_probe
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_check.h"

constexpr int kRowBytes = 256;            // one head's D 128 bf16
constexpr int kTileRows = 64;             // keys per tile
constexpr int kTileBytes = kTileRows * kRowBytes; // one of K, V
constexpr int kThreads = 128;

struct args {
    const char *k, *v;   // caches
    int64_t key_stride;  // bytes from one key to the next of the same head
    int64_t head_stride; // bytes from head hk to hk + 1 (same key)
    int heads;           // CTAs per split
    int rows;            // keys per segment (a CTA's split)
    int splits, stride;  // segments of a head; CTA y walks segments y, y + stride, .. < splits
    int seg_sync;        // 1: a CTA barrier and thread 0's release store at each segment's end
    unsigned *flags;     // seg_sync: a word a segment and head
    unsigned *sink;
};

__device__ __forceinline__ uint32_t smem_u32(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

template <int kStages, bool kBulk>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(const args a)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) uint64_t bar[kStages];
    const int tid = threadIdx.x;
    const int hk = blockIdx.x % a.heads, y = blockIdx.x / a.heads;
    const int tps = a.rows / kTileRows; // tiles a segment
    const int tiles = (a.splits - y + a.stride - 1) / a.stride * tps;
    auto key_of = [&](int t) { return (int64_t)(y + t / tps * a.stride) * a.rows + t % tps * kTileRows; };
    if (kBulk && tid == 0) {
        for (int i = 0; i < kStages; i++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_u32(&bar[i])));
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int t, int st) {
        unsigned char *dk = smem + (size_t)st * 2 * kTileBytes, *dv = dk + kTileBytes;
        const char *gk = a.k + key_of(t) * a.key_stride + hk * a.head_stride;
        const char *gv = a.v + key_of(t) * a.key_stride + hk * a.head_stride;
        if constexpr (kBulk) {
            if (tid < 32) {
                const uint32_t b = smem_u32(&bar[st]);
                if (tid == 0)
                    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(b),
                                 "r"(2 * kTileBytes) : "memory");
                __syncwarp();
                for (int r = tid; r < kTileRows; r += 32) {
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                                 "[%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dk + r * kRowBytes)),
                                 "l"(gk + r * a.key_stride), "r"(kRowBytes), "r"(b) : "memory");
                    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                                 "[%0], [%1], %2, [%3];\n" ::"r"(smem_u32(dv + r * kRowBytes)),
                                 "l"(gv + r * a.key_stride), "r"(kRowBytes), "r"(b) : "memory");
                }
            }
        } else {
            // 16 B per thread per instruction: 16 chunks per row, 8 rows per pass
            for (int c = tid; c < kTileRows * 16; c += kThreads) {
                const int r = c / 16, col = (c % 16) * 16;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                                 smem_u32(dk + r * kRowBytes + col)), "l"(gk + r * a.key_stride + col));
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                                 smem_u32(dv + r * kRowBytes + col)), "l"(gv + r * a.key_stride + col));
            }
            asm volatile("cp.async.commit_group;\n" ::);
        }
    };
    for (int st = 0; st < kStages - 1; st++) {
        if (st < tiles)
            issue(st, st);
        else if (!kBulk)
            asm volatile("cp.async.commit_group;\n" ::);
    }
    unsigned acc = 0;
    for (int t = 0; t < tiles; t++) {
        const int st = t % kStages;
        if constexpr (kBulk) {
            const uint32_t b = smem_u32(&bar[st]), parity = (t / kStages) & 1;
            uint32_t done = 0;
            while (!done)
                asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                             " selp.u32 %0, 1, 0, p;\n}\n" : "=r"(done) : "r"(b), "r"(parity) : "memory");
        } else {
            asm volatile("cp.async.wait_group %0;\n" ::"n"(kStages - 2));
        }
        __syncthreads(); // the tile is everyone's; every thread is done with the stage reloaded next
        if (t + kStages - 1 < tiles)
            issue(t + kStages - 1, (t + kStages - 1) % kStages);
        else if (!kBulk)
            asm volatile("cp.async.commit_group;\n" ::);
        const unsigned *w = (const unsigned *)(smem + (size_t)st * 2 * kTileBytes);
        acc += w[tid * 7 % (2 * kTileBytes / 4)];
        if (a.seg_sync && (t + 1) % tps == 0) { // as the packed kernel's runs at each split's end
            __syncthreads();
            if (tid == 0)
                asm volatile("st.release.gpu.global.u32 [%0], %1;\n" ::"l"(
                                 a.flags + (size_t)(y + t / tps * a.stride) * a.heads + hk), "r"(acc | 1u) : "memory");
        }
    }
    if (acc == 0x12345678u)
        a.sink[blockIdx.x] = acc;
}

template <int kStages, bool kBulk>
static float time_it(const args &a, int ctas, int reps)
{
    const size_t smem = (size_t)kStages * 2 * kTileBytes;
    CHECK(cudaFuncSetAttribute(stream_kernel<kStages, kBulk>,
                               cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int i = 0; i < reps + 3; i++) {
        CHECK(cudaEventRecord(e0));
        stream_kernel<kStages, kBulk><<<ctas, kThreads, smem>>>(a);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (i >= 3)
            ts.push_back(ms * 1e3f);
    }
    CHECK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    return ts[ts.size() / 2];
}

/* K and V of L keys x Hkv heads in the cache's layout (a key's heads side by side), a sink, and
 * a flag a (split, head) for `seg_sync`: the `big` and `runs` modes' memory. */
struct cache_mem {
    int L, Hkv;
    size_t cache; // bytes of one of K, V
    char *buf;
    unsigned *sink, *flags;
    explicit cache_mem(int L_, int Hkv_) : L(L_), Hkv(Hkv_), cache((size_t)L_ * Hkv_ * kRowBytes)
    {
        CHECK(cudaMalloc(&buf, 2 * cache));
        CHECK(cudaMemset(buf, 1, 2 * cache));
        CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
        CHECK(cudaMalloc(&flags, (size_t)L * Hkv * sizeof(unsigned))); // (at least a word a split)
    }
    ~cache_mem()
    {
        CHECK(cudaFree(buf));
        CHECK(cudaFree(sink));
        CHECK(cudaFree(flags));
    }
    /* CTA y of a head walks the `rows`-key segments y, y + stride, .. */
    args walk(int rows, int stride, int sync) const
    {
        args a;
        a.k = buf, a.v = buf + cache;
        a.key_stride = (int64_t)Hkv * kRowBytes, a.head_stride = kRowBytes;
        a.heads = Hkv, a.rows = rows, a.sink = sink;
        a.splits = L / rows, a.stride = stride, a.seg_sync = sync, a.flags = flags;
        return a;
    }
    void report(const char *what, float us) const
    {
        printf("  %-52s %7.1f us  %5.2f TB/s\n", what, us, 2.0 * cache / (us * 1e-6) / 1e12);
    }
};

/* `big`: B16 x 8k keys as one cache, CTAs of `rows` keys a kv head, cp.async at 2-6 stages */
static void read_ceiling()
{
    const cache_mem m(16 * 8192, 8);
    printf("B16 x 8k keys, Hkv 8, D 128: K+V %.1f MB per call; median of 20\n", 2.0 * m.cache / 1e6);
    for (int rows : {8192, 4096, 2048, 512}) {
        const args a = m.walk(rows, m.L / rows, 0);
        const int ctas = m.L / rows * m.Hkv;
        const float us[5] = {time_it<2, false>(a, ctas, 20), time_it<3, false>(a, ctas, 20),
                             time_it<4, false>(a, ctas, 20), time_it<5, false>(a, ctas, 20),
                             time_it<6, false>(a, ctas, 20)};
        for (int i = 0; i < 5; i++) {
            char what[64];
            snprintf(what, sizeof what, "%5d CTAs x %5d keys, %d stages", ctas, rows, i + 2);
            m.report(what, us[i]);
        }
    }
}

/* `runs`: B1 x 128k keys read as the packed kernel's runs do: 33 CTAs a kv head (a wave at two an
 * SM), CTA y walking the 512-key splits y, y + 33, ..; with and without a barrier and a release at
 * each split's end; against the same keys in one segment a CTA (256 x 4096, 2048 x 512). */
static void read_runs()
{
    const cache_mem m(131072, 8);
    const int split = 512, splits = m.L / split, H = m.Hkv;
    printf("B1 x 128k keys, Hkv 8, D 128: K+V %.1f MB per call; median of 20\n", 2.0 * m.cache / 1e6);
    m.report("runs: 264 CTAs, splits y + 33k, 3 stages", time_it<3, false>(m.walk(split, 33, 0), 33 * H, 20));
    m.report("runs, a barrier and a release a split, 3 stages", time_it<3, false>(m.walk(split, 33, 1), 33 * H, 20));
    m.report("runs: 264 CTAs, 4 stages (one an SM)", time_it<4, false>(m.walk(split, 33, 0), 33 * H, 20));
    m.report("a CTA a split: 2048 CTAs x 512 keys, 3 stages",
             time_it<3, false>(m.walk(split, splits, 0), splits * H, 20));
    m.report("a CTA a split, a barrier and a release at its end",
             time_it<3, false>(m.walk(split, splits, 1), splits * H, 20));
    m.report("256 CTAs x 4096 keys, 3 stages", time_it<3, false>(m.walk(4096, m.L / 4096, 0), m.L / 4096 * H, 20));
}

int main(int argc, char **argv)
{
    if (argc > 1 && std::string(argv[1]) == "big") {
        read_ceiling();
        return 0;
    }
    if (argc > 1 && std::string(argv[1]) == "runs") {
        read_runs();
        return 0;
    }
    const int L = 8192, Hkv = 8, split = 512, sets = 4;
    const size_t cache = (size_t)L * Hkv * kRowBytes; // one of K, V: 16.8 MB
    char *buf;
    CHECK(cudaMalloc(&buf, 2 * cache * sets));
    CHECK(cudaMemset(buf, 1, 2 * cache * sets));
    unsigned *sink;
    CHECK(cudaMalloc(&sink, 4096 * sizeof(unsigned)));
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("%s, %d SMs; K+V %.1f MB per call, 128 CTAs x 512 keys unless said; median of 50\n",
           prop.name, prop.multiProcessorCount, 2.0 * cache / 1e6);
    int set = 0;
    auto make = [&](bool flat, int rows) {
        args a;
        char *k = buf + (size_t)(set++ % sets) * 2 * cache;
        a.k = k, a.v = k + cache;
        a.key_stride = flat ? kRowBytes : (int64_t)Hkv * kRowBytes;
        a.head_stride = flat ? (int64_t)L * kRowBytes : kRowBytes; // flat: head hk's keys contiguous
        a.heads = Hkv, a.rows = rows, a.sink = sink;
        a.splits = a.stride = L / rows, a.seg_sync = 0, a.flags = nullptr;
        return a;
    };
    auto report = [&](const char *what, float us) {
        printf("  %-44s %7.2f us  %5.2f TB/s\n", what, us, 2.0 * cache / (us * 1e-6) / 1e12);
    };
    for (int flat = 0; flat < 2; flat++) {
        const char *lay = flat ? "flat" : "heads";
        char name[96];
        const int reps = 50, ctas = L / split * Hkv;
        snprintf(name, sizeof name, "%s lsu  3 stages", lay);
        report(name, time_it<3, false>(make(flat, split), ctas, reps));
        snprintf(name, sizeof name, "%s lsu  5 stages", lay);
        report(name, time_it<5, false>(make(flat, split), ctas, reps));
        snprintf(name, sizeof name, "%s bulk 3 stages", lay);
        report(name, time_it<3, true>(make(flat, split), ctas, reps));
        snprintf(name, sizeof name, "%s bulk 5 stages", lay);
        report(name, time_it<5, true>(make(flat, split), ctas, reps));
        snprintf(name, sizeof name, "%s lsu  3 stages, 256 CTAs x 256 keys", lay);
        report(name, time_it<3, false>(make(flat, split / 2), 2 * ctas, reps));
        snprintf(name, sizeof name, "%s bulk 3 stages, 256 CTAs x 256 keys", lay);
        report(name, time_it<3, true>(make(flat, split / 2), 2 * ctas, reps));
    }
    CHECK(cudaFree(buf));
    CHECK(cudaFree(sink));
    return 0;
}
