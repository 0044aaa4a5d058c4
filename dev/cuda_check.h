// cuda_check.h: CHECK(call) for the standalone dev probes (wgmma_rate.cu, bw_probe.cu): a failed CUDA runtime call prints where and why, and exits. Verdict: helper, no verdict of its own.
#ifndef FAD_DEV_CUDA_CHECK_H
#define FAD_DEV_CUDA_CHECK_H
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(call)                                                                             \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

#endif
