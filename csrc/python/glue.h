/*
 * glue.h — what the parts of flash_attn_det._C share (internal; hidden from
 * other shared objects): the module state, a call's tensor arguments, and the
 * argument layer of glue.c. module.c holds the general entries and the module,
 * infer.c the inference entries.
 */
#ifndef FAD_GLUE_H
#define FAD_GLUE_H

#include <Python.h>

#include "dlpack_abi.h"
#include "fad.h"
#include "fad_internal.h"

#pragma GCC visibility push(hidden)

/* Module state: torch's DLPack exchange API, once Python has handed it over
 * (set_dlpack_exchange_api); until then, or for objects of another type,
 * tensors arrive as capsules. */
typedef struct fad_module_state {
    PyObject *api_owner;            /* the capsule that keeps api alive */
    PyTypeObject *tensor_type;      /* the type api unpacks (torch.Tensor and subclasses) */
    const DLPackExchangeAPI *api;   /* NULL: capsules only */
    /* --- for the inference entries (infer.c) --- */
    int can_allocate;               /* api has an allocator, to_py_object and the stream */
    PyObject *is_grad_enabled;      /* torch.is_grad_enabled */
    PyObject *requires_grad;        /* the interned attribute name "requires_grad" */
    int deterministic;              /* the mode, as set_mode last set it */
    int split_size;
    fad_schedule schedule;
    int check_indices;              /* set_index_checks: every call's fad_fwd_params.check_indices */
} fad_module_state;

/* The DLTensors of one call: borrowed from capsules, or filled into slot by
 * the exchange API (lives on the entry function's stack for the call). */
/* (bwd_varlen takes 17: dout, dq, dk, dv, q, k, v, out, lse, cu_seqlens_q/k, seqused_k,
 * block_table, alibi_slopes, workspace, dropout_seq_ids, dropout_seed_offset) */
enum { MAX_TENSOR_ARGS = 20 };
typedef struct tensor_args {
    const fad_module_state *st;
    int used;
    DLTensor slot[MAX_TENSOR_ARGS];
} tensor_args;

fad_module_state *module_state(PyObject *module);
/* The CPU path's thread count for this call (fad_fwd_params.num_threads): the
 * source's answer (set_cpu_threads_source), 1 without one. GIL held. */
int cpu_threads(void);
void set_cpu_threads_source(PyObject *fn);

/* ---- errors, objects -> DLTensor (0 / -1 with a Python exception) ---- */

/* st's message (or the status's name) as a TypeError, ValueError, ... ; NULL. */
PyObject *raise_status(fad_status st, const char *msg);
void tensor_args_init(tensor_args *ta, PyObject *module);
/* obj -> DLTensor: a torch tensor through the exchange API, or a capsule's. */
int get_tensor(tensor_args *ta, PyObject *obj, const char *name, DLTensor **out);
int as_int(PyObject *o, const char *name, int *out);
int as_float(PyObject *o, const char *name, float *out);

/* ---- DLTensor facts and checks ---- */

void *tensor_data(const DLTensor *t);
int64_t tensor_stride(const DLTensor *t, int d); /* in elements */
int is_dtype(DLDataType dt, int code, int bits);
int is_compact(const DLTensor *t);              /* row-major contiguous */
int same_device(const DLTensor *a, const DLTensor *b);
/* On q's device, dtype (code, bits), shape (-1: any), contiguous last dim. */
int check_tensor(const DLTensor *t, const DLTensor *q, const char *name, int code, int bits,
                 int ndim, const int64_t *shape);
int check_contiguous(const DLTensor *t, const char *name);
/* t, written in place, gives every element its own memory (glue.c says what it accepts). */
int check_no_overlap(const DLTensor *t, const char *name);
int check_lse(const DLTensor *lse, const DLTensor *q, int ndim, const int64_t *lshape);
int check_q(const DLTensor *q, int ndim);
int fits_int(int64_t x, const char *name);
int64_t mul_sat(int64_t a, int64_t b);

/* ---- an entry's tensors -> parameters (NULL-able ones as each says) ---- */

int check_fwd(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *out,
              const DLTensor *lse, fad_fwd_params *p);
int check_fwd_kvcache(const DLTensor *q, const DLTensor *kc, const DLTensor *vc,
                      const DLTensor *out, const DLTensor *lse, const DLTensor *seqlens,
                      const DLTensor *batch_idx, const DLTensor *leftpad, const DLTensor *bt,
                      fad_fwd_params *p);
int check_fwd_varlen(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *out,
                     const DLTensor *lse, const DLTensor *cu_q, const DLTensor *cu_k,
                     const DLTensor *used_k, const DLTensor *table, int max_q, int max_k,
                     fad_fwd_params *p);
int check_append(const DLTensor *q, const DLTensor *q_rot, const DLTensor *k, const DLTensor *v,
                 const DLTensor *kc, const DLTensor *vc, const DLTensor *seqlens,
                 const DLTensor *seqlens_out, const DLTensor *batch_idx, const DLTensor *table, const DLTensor *cos, const DLTensor *sin,
                 fad_append_params *p);
void set_out(fad_fwd_params *p, const DLTensor *out);

/* ---- the device a CUDA call runs on (the caller's is restored) ---- */

fad_status enter_device(int dev, int *prev, char *msg, size_t msg_len);
void leave_device(int dev, int prev);

/* ---- infer.c's entries, for module.c's method table ---- */

extern const char infer_doc[], infer_varlen_doc[], infer_kvcache_doc[];
PyObject *fad_py_infer(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_infer_varlen(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_infer_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

/* infer.c's steps, for blocks.c's inference entry: take_tensor (1 take, 0 leave to
 * Python), take_no_grad (1 when autograd records nothing, 0 leave, -1 error), a new tensor
 * from torch's allocator and its release. */
int infer_take_tensor(tensor_args *ta, PyObject *obj, int plain, DLTensor **t);
int infer_take_no_grad(const fad_module_state *st, PyObject *const *objs, int n);
DLManagedTensorVersioned *infer_new_tensor(const fad_module_state *st, const DLTensor *like,
                                           int ndim, const int64_t *shape, DLDataType dtype);
void infer_free_tensor(DLManagedTensorVersioned *m);

/* ---- blocks.c's entries (the batch-invariant building blocks) ---- */

extern const char fad_gemm_doc[], fad_row_reduce_doc[], fad_rms_norm_doc[], fad_rms_norm_bwd_doc[],
    fad_xent_bwd_doc[];
PyObject *fad_py_gemm(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_row_reduce(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_rms_norm(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_rms_norm_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
PyObject *fad_py_xent_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs);
extern const char fad_linear_infer_doc[];
PyObject *fad_py_linear_infer(PyObject *module, PyObject *const *args, Py_ssize_t nargs);

#pragma GCC visibility pop

#endif /* FAD_GLUE_H */
