/*
 * dlpack_abi.h — our own declarations of the DLPack ABI (dmlc/dlpack, v1.x),
 * written from the specification: only what the glue reads. Layouts must match
 * the spec exactly; they are C structs exchanged between shared objects.
 */
#ifndef FAD_DLPACK_ABI_H
#define FAD_DLPACK_ABI_H

#include <stdint.h>

typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3, kDLCUDAManaged = 13 } DLDeviceType;

typedef struct {
    int32_t device_type; /* DLDeviceType */
    int32_t device_id;
} DLDevice;

typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4, kDLBool = 6 } DLDataTypeCode;

typedef struct {
    uint8_t code;   /* DLDataTypeCode */
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;          /* add byte_offset before use */
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;    /* in elements; NULL means compact row-major */
    uint64_t byte_offset;
} DLTensor;

/* Capsule "dltensor" (pre-1.0 exchange, what torch.utils.dlpack.to_dlpack makes). */
typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

/* Capsule "dltensor_versioned" (DLPack >= 1.0). */
typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

/* The C exchange API (DLPack >= 1.2; torch >= 2.11 exposes it as the capsule
 * "dlpack_exchange_api" in Tensor.__dlpack_c_exchange_api__): C functions of the
 * producer, so a consumer unpacks a tensor object with no capsule and no
 * allocation, and allocates new tensors of the producer's. Each returns 0, or
 * -1 with the error set (a Python exception; the allocator's via SetError). */
typedef struct DLPackExchangeAPIHeader {
    DLPackVersion version;
    struct DLPackExchangeAPIHeader *prev_api; /* an older version of the API, or NULL */
} DLPackExchangeAPIHeader;

typedef struct DLPackExchangeAPI {
    DLPackExchangeAPIHeader header;
    /* A new tensor of prototype's dtype, ndim, shape and device (row-major),
     * owned by the caller. */
    int (*managed_tensor_allocator)(DLTensor *prototype, DLManagedTensorVersioned **out,
                                    void *error_ctx,
                                    void (*SetError)(void *error_ctx, const char *kind,
                                                     const char *message));
    void *managed_tensor_from_py_object_no_sync; /* not called here */
    /* The producer's tensor object of an owned tensor, whose ownership it takes
     * (read here as: even on failure -- at worst a leak, never a double free). */
    int (*managed_tensor_to_py_object_no_sync)(DLManagedTensorVersioned *tensor,
                                               void **out_py_object);
    /* Fills *out (caller-owned; shape and strides borrowed from py_object,
     * valid while it lives). */
    int (*dltensor_from_py_object_no_sync)(void *py_object, DLTensor *out);
    /* The producer's current stream on a device (NULL for the CPU). */
    int (*current_work_stream)(int32_t device_type, int32_t device_id, void **out_stream);
} DLPackExchangeAPI;

#endif /* FAD_DLPACK_ABI_H */
