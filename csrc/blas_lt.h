/*
 * blas_lt.h — the part of cuBLASLt's C ABI that blocks_gemm_cuda.c calls, written
 * from NVIDIA's cublasLt.h (CUDA 12 and 13 agree on every value below). The
 * library is opened at run time (dlopen), so the module neither links it nor
 * needs its headers to build: a torch with CUDA has already loaded it.
 */
#ifndef FAD_BLAS_LT_H
#define FAD_BLAS_LT_H

#include <stddef.h>
#include <stdint.h>

struct CUstream_st; /* cudaStream_t's pointee */

typedef int lt_status;                          /* cublasStatus_t: 0 is success */
typedef struct lt_context *lt_handle;           /* cublasLtHandle_t */
typedef struct { uint64_t data[32]; } *lt_matmul_desc;   /* cublasLtMatmulDesc_t */
typedef struct { uint64_t data[8]; } *lt_layout;         /* cublasLtMatrixLayout_t */
typedef struct { uint64_t data[8]; } *lt_pref;           /* cublasLtMatmulPreference_t */
typedef struct { uint64_t data[8]; } lt_algo;            /* cublasLtMatmulAlgo_t */
typedef struct {
    lt_algo algo;
    size_t workspace_size;
    lt_status state;
    float waves_count;
    int reserved[4];
} lt_heuristic;                                          /* cublasLtMatmulHeuristicResult_t */

enum {
    LT_R_32F = 0, LT_R_16F = 2, LT_R_16BF = 14,          /* cudaDataType_t */
    LT_COMPUTE_32F = 68,                                 /* cublasComputeType_t */
    LT_OP_N = 0, LT_OP_T = 1,                            /* cublasOperation_t */
    /* cublasLtMatmulDescAttributes_t */
    LT_DESC_TRANSA = 3, LT_DESC_TRANSB = 4, LT_DESC_EPILOGUE = 7, LT_DESC_BIAS_POINTER = 8,
    LT_DESC_BIAS_DATA_TYPE = 26,
    LT_EPILOGUE_DEFAULT = 1, LT_EPILOGUE_BIAS = 4,       /* cublasLtEpilogue_t */
    /* cublasLtMatmulPreferenceAttributes_t */
    LT_PREF_MAX_WORKSPACE_BYTES = 1, LT_PREF_REDUCTION_SCHEME_MASK = 3,
    LT_PREF_MIN_ALIGNMENT_A = 5, LT_PREF_MIN_ALIGNMENT_B = 6, LT_PREF_MIN_ALIGNMENT_C = 7,
    LT_PREF_MIN_ALIGNMENT_D = 8,
    /* cublasLtMatmulAlgoConfigAttributes_t */
    LT_ALGO_CONFIG_ID = 0, LT_ALGO_CONFIG_TILE_ID = 1, LT_ALGO_CONFIG_SPLITK_NUM = 2,
    LT_ALGO_CONFIG_STAGES_ID = 6,
    LT_REDUCTION_SCHEME_NONE = 0, LT_REDUCTION_SCHEME_COMPUTE_TYPE = 2, /* cublasLtReductionScheme_t */
};

/* The entry points, by their names in the library. */
typedef struct lt_api {
    lt_status (*create)(lt_handle *);
    lt_status (*desc_create)(lt_matmul_desc *, int compute, int scale_type);
    lt_status (*desc_destroy)(lt_matmul_desc);
    lt_status (*desc_set)(lt_matmul_desc, int attr, const void *buf, size_t size);
    lt_status (*layout_create)(lt_layout *, int type, uint64_t rows, uint64_t cols, int64_t ld);
    lt_status (*layout_destroy)(lt_layout);
    lt_status (*pref_create)(lt_pref *);
    lt_status (*pref_destroy)(lt_pref);
    lt_status (*pref_set)(lt_pref, int attr, const void *buf, size_t size);
    lt_status (*heuristic)(lt_handle, lt_matmul_desc, lt_layout a, lt_layout b, lt_layout c,
                           lt_layout d, lt_pref, int requested, lt_heuristic *results,
                           int *returned);
    lt_status (*algo_check)(lt_handle, lt_matmul_desc, lt_layout a, lt_layout b, lt_layout c,
                            lt_layout d, const lt_algo *, lt_heuristic *result);
    lt_status (*config_get)(const lt_algo *, int attr, void *buf, size_t size, size_t *written);
    lt_status (*matmul)(lt_handle, lt_matmul_desc, const void *alpha, const void *a, lt_layout,
                        const void *b, lt_layout, const void *beta, const void *c, lt_layout,
                        void *d, lt_layout, const lt_algo *, void *workspace, size_t ws_size,
                        struct CUstream_st *stream);
} lt_api;

#endif /* FAD_BLAS_LT_H */
