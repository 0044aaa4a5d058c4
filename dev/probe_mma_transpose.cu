// probe_mma_transpose.cu: Whether mma.sync m16n8k16 gives the same fp32 bits with its operands' roles swapped (S = Q K^T against S^T = K Q^T; O = P V + C against O^T = V^T P^T + C^T), the premise of a decode kernel with the query rows in N. Verdict: the same bits, 0 of 7,680,000 elements differ in bf16 and fp16 (benchmarks/results/2026-12-01_h200_decode_shares_transposed.md, section 3).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Icsrc -Idev dev/probe_mma_transpose.cu -o /tmp/probe_mma_t
//   /tmp/probe_mma_t [trials]      # prints the elements that differ, per test and dtype
//
// Each trial is one warp on fresh random inputs whose exponents spread over 2^-24 .. 2^24 (so
// that the products' alignment inside the MMA matters), in bf16 and fp16:
//   qk: S[i][j] = sum over 8 chained k16 steps (D = 128) of Q[i][k] K[j][k], from C = 0;
//       way 1 A = Q (16 rows), B = K^T (8 keys); way 2 A = K (16 keys), B = Q^T (8 rows);
//       compared on the 8 x 8 elements both compute.
//   pv: O[i][d] = C[i][d] + sum over 4 chained k16 steps (64 keys) of P[i][t] V[t][d], C random
//       fp32; way 1 A = P, B = V; way 2 A = V^T, B = P^T.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda/mma.cuh"
#include "cuda_check.h"

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>


/* two elements as an MMA operand register (a float holds either type exactly) */
template <typename T> __device__ uint32_t pack2(T lo, T hi) { return dtype_ops<T>::pack((float)lo, (float)hi); }

/* D (16 x 8, fp32, row-major, pre-loaded with C) += A (16 x K, row-major, lda) B (K x 8, given
 * as Bt: 8 x K row-major, ldb), in K / 16 chained steps; the PTX fragment layouts. */
template <typename T>
__device__ void gemm_16x8(float *D, const T *A, int lda, const T *Bt, int ldb, int K)
{
    const int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
    float d[4] = {D[g * 8 + 2 * q], D[g * 8 + 2 * q + 1], D[(g + 8) * 8 + 2 * q], D[(g + 8) * 8 + 2 * q + 1]};
    for (int k0 = 0; k0 < K; k0 += 16) {
        uint32_t a[4];
        a[0] = pack2(A[g * lda + k0 + 2 * q], A[g * lda + k0 + 2 * q + 1]);
        a[1] = pack2(A[(g + 8) * lda + k0 + 2 * q], A[(g + 8) * lda + k0 + 2 * q + 1]);
        a[2] = pack2(A[g * lda + k0 + 8 + 2 * q], A[g * lda + k0 + 8 + 2 * q + 1]);
        a[3] = pack2(A[(g + 8) * lda + k0 + 8 + 2 * q], A[(g + 8) * lda + k0 + 8 + 2 * q + 1]);
        const uint32_t b0 = pack2(Bt[g * ldb + k0 + 2 * q], Bt[g * ldb + k0 + 2 * q + 1]);
        const uint32_t b1 = pack2(Bt[g * ldb + k0 + 8 + 2 * q], Bt[g * ldb + k0 + 8 + 2 * q + 1]);
        dtype_ops<T>::mma(d, a, b0, b1); /* (csrc/cuda/mma.cuh) */
    }
    __syncwarp();
    D[g * 8 + 2 * q] = d[0], D[g * 8 + 2 * q + 1] = d[1];
    D[(g + 8) * 8 + 2 * q] = d[2], D[(g + 8) * 8 + 2 * q + 1] = d[3];
}

/* One warp a trial. qk: X = Q (16 x 128), Y = K (16 x 128). pv: X = P (16 x 64), Y = V^T
 * (16 x 64, V's columns as rows), C (16 x 16) fp32. Out: way 1 and way 2 (16 x 8 each). */
template <typename T>
__global__ void probe(const T *X, const T *Y, const float *C, int K, float *out1, float *out2)
{
    const int t = blockIdx.x;
    const T *x = X + (size_t)t * 16 * K, *y = Y + (size_t)t * 16 * K;
    __shared__ float d1[128], d2[128];
    const float *c = C + (size_t)t * 256; /* c[i][j], 16 x 16 */
    for (int e = threadIdx.x; e < 128; e += 32) {
        const int r = e / 8, col = e % 8;
        d1[e] = c[r * 16 + col]; /* way 1: rows of X, columns = rows 0..7 of Y */
        d2[e] = c[col * 16 + r]; /* way 2: rows of Y, columns = rows 0..7 of X (C transposed) */
    }
    __syncwarp();
    gemm_16x8<T>(d1, x, K, y, K, K); /* D1 = X Y^T: A = X, Bt = Y (its first 8 rows) */
    gemm_16x8<T>(d2, y, K, x, K, K); /* D2 = Y X^T */
    __syncwarp();
    for (int e = threadIdx.x; e < 128; e += 32) {
        out1[(size_t)t * 128 + e] = d1[e];
        out2[(size_t)t * 128 + e] = d2[e];
    }
}

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next()
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return rng;
}
static float rnd_spread() /* sign x [1, 2) x 2^(-24 .. 24), some exact zeros */
{
    const uint64_t r = next();
    if (r % 97 == 0)
        return 0.f;
    const float m = 1.f + (float)((r >> 8) & 0xffff) / 65536.f;
    const int ex = (int)((r >> 32) % 49) - 24;
    return ((r >> 60) & 1 ? -1.f : 1.f) * ldexpf(m, ex);
}

template <typename T> static T to_t(float f);
template <> __nv_bfloat16 to_t(float f) { return __float2bfloat16(f); }
template <> __half to_t(float f) { return __float2half(fminf(fmaxf(f, -60000.f), 60000.f)); }

template <typename T> static long run(const char *name, int K, int trials, bool narrow)
{
    std::vector<T> hx((size_t)trials * 16 * K), hy(hx.size());
    std::vector<float> hc((size_t)trials * 256);
    for (auto &v : hx)
        v = to_t<T>(narrow ? ldexpf(rnd_spread(), -(int)(next() % 8)) * 0.001f : rnd_spread());
    for (auto &v : hy)
        v = to_t<T>(narrow ? ldexpf(rnd_spread(), -(int)(next() % 8)) * 0.001f : rnd_spread());
    for (auto &v : hc)
        v = K == 64 ? rnd_spread() : 0.f;
    T *dx, *dy;
    float *dc, *o1, *o2;
    CHECK(cudaMalloc(&dx, hx.size() * sizeof(T)));
    CHECK(cudaMalloc(&dy, hy.size() * sizeof(T)));
    CHECK(cudaMalloc(&dc, hc.size() * 4));
    CHECK(cudaMalloc(&o1, (size_t)trials * 128 * 4));
    CHECK(cudaMalloc(&o2, (size_t)trials * 128 * 4));
    CHECK(cudaMemcpy(dx, hx.data(), hx.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dy, hy.data(), hy.size() * sizeof(T), cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(dc, hc.data(), hc.size() * 4, cudaMemcpyHostToDevice));
    probe<T><<<trials, 32>>>(dx, dy, dc, K, o1, o2);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    std::vector<float> h1((size_t)trials * 128), h2(h1.size());
    CHECK(cudaMemcpy(h1.data(), o1, h1.size() * 4, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(h2.data(), o2, h2.size() * 4, cudaMemcpyDeviceToHost));
    long differ = 0, compared = 0, nonzero = 0;
    for (int t = 0; t < trials; t++)
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) {
                const float a = h1[(size_t)t * 128 + i * 8 + j], b = h2[(size_t)t * 128 + j * 8 + i];
                compared++;
                nonzero += a != 0.f;
                if (memcmp(&a, &b, 4) != 0) {
                    if (differ < 3)
                        printf("  %s trial %d (%d, %d): %.9g vs %.9g\n", name, t, i, j, a, b);
                    differ++;
                }
            }
    printf("%-18s %ld of %ld elements differ (%ld nonzero)\n", name, differ, compared, nonzero);
    cudaFree(dx), cudaFree(dy), cudaFree(dc), cudaFree(o1), cudaFree(o2);
    return differ;
}

int main(int argc, char **argv)
{
    const int trials = argc > 1 ? atoi(argv[1]) : 20000;
    long d = 0;
    d += run<__nv_bfloat16>("qk bf16 spread", 128, trials, false);
    d += run<__nv_bfloat16>("qk bf16 narrow", 128, trials, true);
    d += run<__nv_bfloat16>("pv bf16 spread", 64, trials, false);
    d += run<__half>("qk fp16 spread", 128, trials, false);
    d += run<__half>("qk fp16 narrow", 128, trials, true);
    d += run<__half>("pv fp16 spread", 64, trials, false);
    printf("total differing: %ld\n", d);
    return 0;
}
