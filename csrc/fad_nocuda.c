/*
 * fad_nocuda.c — stands in for csrc/cuda/ in a build made without nvcc: every
 * CUDA entry reports FAD_ERR_NO_CUDA with a message that says why.
 */
#include "fad_blocks.h"
#include "fad_internal.h"

#define NO_CUDA_MSG                                                                          \
    "this build of flash_attn_det is CPU-only (it was built without a CUDA compiler); "      \
    "rebuild it with the CUDA kernels: FLASH_ATTN_DET_CUDA=1 pip install --force-reinstall " \
    "--no-deps <its source> (with no CUDA toolkit, the build fetches the CUDA compiler wheels)"

fad_status fad_cuda_num_sms(int *num_sms, char *msg, size_t msg_len)
{
    *num_sms = 0;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_fwd_cuda_launch(const fad_fwd_params *p, const fad_plan *plan, void *workspace,
                               struct CUstream_st *stream, char *msg, size_t msg_len)
{
    (void)p, (void)plan, (void)workspace, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_bwd_cuda_launch(const fad_bwd_params *bp, void *workspace, struct CUstream_st *stream,
                               char *msg, size_t msg_len)
{
    (void)bp, (void)workspace, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

/* (no dQ accumulator without CUDA: the workspace is the row sums alone) */
fad_status fad_bwd_cuda_extra_bytes(const fad_bwd_params *bp, size_t dsum_bytes, size_t *bytes, char *msg,
                                    size_t msg_len)
{
    (void)bp, (void)dsum_bytes, (void)msg, (void)msg_len;
    *bytes = 0;
    return FAD_OK;
}

fad_status fad_append_cuda(const fad_append_params *p, struct CUstream_st *stream, char *msg,
                           size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

int fad_has_cuda(void) { return 0; }

fad_status fad_gemm_cuda(const fad_gemm_params *p, struct CUstream_st *stream, char *msg,
                         size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_rmsnorm_cuda(const fad_rmsnorm_params *p, struct CUstream_st *stream, char *msg,
                            size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_rmsnorm_bwd_cuda(const fad_rmsnorm_bwd_params *p, struct CUstream_st *stream,
                                char *msg, size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_xent_bwd_cuda(const fad_xent_bwd_params *p, struct CUstream_st *stream, char *msg,
                             size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_row_reduce_cuda(const fad_row_params *p, struct CUstream_st *stream, char *msg,
                               size_t msg_len)
{
    (void)p, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_use_wgmma(int *use, char *msg, size_t msg_len)
{
    (void)msg, (void)msg_len;
    *use = 0;
    return FAD_OK;
}

fad_status fad_check_indices_cuda(const fad_fwd_params *p, char *msg, size_t msg_len)
{
    (void)p;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_cuda_set_device(int dev, int *prev, char *msg, size_t msg_len)
{
    (void)dev;
    *prev = 0;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}

fad_status fad_cuda_fill32(void *ptr, uint32_t pattern, size_t words, struct CUstream_st *stream,
                           char *msg, size_t msg_len)
{
    (void)ptr, (void)pattern, (void)words, (void)stream;
    return fad_fail(FAD_ERR_NO_CUDA, msg, msg_len, NO_CUDA_MSG);
}
