/* probe_cta_placement.cu: which SM the first CTAs of a large grid land on, at the packed decode
 * kernel's footprint (128 threads, 108 KB of dynamic shared memory: two CTAs an SM), when the
 * other CTAs end at once. Verdict: tool.
 *
 * Each CTA writes its %smid; CTAs whose index is a "walker" (index % every == 0 among the first
 * `walkers * every`) spin for ~50 us, the rest end. Prints, for each layout, how many SMs got 0, 1,
 * 2 walkers. Build: nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -Idev -o pcp dev/probe_cta_placement.cu
 */
#include <cstdio>
#include <vector>

#include "cuda_check.h"

__global__ void place(int *sm_of, int n_walk, int every, long long spin_ns)
{
    extern __shared__ char smem[];
    const int id = blockIdx.x + blockIdx.y * gridDim.x;
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    if (threadIdx.x == 0)
        sm_of[id] = (int)sm;
    const bool walker = id % every == 0 && id / every < n_walk;
    if (!walker)
        return;
    smem[threadIdx.x] = (char)sm; /* (touch the shared memory) */
    long long t0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    for (;;) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 > spin_ns)
            break;
    }
}

int main()
{
    int sms = 0;
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int smem = 108 * 1024 + 512;
    CHECK(cudaFuncSetAttribute(place, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const int x = 128, n = 16, total = x * n;
    int *d = nullptr;
    CHECK(cudaMalloc(&d, total * sizeof(int)));
    std::vector<int> h(total);
    /* (layout, grid y, walkers' spacing in the linear index) */
    struct L { const char *name; int y, every; } layouts[] = {
        {"grid 128 (one-CTA plan)", 1, 1}, {"grid 128x16, walkers 0..127", n, 1},
        {"grid 128x16, walkers every 2nd", n, 2}, {"grid 128x16, walkers every 4th", n, 4},
        {"grid 128x16, walkers every 8th", n, 8}, {"grid 128x16, walkers every 16th", n, 16}};
    for (const L &l : layouts) {
        for (int rep = 0; rep < 3; rep++) {
            CHECK(cudaMemset(d, 0xff, total * sizeof(int)));
            place<<<dim3(x, l.y), 128, smem>>>(d, x, l.every, 50000);
            CHECK(cudaGetLastError());
            CHECK(cudaDeviceSynchronize());
            CHECK(cudaMemcpy(h.data(), d, total * sizeof(int), cudaMemcpyDeviceToHost));
            std::vector<int> per(sms, 0);
            for (int w = 0; w < x; w++)
                per[h[w * l.every]]++;
            int hist[4] = {0, 0, 0, 0};
            for (int s = 0; s < sms; s++)
                hist[per[s] < 3 ? per[s] : 3]++;
            printf("%-34s rep %d: SMs with 0/1/2/3+ walkers: %d %d %d %d; first 8 CTAs on SMs", l.name, rep,
                   hist[0], hist[1], hist[2], hist[3]);
            for (int i = 0; i < 8; i++)
                printf(" %d", h[i]);
            printf("\n");
        }
    }
    CHECK(cudaFree(d));
    return 0;
}
