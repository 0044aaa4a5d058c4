// wgmma_probe.cu — does a wgmma chain give the bits of the mma.sync chain it replaces?
//
// One warpgroup computes, for random Q, K, V (64 x D tiles, fp16 or bf16):
//   S = Q K^T   (64 x 64, k-chunks of 16 in increasing order)  by mma.sync and by wgmma (B in smem,
//               A in smem or in registers; mismatches of both forms are counted)
//   O = O0 + P V (64 x D, P = S * 0.03 rounded to the dtype)  by mma.sync and by wgmma (A in registers)
// and reports how many fp32 results differ in any bit, plus the largest error of each against a
// float64 reference (a descriptor or layout bug shows there). The forward kernel's sm_90a path
// may use wgmma on prefill rows while decode rows stay on mma.sync only if this prints 0 mismatches.
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Icsrc/cuda tests/wgmma_probe.cu -o probe
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "wgmma.cuh"

#define CHECK(call)                                                                             \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

__device__ __forceinline__ uint32_t pair(const uint16_t *p) { return p[0] | (uint32_t)p[1] << 16; }

// The m16n8k16 A fragment of q ([rows][D], raw 16-bit) for this lane: rows r0, r0 + 8 of its
// warp's 16, k-chunk kk, straight from global memory.
template <int D> __device__ __forceinline__ void q_fragment(const uint16_t *q, int r0, int kk, uint32_t (&a)[4])
{
    const int c = 16 * kk + 2 * (threadIdx.x % 4);
    a[0] = pair(q + r0 * D + c), a[1] = pair(q + (r0 + 8) * D + c);
    a[2] = pair(q + r0 * D + c + 8), a[3] = pair(q + (r0 + 8) * D + c + 8);
}

// The reference: S = Q K^T (64 keys) for this lane's rows by an mma.sync chain, k-chunks in order.
template <typename T, int D>
__device__ __forceinline__ void mma_sync_s(const uint16_t *q, const uint16_t *k, int r0, float (&s)[8][4])
{
    const int g = (threadIdx.x % 32) / 4, c0 = 2 * (threadIdx.x % 4);
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        q_fragment<D>(q, r0, kk, a);
        for (int j = 0; j < 8; j++)
            dtype_ops<T>::mma(s[j], a, pair(k + (8 * j + g) * D + 16 * kk + c0),
                              pair(k + (8 * j + g) * D + 16 * kk + c0 + 8));
    }
}

// q, k, v: [64][D] row-major raw 16-bit; o0: [64][D] fp32 start values.
// s_out[3][128 threads][32]: [0] mma.sync, [1] wgmma (Q from smem), [2] wgmma (Q from registers);
// o_out[2][128 threads][D/2]: [0] mma.sync, [1] wgmma.
template <typename T, int D>
__global__ void probe(const uint16_t *q, const uint16_t *k, const uint16_t *v, const float *o0,
                      float *s_out, float *o_out)
{
    using ops = dtype_ops<T>;
    __shared__ __align__(1024) uint16_t sQ[64 * D], sK[64 * D], sV[64 * D];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (int i = tid; i < 64 * D; i += 128) {
        const int r = i / D, c = i % D;
        sQ[swz128<64>(r, c)] = q[i];
        sK[swz128<64>(r, c)] = k[i];
        sV[swz128<64>(r, c)] = v[i];
    }
    fence_async_smem();
    __syncthreads();
    const int r0 = 16 * warp + g;

    // mma.sync reference: fragments straight from global memory.
    float s_ref[8][4] = {};
    mma_sync_s<T, D>(q, k, r0, s_ref);
    // wgmma: S from shared memory descriptors.
    float s_wg[8][4] = {};
    wgmma_fence();
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t off = ((kk / 4) * 64 * 64 + (kk % 4) * 16) * 2;
        wgmma_ss(s_wg, gmma_desc(smem_addr(sQ) + off, 16, 1024), gmma_desc(smem_addr(sK) + off, 16, 1024),
                 (const T *)nullptr);
    }
    wgmma_commit();
    wgmma_wait<0>();
    // wgmma: S with Q from registers (the mma.sync A fragments), K from shared memory.
    float s_rs[8][4] = {};
    wgmma_fence();
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[4];
        q_fragment<D>(q, r0, kk, a);
        const uint32_t off = ((kk / 4) * 64 * 64 + (kk % 4) * 16) * 2;
        wgmma_rs_kmajor(s_rs, a, gmma_desc(smem_addr(sK) + off, 16, 1024), (const T *)nullptr);
    }
    wgmma_commit();
    wgmma_wait<0>();

    // P from the reference S for both (so that O compares P V alone).
    uint32_t pf[4][4];
    for (int kk = 0; kk < 4; kk++) {
        pf[kk][0] = ops::pack(s_ref[2 * kk][0] * 0.03f, s_ref[2 * kk][1] * 0.03f);
        pf[kk][1] = ops::pack(s_ref[2 * kk][2] * 0.03f, s_ref[2 * kk][3] * 0.03f);
        pf[kk][2] = ops::pack(s_ref[2 * kk + 1][0] * 0.03f, s_ref[2 * kk + 1][1] * 0.03f);
        pf[kk][3] = ops::pack(s_ref[2 * kk + 1][2] * 0.03f, s_ref[2 * kk + 1][3] * 0.03f);
    }
    float o_ref[D / 8][4], o_wg[D / 8][4];
    for (int j = 0; j < D / 8; j++)
        for (int e = 0; e < 4; e++)
            o_ref[j][e] = o_wg[j][e] = o0[(r0 + 8 * (e / 2)) * D + 8 * j + 2 * t + e % 2];
    for (int kk = 0; kk < 4; kk++)
        for (int j = 0; j < D / 8; j++) {
            const uint16_t *c = v + 8 * j + g;
            const int k0 = 16 * kk + 2 * t;
            const uint32_t b0 = c[k0 * D] | (uint32_t)c[(k0 + 1) * D] << 16;
            const uint32_t b1 = c[(k0 + 8) * D] | (uint32_t)c[(k0 + 9) * D] << 16;
            ops::mma(o_ref[j], pf[kk], b0, b1);
        }
    wgmma_fence();
    for (int kk = 0; kk < 4; kk++)
        wgmma_rs_mnmajor(o_wg, pf[kk], gmma_desc(smem_addr(sV) + kk * 16 * 128, 64 * 128, 1024), (const T *)nullptr);
    wgmma_commit();
    wgmma_wait<0>();

    for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
            s_out[tid * 32 + 4 * j + e] = s_ref[j][e];
            s_out[128 * 32 + tid * 32 + 4 * j + e] = s_wg[j][e];
            s_out[2 * 128 * 32 + tid * 32 + 4 * j + e] = s_rs[j][e];
        }
    for (int j = 0; j < D / 8; j++)
        for (int e = 0; e < 4; e++) {
            o_out[tid * (D / 2) + 4 * j + e] = o_ref[j][e];
            o_out[128 * (D / 2) + tid * (D / 2) + 4 * j + e] = o_wg[j][e];
        }
}

// Two warpgroups (the D64 prefill CTA: 8 warps, 128 query rows, a 128-register cap): each
// warpgroup computes S for its 64 rows with Q's A fragments loaded by ldmatrix from a swz128
// tile, exactly as fwd_kernel loads them, and K from shared memory. s_out[2][256][32]:
// [0] mma.sync from global memory, [1] wgmma.
template <typename T, int D>
__global__ void __launch_bounds__(256, 2)
probe_two_wg(const uint16_t *q, const uint16_t *k, float *s_out)
{
    __shared__ __align__(1024) uint16_t sQ[128 * D], sK[64 * D];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4;
    for (int i = tid; i < 128 * D; i += 256)
        sQ[swz128<128>(i / D, i % D)] = q[i];
    for (int i = tid; i < 64 * D; i += 256)
        sK[swz128<64>(i / D, i % D)] = k[i];
    fence_async_smem();
    __syncthreads();
    const int r0 = 16 * warp + g;
    float s_ref[8][4] = {};
    mma_sync_s<T, D>(q, k, r0, s_ref);
    uint32_t qf[1][D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        ldmatrix_x4(qf[0][kk], smem_addr(sQ + swz128<128>(warp * 16 + lane % 16, 16 * kk + 8 * (lane / 16))));
    float s_wg[8][4] = {};
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const uint32_t off = ((kk / 4) * 64 * 64 + (kk % 4) * 16) * 2;
        wgmma_rs_kmajor(s_wg, qf[0][kk], gmma_desc(smem_addr(sK) + off, 16, 1024), (const T *)nullptr);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_fence_operand(s_wg);
    for (int j = 0; j < 8; j++)
        for (int e = 0; e < 4; e++) {
            s_out[tid * 32 + 4 * j + e] = s_ref[j][e];
            s_out[256 * 32 + tid * 32 + 4 * j + e] = s_wg[j][e];
        }
}

static uint32_t rng_state = 12345;
static float urand() { rng_state = rng_state * 1664525u + 1013904223u; return (rng_state >> 8) * (1.0f / 16777216.0f); }
static uint16_t to16(float x, bool bf)
{
    if (bf) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return u >> 16; }
    return __half_as_ushort(__float2half_rn(x));
}
static float from16(uint16_t h, bool bf)
{
    if (bf) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
    return __half2float(__ushort_as_half(h));
}

template <typename T, int D> static int run(const char *name, int trials)
{
    const bool bf = sizeof(T) == 2 && !std::is_same<T, __half>::value;
    int bad_s = 0, bad_o = 0;
    double err_s = 0, err_o = 0;
    std::vector<uint16_t> q(64 * D), k(64 * D), v(64 * D);
    std::vector<float> o0(64 * D), s(3 * 128 * 32), o(2 * 128 * D / 2);
    uint16_t *dq, *dk, *dv; float *do0, *ds, *dout;
    CHECK(cudaMalloc(&dq, 64 * D * 2)); CHECK(cudaMalloc(&dk, 64 * D * 2)); CHECK(cudaMalloc(&dv, 64 * D * 2));
    CHECK(cudaMalloc(&do0, 64 * D * 4)); CHECK(cudaMalloc(&ds, s.size() * 4)); CHECK(cudaMalloc(&dout, o.size() * 4));
    for (int trial = 0; trial < trials; trial++) {
        for (int i = 0; i < 64 * D; i++) {
            q[i] = to16(4 * urand() - 2, bf); k[i] = to16(4 * urand() - 2, bf); v[i] = to16(4 * urand() - 2, bf);
            o0[i] = 8 * urand() - 4;
        }
        CHECK(cudaMemcpy(dq, q.data(), 64 * D * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dk, k.data(), 64 * D * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dv, v.data(), 64 * D * 2, cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(do0, o0.data(), 64 * D * 4, cudaMemcpyHostToDevice));
        CHECK(cudaMemset(ds, 0xff, s.size() * 4)); CHECK(cudaMemset(dout, 0xff, o.size() * 4));
        probe<T, D><<<1, 128>>>(dq, dk, dv, do0, ds, dout);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        CHECK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
        CHECK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
        for (int tid = 0; tid < 128; tid++) {
            const int w = tid / 32, g = (tid % 32) / 4, t = tid % 4;
            for (int j = 0; j < 8; j++)
                for (int e = 0; e < 4; e++) {
                    const int r = 16 * w + g + 8 * (e / 2), c = 8 * j + 2 * t + e % 2;
                    double ref = 0;
                    for (int x = 0; x < D; x++) ref += (double)from16(q[r * D + x], bf) * from16(k[c * D + x], bf);
                    const float a = s[tid * 32 + 4 * j + e], b = s[128 * 32 + tid * 32 + 4 * j + e];
                    const float f = s[2 * 128 * 32 + tid * 32 + 4 * j + e];
                    bad_s += (memcmp(&a, &b, 4) != 0) + (memcmp(&a, &f, 4) != 0);
                    err_s = fmax(err_s, fabs(b - ref));
                }
            for (int j = 0; j < D / 8; j++)
                for (int e = 0; e < 4; e++) {
                    const int i = tid * (D / 2) + 4 * j + e;
                    const float a = o[i], b = o[128 * (D / 2) + i];
                    bad_o += memcmp(&a, &b, 4) != 0;
                    err_o = fmax(err_o, fabs((double)b - a));
                }
        }
    }
    printf("%-5s D=%-3d trials %d: S bit mismatches %d / %d (max |wgmma - fp64| %.3g); "
           "O bit mismatches %d / %d (max |wgmma - mma.sync| %.3g)\n",
           name, D, trials, bad_s, 2 * trials * 64 * 64, err_s, bad_o, trials * 64 * D, err_o);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(do0); cudaFree(ds); cudaFree(dout);
    return bad_s + bad_o;
}

template <typename T, int D> static int run_two_wg(const char *name)
{
    const bool bf = !std::is_same<T, __half>::value;
    std::vector<uint16_t> q(128 * D), k(64 * D);
    std::vector<float> s(2 * 256 * 32);
    for (auto &x : q) x = to16(4 * urand() - 2, bf);
    for (auto &x : k) x = to16(4 * urand() - 2, bf);
    uint16_t *dq, *dk; float *ds;
    CHECK(cudaMalloc(&dq, q.size() * 2)); CHECK(cudaMalloc(&dk, k.size() * 2)); CHECK(cudaMalloc(&ds, s.size() * 4));
    CHECK(cudaMemcpy(dq, q.data(), q.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dk, k.data(), k.size() * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemset(ds, 0xff, s.size() * 4));
    probe_two_wg<T, D><<<1, 256>>>(dq, dk, ds);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(s.data(), ds, s.size() * 4, cudaMemcpyDeviceToHost));
    int bad = 0;
    for (int i = 0; i < 256 * 32; i++)
        bad += memcmp(&s[i], &s[256 * 32 + i], 4) != 0;
    printf("%-5s D=%-3d two warpgroups, Q fragments by ldmatrix: S bit mismatches %d / %d\n", name, D, bad, 256 * 32);
    cudaFree(dq); cudaFree(dk); cudaFree(ds);
    return bad;
}

int main()
{
    int bad = 0;
    bad += run<__nv_bfloat16, 64>("bf16", 20);
    bad += run<__nv_bfloat16, 128>("bf16", 20);
    bad += run<__half, 64>("fp16", 20);
    bad += run<__half, 128>("fp16", 20);
    bad += run_two_wg<__nv_bfloat16, 64>("bf16");
    bad += run_two_wg<__nv_bfloat16, 128>("bf16");
    printf("RESULT: %s\n", bad ? "wgmma bits DIFFER from mma.sync" : "wgmma bits EQUAL mma.sync");
    return bad ? 1 : 0;
}
