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

#endif /* FAD_DLPACK_ABI_H */
