// probe_decode_transposed.cu: A decode walk with the query rows in the MMA's N (S^T = K Q^T, O^T += V^T P^T), how fast it streams a KV cache at one or two CTAs an SM, against the device copy. Verdict: with no S exchange, half the packed kernel's exponentials and no combine it streams no faster than num_splits=1 (92-107% of the copy at one CTA an SM, either cache layout; benchmarks/results/2026-12-01_h200_decode_shares_transposed.md, section 4). A timing probe, checked against fp64, without the product's l order.
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Idev dev/probe_decode_transposed.cu -o /tmp/pdt
//   /tmp/pdt            # checks four small cases against fp64, then times the configs below in both
//                       # cache layouts (the median of 31 launches a row)
//   /tmp/pdt chunks     # keys a CTA swept at B4-B16, the (B, L, Hkv, D) cache, two passes
//
// Why: the packed kernel (fwd_decode.cu) puts a kv head's G query rows in the M of m16n8k16,
// 16 rows of which G = 4 are real, and each of its four warps recomputes the whole tile's
// softmax; at one warp a sub-partition it issues a third of its cycles, stalled on its own
// chains, so one CTA a row block (no partials, no combine) is as fast as cuDNN only where
// nothing else is asked of it. With the rows in N (n8 >= G) an S^T tile of 64 keys is 32 MMAs
// and 16 exponentials a thread, and mma.sync gives the same fp32 bits with its operands' roles
// swapped (dev/probe_mma_transpose.cu), so such a walk can keep the product's bits once it sums
// each row's l in the packed kernel's order (not done here: l is summed per thread, then across
// the eight lanes of a row).
//
// Shapes: q (B, Hq, D) bf16 (one token), k, v (B, L, Hkv, D) bf16 (or head-major (B, Hkv, L, D)),
// D = 128, G = Hq / Hkv <= 8.
// CTA (x = b Hkv + hk, c): keys [c C, (c + 1) C) of row block x (C = chunk keys), 64-key tiles,
// its 512-key splits folded in registers (fad_merge_weights), written as one partial (o, m, l)
// fp32; kWarps warps, each owning D / kWarps output columns and computing the whole S^T tile.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "cuda/mma.cuh" /* (fad_math.h with it) */
#include "cuda_check.h"


constexpr int D = 128, kBlockN = 64, kSplit = 512;
constexpr int kRowBytes = D * 2, kTileBytes = kBlockN * kRowBytes; /* one K or V tile: 16 KB */

/* movmatrix (the S^T fragment to P^T's B operand); the rest is csrc/cuda/mma.cuh's */
__device__ __forceinline__ uint32_t movm_t(uint32_t a)
{
    uint32_t d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}
using ops = dtype_ops<__nv_bfloat16>;
/* byte offset of 16-byte chunk cc of row r in a tile: mma.cuh's swizzle (ldmatrix's eight rows of
 * one chunk column land in eight different bank groups) */
__device__ __forceinline__ int swz_bytes(int r, int cc) { return 2 * swz<D>(r, 8 * cc); }

template <int kWarps, int kStages>
__global__ void __launch_bounds__(kWarps * 32) decode_t(const __nv_bfloat16 *q, const __nv_bfloat16 *k,
                                                         const __nv_bfloat16 *v, const int *lens, int L,
                                                         int Hkv, int G, int chunk, float scale_log2,
                                                         float *po, float *pml, int head_major)
{
    constexpr int kThreads = kWarps * 32, kDT = D / 16 / kWarps; /* 16-column tiles of O^T a warp */
    extern __shared__ __align__(128) unsigned char smem[];
    const int x = blockIdx.x, c = blockIdx.y, b = x / Hkv, hk = x % Hkv;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, qd = lane % 4;
    const int len = lens[b];
    const int lo = c * chunk, hi = min(len, lo + chunk);
    /* (B, L, Hkv, D), a key's rows of the kv heads side by side, or head-major (B, Hkv, L, D) */
    const size_t row_stride = head_major ? (size_t)D : (size_t)Hkv * D; /* elements between keys */
    const size_t head0 = head_major ? (size_t)(b * Hkv + hk) * L * D : ((size_t)b * L * Hkv + hk) * D;
    const __nv_bfloat16 *kg = k + head0, *vg = v + head0;
    const int n_tiles = hi > lo ? (hi - lo + kBlockN - 1) / kBlockN : 0;

    /* Q as the B operand of S^T = K Q^T: b0 = Q[row g][16 ks + 2 qd, +1], b1 = the same + 8 */
    uint32_t qb[D / 16][2];
    {
        const __nv_bfloat16 *qr = q + ((size_t)b * Hkv * G + hk * G + g) * D;
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t w0 = 0, w1 = 0;
            if (g < G) {
                w0 = *reinterpret_cast<const uint32_t *>(qr + 16 * ks + 2 * qd);
                w1 = *reinterpret_cast<const uint32_t *>(qr + 16 * ks + 8 + 2 * qd);
            }
            qb[ks][0] = w0, qb[ks][1] = w1;
        }
    }
    auto load_tile = [&](int j) { /* tile j's K and V into stage j % kStages (an empty group past the end) */
        if (j < n_tiles) {
            const int t0 = lo + j * kBlockN;
            unsigned char *st = smem + (size_t)(j % kStages) * 2 * kTileBytes;
#pragma unroll
            for (int i = 0; i < kBlockN * 16 / kThreads; i++) {
                const int ch = tid + i * kThreads, r = ch / 16, cc = ch % 16, key = t0 + r;
                const bool ok = key < hi;
                const size_t off = (size_t)(ok ? key : lo) * row_stride + cc * 8;
                cp_async16(st + swz_bytes(r, cc), kg + off, ok ? 16 : 0);
                cp_async16(st + kTileBytes + swz_bytes(r, cc), vg + off, ok ? 16 : 0);
            }
        }
        cp_async_commit();
    };
#pragma unroll
    for (int j = 0; j < kStages - 1; j++)
        load_tile(j);

    float o[kDT][4] = {}, oR[kDT][4] = {};
    float m_s[2] = {-INFINITY, -INFINITY}, l_s[2] = {0.f, 0.f}, mR[2] = {-INFINITY, -INFINITY}, lR[2] = {0.f, 0.f};
    auto fold = [&]() { /* this split's (m, l, o) into R (rows 2 qd + e) */
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float l = l_s[e];
            l += __shfl_xor_sync(0xffffffffu, l, 4);
            l += __shfl_xor_sync(0xffffffffu, l, 8);
            l += __shfl_xor_sync(0xffffffffu, l, 16);
            const fad_merge_w w = fad_merge_weights(mR[e], m_s[e]);
            mR[e] = w.m;
            lR[e] = fad_merge_value(lR[e], l, w);
#pragma unroll
            for (int dt = 0; dt < kDT; dt++) {
                oR[dt][e] = fad_merge_value(oR[dt][e], o[dt][e], w);
                oR[dt][2 + e] = fad_merge_value(oR[dt][2 + e], o[dt][2 + e], w);
                o[dt][e] = o[dt][2 + e] = 0.f;
            }
            m_s[e] = -INFINITY, l_s[e] = 0.f;
        }
    };

#pragma unroll 1
    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<kStages - 2>();
        __syncthreads(); /* tile j is in; stage (j - 1) % kStages is free */
        load_tile(j + kStages - 1);
        const unsigned char *st = smem + (size_t)(j % kStages) * 2 * kTileBytes;
        const uint32_t sk = smem_addr(st), sv = smem_addr(st + kTileBytes);
        const int t0 = lo + j * kBlockN;

        /* S^T (64 keys x 8 rows): s[mt] = (key 16 mt + g, rows 2 qd, +1), (key + 8, the same rows) */
        float s[4][4] = {};
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++)
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                uint32_t a[4];
                const int r = 16 * mt + lane % 16;
                ldmatrix_x4(a, sk + swz_bytes(r, 2 * ks + lane / 16));
                ops::mma(s[mt], a, qb[ks][0], qb[ks][1]);
            }
        if (t0 + kBlockN > hi) /* the chunk's last tile: keys past it */
#pragma unroll
            for (int mt = 0; mt < 4; mt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (t0 + 16 * mt + g + 8 * (e / 2) >= hi)
                        s[mt][e] = -INFINITY;
        float scale[2];
#pragma unroll
        for (int e = 0; e < 2; e++) { /* row 2 qd + e: its max over the 64 keys (8 lanes of one qd) */
            float mx = fmaxf(fmaxf(fmaxf(s[0][e], s[0][2 + e]), fmaxf(s[1][e], s[1][2 + e])),
                             fmaxf(fmaxf(s[2][e], s[2][2 + e]), fmaxf(s[3][e], s[3][2 + e])));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
            float m_new;
            scale[e] = fad_rescale(m_s[e], FAD_MUL(mx, scale_log2), &m_new);
            m_s[e] = m_new;
            const float base = fad_exp_base(m_new);
            float ps = 0.f;
#pragma unroll
            for (int mt = 0; mt < 4; mt++) {
                s[mt][e] = fad_exp_score(s[mt][e], scale_log2, base);
                s[mt][2 + e] = fad_exp_score(s[mt][2 + e], scale_log2, base);
                ps += s[mt][e] + s[mt][2 + e];
            }
            l_s[e] = FAD_FMA(l_s[e], scale[e], ps);
        }
#pragma unroll
        for (int dt = 0; dt < kDT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                o[dt][e] *= scale[e % 2];
        /* O^T += V^T P^T: B = P^T (keys 16 mt + 2 qd.. x row g), by transposing the S^T fragment */
#pragma unroll
        for (int mt = 0; mt < 4; mt++) {
            const uint32_t b0 = movm_t(ops::pack(s[mt][0], s[mt][1]));
            const uint32_t b1 = movm_t(ops::pack(s[mt][2], s[mt][3]));
#pragma unroll
            for (int dt = 0; dt < kDT; dt++) {
                uint32_t a[4];
                const int key = 16 * mt + lane % 8 + 8 * (lane / 16);
                ldmatrix_x4_trans(a, sv + swz_bytes(key, 2 * (warp * kDT + dt) + (lane / 8) % 2));
                ops::mma(o[dt], a, b0, b1);
            }
        }
        if ((t0 + kBlockN) % kSplit == 0 || j == n_tiles - 1)
            fold();
    }
    cp_async_wait_all();

    /* the partial: o (unnormalized), m, l of rows 2 qd + e < G */
    const size_t part = (size_t)x * gridDim.y + c;
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int row = 2 * qd + e;
        if (row >= G)
            continue;
#pragma unroll
        for (int dt = 0; dt < kDT; dt++) {
            const int d0 = 16 * (warp * kDT + dt) + g;
            po[(part * G + row) * D + d0] = oR[dt][e];
            po[(part * G + row) * D + d0 + 8] = oR[dt][2 + e];
        }
        if (warp == 0 && g == 0) {
            pml[(part * G + row) * 2] = mR[e];
            pml[(part * G + row) * 2 + 1] = lR[e];
        }
    }
}

template <int kWarps, int kStages> struct runner {
    static size_t smem() { return (size_t)kStages * 2 * kTileBytes; }
    static void launch(dim3 grid, const __nv_bfloat16 *q, const __nv_bfloat16 *k, const __nv_bfloat16 *v,
                       const int *lens, int L, int Hkv, int G, int chunk, float sl, float *po, float *pml, int hm)
    {
        static bool set = false;
        if (!set) {
            CHECK(cudaFuncSetAttribute(decode_t<kWarps, kStages>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)smem()));
            set = true;
        }
        decode_t<kWarps, kStages><<<grid, kWarps * 32, smem()>>>(q, k, v, lens, L, Hkv, G, chunk, sl, po, pml, hm);
    }
};

typedef void (*launch_fn)(dim3, const __nv_bfloat16 *, const __nv_bfloat16 *, const __nv_bfloat16 *,
                          const int *, int, int, int, int, float, float *, float *, int);

static uint64_t rs = 88172645463325252ull;
static float urand()
{
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (float)((rs >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

/* Runs (B, L, chunk) once on random inputs and checks every row against fp64. */
static bool check(launch_fn fn, int B, int L, int Hkv, int G, int chunk, int len_cut, int hm)
{
    const size_t nq = (size_t)B * Hkv * G * D, nkv = (size_t)B * L * Hkv * D;
    std::vector<__nv_bfloat16> hq(nq), hk(nkv), hv(nkv);
    for (auto &x : hq) x = __float2bfloat16(urand());
    for (auto &x : hk) x = __float2bfloat16(urand());
    for (auto &x : hv) x = __float2bfloat16(urand());
    std::vector<int> hl(B);
    for (int b = 0; b < B; b++) hl[b] = b % 2 ? len_cut : L;
    const int nc = (L + chunk - 1) / chunk;
    __nv_bfloat16 *dq, *dk, *dv;
    int *dl;
    float *po, *pml;
    CHECK(cudaMalloc(&dq, nq * 2)); CHECK(cudaMalloc(&dk, nkv * 2)); CHECK(cudaMalloc(&dv, nkv * 2)); CHECK(cudaMalloc(&dl, B * 4));
    const size_t np = (size_t)B * Hkv * nc * G;
    CHECK(cudaMalloc(&po, np * D * 4)); CHECK(cudaMalloc(&pml, np * 2 * 4));
    CHECK(cudaMemset(po, 0xff, np * D * 4)); CHECK(cudaMemset(pml, 0xff, np * 2 * 4)); /* NaN poison */
    CHECK(cudaMemcpy(dq, hq.data(), nq * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, hk.data(), nkv * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dv, hv.data(), nkv * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dl, hl.data(), B * 4, cudaMemcpyHostToDevice));
    const float sl = (float)(1.0 / std::sqrt((double)D) * 1.4426950408889634);
    fn(dim3(B * Hkv, nc), dq, dk, dv, dl, L, Hkv, G, chunk, sl, po, pml, hm);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> ho(np * D), hml(np * 2);
    CHECK(cudaMemcpy(ho.data(), po, ho.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(hml.data(), pml, hml.size() * 4, cudaMemcpyDeviceToHost));
    double worst = 0;
    auto kv_at = [&](int b, int t, int h) { /* element offset of (b, key t, kv head h, d = 0) */
        return hm ? ((size_t)(b * Hkv + h) * L + t) * D : (((size_t)b * L + t) * Hkv + h) * D;
    };
    for (int b = 0; b < B; b++)
        for (int hk2 = 0; hk2 < Hkv; hk2++)
            for (int r = 0; r < G; r++) {
                const int len = hl[b];
                /* merge the chunks' partials (in fp64), then normalize */
                double m = -INFINITY, l = 0, out[D] = {};
                for (int c = 0; c < nc && c * chunk < len; c++) {
                    const size_t pr = ((size_t)(b * Hkv + hk2) * nc + c) * G + r;
                    const double mm = hml[pr * 2], lc = hml[pr * 2 + 1]; /* m in log2 units */
                    const double nm = std::max(m, mm);
                    const double wa = m == -INFINITY ? 0 : std::exp2(m - nm), wb = std::exp2(mm - nm);
                    for (int d = 0; d < D; d++) out[d] = out[d] * wa + ho[pr * D + d] * wb;
                    l = l * wa + lc * wb;
                    m = nm;
                }
                /* fp64 reference */
                const int h = hk2 * G + r;
                std::vector<double> sc(len);
                double mx = -INFINITY;
                for (int t = 0; t < len; t++) {
                    double acc = 0;
                    for (int d = 0; d < D; d++)
                        acc += (double)__bfloat162float(hq[((size_t)b * Hkv * G + h) * D + d]) *
                               __bfloat162float(hk[kv_at(b, t, hk2) + d]);
                    sc[t] = acc / std::sqrt((double)D);
                    mx = std::max(mx, sc[t]);
                }
                double den = 0, ref[D] = {};
                for (int t = 0; t < len; t++) {
                    const double p = std::exp(sc[t] - mx);
                    den += p;
                    for (int d = 0; d < D; d++)
                        ref[d] += p * __bfloat162float(hv[kv_at(b, t, hk2) + d]);
                }
                for (int d = 0; d < D; d++) {
                    const double err = std::fabs(out[d] / l - ref[d] / den);
                    if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : std::max(worst, err);
                }
            }
    cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dl), cudaFree(po), cudaFree(pml);
    printf("check B%d L%d G%d chunk %d (odd sequences %d keys)%s: max |err| %.3g %s\n", B, L, G, chunk, len_cut,
           hm ? ", head-major" : "", worst, worst < 2e-2 ? "ok" : "FAIL");
    return worst < 2e-2;
}

static float time_it(launch_fn fn, int B, int L, int Hkv, int G, int chunk, int reps, int hm)
{
    const size_t nq = (size_t)B * Hkv * G * D, nkv = (size_t)B * L * Hkv * D;
    /* two cache sets, alternated, each larger than L2 where the config allows */
    __nv_bfloat16 *dq, *dk[2], *dv[2];
    int *dl;
    float *po, *pml;
    const int nc = (L + chunk - 1) / chunk;
    const size_t np = (size_t)B * Hkv * nc * G;
    CHECK(cudaMalloc(&dq, nq * 2)); CHECK(cudaMalloc(&dl, B * 4));
    for (int i = 0; i < 2; i++) {
        CHECK(cudaMalloc(&dk[i], nkv * 2)); CHECK(cudaMalloc(&dv[i], nkv * 2));
        CHECK(cudaMemset(dk[i], 0x3c, nkv * 2)); CHECK(cudaMemset(dv[i], 0x3c, nkv * 2));
    }
    CHECK(cudaMemset(dq, 0x3c, nq * 2));
    CHECK(cudaMalloc(&po, np * D * 4)); CHECK(cudaMalloc(&pml, np * 2 * 4));
    std::vector<int> hl(B, L);
    CHECK(cudaMemcpy(dl, hl.data(), B * 4, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < reps + 3; r++) {
        CHECK(cudaEventRecord(e0));
        fn(dim3(B * Hkv, nc), dq, dk[r % 2], dv[r % 2], dl, L, Hkv, G, chunk, 0.1f, po, pml, hm);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 3) ts.push_back(ms * 1000.f);
    }
    CHECK(cudaGetLastError());
    std::sort(ts.begin(), ts.end());
    for (int i = 0; i < 2; i++) cudaFree(dk[i]), cudaFree(dv[i]);
    cudaFree(dq), cudaFree(dl), cudaFree(po), cudaFree(pml);
    return ts[ts.size() / 2];
}

static float copy_bw() /* (read + write) bytes / s of a 1 GiB device copy */
{
    const size_t n = (size_t)1 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, n)); CHECK(cudaMalloc(&b, n));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0)); CHECK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int r = 0; r < 8; r++) {
        CHECK(cudaEventRecord(e0));
        CHECK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice));
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    cudaFree(a), cudaFree(b);
    return 2.0 * n / (ts[4] * 1e-3);
}

int main(int argc, char **argv)
{
    const bool chunks = argc > 1 && std::string(argv[1]) == "chunks"; /* the chunk sweep below */
    bool ok = true;
    ok &= check(runner<4, 4>::launch, 3, 3000, 2, 4, 3000, 2000, 0);
    ok &= check(runner<4, 4>::launch, 2, 5000, 2, 8, 1024, 1777, 0);
    ok &= check(runner<2, 3>::launch, 2, 2600, 1, 4, 512, 700, 0);
    ok &= check(runner<4, 3>::launch, 2, 5000, 2, 4, 1024, 1777, 1);
    if (!ok)
        return 1;
    const float bw = copy_bw();
    printf("copy bandwidth %.2f TB/s (read + write)\n", bw / 1e12);
    struct cfg { int B, L, chunk; };
    const std::vector<cfg> cfgs =
        chunks ? std::vector<cfg>{{8, 8192, 4096}, {8, 8192, 2048}, {8, 8192, 1024}, {8, 8192, 512}, {16, 8192, 8192},
                                  {16, 8192, 4096}, {16, 8192, 2048}, {4, 8192, 1024}, {4, 8192, 512},
                                  {8, 32768, 16384}, {8, 32768, 8192}, {8, 32768, 4096}, {16, 32768, 16384}}
               : std::vector<cfg>{{16, 8192, 8192}, {16, 32768, 32768}, {32, 8192, 8192}, {8, 8192, 4096},
                                  {8, 32768, 16384}, {4, 8192, 2048}, {4, 32768, 8192}, {1, 131072, 4096},
                                  {1, 32768, 1024}, {8, 8192, 8192}};
    struct var { const char *name; launch_fn fn; };
    const var vars[] = {{"4 warps, 4 stages", runner<4, 4>::launch}, {"4 warps, 3 stages", runner<4, 3>::launch},
                        {"2 warps, 3 stages", runner<2, 3>::launch}, {"8 warps, 3 stages", runner<8, 3>::launch}};
    /* the cache as (B, L, Hkv, D), then head-major, then (B, L, Hkv, D) again (run to run) */
    for (int pass = 0; pass < 3; pass++) {
        const int hm = pass == 1;
        if (chunks && hm)
            continue; /* (the sweep: the first layout, twice) */
        printf("\n%s, pass %d\n\n| B | L | keys a CTA | CTAs |", hm ? "head-major cache (B, Hkv, L, D)" : "cache (B, L, Hkv, D)",
               pass);
        for (const var &vv : vars) printf(" %s us (%% copy bw) |", vv.name);
        printf("\n|---|---|---|---|");
        for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) printf("---|");
        printf("\n");
        for (const cfg &cc : cfgs) {
            const double bytes = (double)cc.B * cc.L * 8 * D * 2 * 2;
            printf("| %d | %d | %d | %d |", cc.B, cc.L, cc.chunk, cc.B * 8 * ((cc.L + cc.chunk - 1) / cc.chunk));
            for (const var &vv : vars) {
                const float us = time_it(vv.fn, cc.B, cc.L, 8, 4, cc.chunk, 31, hm);
                printf(" %.1f (%.0f%%) |", us, 100.0 * bytes / (us * 1e-6) / bw);
            }
            printf("\n");
        }
    }
    return 0;
}
