/*
 * device.cu — the current CUDA device: its attributes (SM count, compute
 * capability, asked once per device), switching to it, a fill kernel, and
 * whether the sm_90a (wgmma) kernel variants may run on it.
 */
#include <stdlib.h>
#include <string.h>

#include "mma.cuh"

/* Attribute attr of the current device, asked once per device: cache holds
 * one value per device, 0 = not asked yet (every attribute asked here is > 0). */
static fad_status current_device_attr(cudaDeviceAttr attr, int *cache, int *value, char *msg,
                                      size_t msg_len)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    if (dev < 0 || dev >= FAD_MAX_DEVICES)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "device %d: too many devices", dev);
    if (!cache[dev])
        CUDA_TRY(cudaDeviceGetAttribute(&cache[dev], attr, dev));
    *value = cache[dev];
    return FAD_OK;
}

extern "C" fad_status fad_cuda_num_sms(int *num_sms, char *msg, size_t msg_len)
{
    static int sms[FAD_MAX_DEVICES];
    return current_device_attr(cudaDevAttrMultiProcessorCount, sms, num_sms, msg, msg_len);
}

extern "C" int fad_has_cuda(void) { return 1; }

extern "C" fad_status fad_cuda_alloc(void **ptr, size_t bytes, char *msg, size_t msg_len)
{
    CUDA_TRY(cudaMalloc(ptr, bytes));
    return FAD_OK;
}

extern "C" fad_status fad_cuda_current_device(int *dev, char *msg, size_t msg_len)
{
    CUDA_TRY(cudaGetDevice(dev));
    if (*dev < 0 || *dev >= FAD_MAX_DEVICES)
        return fad_fail(FAD_ERR_CUDA, msg, msg_len, "device %d: too many devices", *dev);
    return FAD_OK;
}

extern "C" fad_status fad_cuda_set_device(int dev, int *prev, char *msg, size_t msg_len)
{
    CUDA_TRY(cudaGetDevice(prev));
    if (*prev != dev)
        CUDA_TRY(cudaSetDevice(dev));
    return FAD_OK;
}

/* words (n, uint32) <- pattern: a grid-stride loop of plain stores (memory bound;
 * at most 1024 CTAs of 256 threads, enough to keep every SM streaming). */
__global__ void fill32_kernel(uint32_t *words, uint32_t pattern, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        words[i] = pattern;
}

extern "C" fad_status fad_cuda_fill32(void *ptr, uint32_t pattern, size_t words,
                                      struct CUstream_st *stream, char *msg, size_t msg_len)
{
    if (!words)
        return FAD_OK;
    const size_t blocks = (words + 255) / 256;
    fill32_kernel<<<(unsigned)(blocks < 1024 ? blocks : 1024), 256, 0, stream>>>(
        (uint32_t *)ptr, pattern, words);
    CUDA_TRY(cudaGetLastError());
    return FAD_OK;
}

/* Compute capability major of the current device: 9 is sm_90 (H100, H200;
 * no other 9.x exists), which runs programmatic dependent launch and, from
 * an sm_90a build, the wgmma kernels. */
extern "C" fad_status fad_cuda_cc_major(int *major, char *msg, size_t msg_len)
{
    static int majors[FAD_MAX_DEVICES];
    return current_device_attr(cudaDevAttrComputeCapabilityMajor, majors, major, msg, msg_len);
}

/* The sm_90a variants (the prefill kernel's, and the backward's: bwd_launch.cu)
 * run when this build has sm_90a code (setup.py defines FAD_SM90A) and the
 * device is sm_90, for the compile-time variants that have them (D 64 or 128,
 * no softcap or ALiBi; the prefill kernel: no paged KV).
 * FLASH_ATTN_DET_WGMMA in the environment (read once): "0" turns them off, for
 * A/B runs and for the tests that compare the two variants' bits; "force"
 * (*use = 2) also runs the backward's variants on grids too small for them
 * to pay (bwd_launch.cu), which those tests need. */
#ifndef FAD_SM90A
#define FAD_SM90A 0
#endif
extern "C" fad_status fad_use_wgmma(int *use, char *msg, size_t msg_len)
{
    static int env = -1; /* 0 off, 1 default, 2 force */
    if (env < 0) {
        const char *e = getenv("FLASH_ATTN_DET_WGMMA");
        env = e && e[0] == '0' ? 0 : e && strcmp(e, "force") == 0 ? 2 : 1;
    }
    *use = 0;
    if (!FAD_SM90A || env == 0)
        return FAD_OK;
    int major = 0;
    fad_status st = fad_cuda_cc_major(&major, msg, msg_len);
    *use = major == 9 ? env : 0;
    return st;
}

/* The checked mode (fad_fwd_params.check_indices): every index array the
 * kernels would read, copied to the host (a sync: the mode is for debugging
 * and tests, not for graphs), then the CPU path's own check of them
 * (fad_check_seqlens_host), so that both devices give the same errors naming
 * the argument and the sequence. One host buffer holds every copy. */
extern "C" fad_status fad_check_indices_cuda(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    fad_fwd_params h = fad_fwd_resolve(p);
    const int B = p->batch;
    const int max_blocks = p->block_table && p->page_size > 0 ? p->seqlen_k / p->page_size : 0;
    const int32_t *dev[6] = {p->cu_seqlens_q, p->cu_seqlens_k, p->seqused_k, p->cache_seqlens,
                             p->cache_batch_idx, p->cache_leftpad};
    const int32_t **host[6] = {&h.cu_seqlens_q, &h.cu_seqlens_k, &h.seqused_k, &h.cache_seqlens,
                               &h.cache_batch_idx, &h.cache_leftpad};
    const size_t counts[6] = {(size_t)B + 1, (size_t)B + 1, (size_t)B, (size_t)B, (size_t)B,
                              (size_t)B};
    size_t total = (size_t)B * max_blocks;
    for (int i = 0; i < 6; i++)
        total += dev[i] ? counts[i] : 0;
    if (total == 0) /* no index array (B >= 0: fad_fwd_check ran first) */
        return fad_check_seqlens_host(&h, msg, msg_len);
    /* every stream's work first: the lengths may come from a kernel queued on
     * another stream (an append), which a copy on the legacy stream would not
     * wait for if that stream is non-blocking */
    CUDA_TRY(cudaDeviceSynchronize());
    int32_t *buf = (int32_t *)malloc(total * sizeof(int32_t));
    if (!buf)
        return fad_fail(FAD_ERR_VALUE, msg, msg_len, "check_indices: cannot allocate %zu bytes",
                        total * sizeof(int32_t));
    fad_status st = FAD_OK;
    cudaError_t err = cudaSuccess;
    int32_t *next = buf;
    for (int i = 0; i < 6 && err == cudaSuccess; i++) {
        if (!dev[i])
            continue;
        err = cudaMemcpy(next, dev[i], counts[i] * sizeof(int32_t), cudaMemcpyDefault);
        *host[i] = next;
        next += counts[i];
    }
    if (err == cudaSuccess && max_blocks) {
        /* rows of max_blocks entries, block_table_stride apart on the device */
        const size_t pitch = (size_t)(B > 1 ? p->block_table_stride : max_blocks) * sizeof(int32_t);
        err = cudaMemcpy2D(next, (size_t)max_blocks * sizeof(int32_t), p->block_table, pitch,
                           (size_t)max_blocks * sizeof(int32_t), (size_t)B, cudaMemcpyDefault);
        h.block_table = next;
        h.block_table_stride = max_blocks;
    }
    if (err != cudaSuccess)
        st = fad_fail(FAD_ERR_CUDA, msg, msg_len, "check_indices: copying the index arrays: %s",
                      cudaGetErrorString(err));
    else
        st = fad_check_seqlens_host(&h, msg, msg_len);
    free(buf);
    return st;
}
