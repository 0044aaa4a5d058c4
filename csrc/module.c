/*
 * module.c — flash_attn_det._C: the CPython glue. Plain C API, no pybind, no
 * libtorch: tensors arrive as torch tensors (unpacked through DLPack's C
 * exchange API) or as DLPack capsules, are checked (in a fixed order, each
 * message naming the argument), turned into an fad_fwd_params and handed to the
 * CPU or CUDA entry of fad.h. Outputs and workspace are allocated by the
 * caller (torch's caching allocator), so nothing here allocates device memory.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#include "dlpack_abi.h"
#include "fad.h"
#include "fad_internal.h"

/* ------------------------------------------------------------------------ */
/* errors                                                                     */
/* ------------------------------------------------------------------------ */

static PyObject *raise_status(fad_status st, const char *msg)
{
    PyObject *type = PyExc_RuntimeError;
    switch (st) {
    case FAD_ERR_DTYPE: type = PyExc_TypeError; break;
    case FAD_ERR_VALUE:
    case FAD_ERR_ALIGNMENT:
    case FAD_ERR_WORKSPACE: type = PyExc_ValueError; break;
    case FAD_ERR_UNSUPPORTED: type = PyExc_NotImplementedError; break;
    default: break;
    }
    PyErr_SetString(type, msg && msg[0] ? msg : fad_status_string(st));
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* tensor objects and DLPack capsules -> DLTensor                             */
/* ------------------------------------------------------------------------ */

/* Module state: torch's DLPack exchange API, once Python has handed it over
 * (set_dlpack_exchange_api); until then, or for objects of another type,
 * tensors arrive as capsules. */
typedef struct fad_module_state {
    PyObject *api_owner;            /* the capsule that keeps api alive */
    PyTypeObject *tensor_type;      /* the type api unpacks (torch.Tensor and subclasses) */
    const DLPackExchangeAPI *api;   /* NULL: capsules only */
    /* --- for the inference entries (infer, infer_kvcache) --- */
    int can_allocate;               /* api has an allocator, to_py_object and the stream */
    PyObject *is_grad_enabled;      /* torch.is_grad_enabled */
    PyObject *requires_grad;        /* the interned attribute name "requires_grad" */
    int deterministic;              /* the mode, as set_mode last set it */
    int split_size;
    fad_schedule schedule;
} fad_module_state;

static fad_module_state *module_state(PyObject *module)
{
    return (fad_module_state *)PyModule_GetState(module);
}

/* The DLTensors of one call: borrowed from capsules, or filled into slot by
 * the exchange API (lives on the entry function's stack for the call). */
enum { MAX_TENSOR_ARGS = 16 };
typedef struct tensor_args {
    const fad_module_state *st;
    int used;
    DLTensor slot[MAX_TENSOR_ARGS];
} tensor_args;

static void tensor_args_init(tensor_args *ta, PyObject *module)
{
    ta->st = module_state(module);
    ta->used = 0;
}

/* obj -> DLTensor: a torch tensor through the exchange API (no capsule, no
 * allocation), or the DLTensor borrowed from a capsule. Either way the caller's
 * tensor stays alive for the whole call, so nothing is consumed. */
static int get_tensor(tensor_args *ta, PyObject *obj, const char *name, DLTensor **out)
{
    const fad_module_state *st = ta->st;
    if (st->api && PyObject_TypeCheck(obj, st->tensor_type)) {
        if (ta->used == MAX_TENSOR_ARGS) {
            PyErr_Format(PyExc_SystemError, "%s: more than %d tensor arguments", name,
                         MAX_TENSOR_ARGS);
            return -1;
        }
        DLTensor *t = &ta->slot[ta->used++];
        if (st->api->dltensor_from_py_object_no_sync(obj, t) != 0)
            return -1;
        *out = t;
        return 0;
    }
    if (PyCapsule_IsValid(obj, "dltensor")) {
        DLManagedTensor *m = (DLManagedTensor *)PyCapsule_GetPointer(obj, "dltensor");
        *out = &m->dl_tensor;
        return 0;
    }
    if (PyCapsule_IsValid(obj, "dltensor_versioned")) {
        DLManagedTensorVersioned *m =
            (DLManagedTensorVersioned *)PyCapsule_GetPointer(obj, "dltensor_versioned");
        if (m->version.major != 1) {
            PyErr_Format(PyExc_ValueError, "%s: unsupported DLPack major version %u", name,
                         m->version.major);
            return -1;
        }
        *out = &m->dl_tensor;
        return 0;
    }
    PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor or a DLPack capsule, got %s", name,
                 Py_TYPE(obj)->tp_name);
    return -1;
}

static void *tensor_data(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

/* Stride of dim d in elements (DLPack allows NULL strides for compact tensors). */
static int64_t tensor_stride(const DLTensor *t, int d)
{
    if (t->strides)
        return t->strides[d];
    int64_t s = 1;
    for (int i = t->ndim - 1; i > d; i--)
        s *= t->shape[i];
    return s;
}

static const char *dtype_name(DLDataType dt)
{
    if (dt.lanes != 1) return "a vector dtype";
    if (dt.code == kDLFloat) return dt.bits == 16 ? "float16" : dt.bits == 32 ? "float32" : dt.bits == 64 ? "float64" : "a float dtype";
    if (dt.code == kDLBfloat && dt.bits == 16) return "bfloat16";
    if (dt.code == kDLInt) return dt.bits == 32 ? "int32" : dt.bits == 64 ? "int64" : "an int dtype";
    if (dt.code == kDLUInt) return dt.bits == 8 ? "uint8" : "an unsigned dtype";
    if (dt.code == kDLBool) return "bool";
    return "an unknown dtype";
}

static int is_dtype(DLDataType dt, int code, int bits)
{
    return dt.code == code && dt.bits == bits && dt.lanes == 1;
}

static int same_device(const DLTensor *a, const DLTensor *b)
{
    return a->device.device_type == b->device.device_type && a->device.device_id == b->device.device_id;
}

static const char *device_name(const DLTensor *t)
{
    switch (t->device.device_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    default: return "an unsupported device";
    }
}

static int check_shape(const DLTensor *t, const char *name, int ndim, const int64_t *want)
{
    if (t->ndim != ndim) {
        PyErr_Format(PyExc_ValueError, "%s: expected %d dims, got %d", name, ndim, (int)t->ndim);
        return -1;
    }
    for (int d = 0; d < ndim; d++)
        if (want[d] >= 0 && t->shape[d] != want[d]) {
            PyErr_Format(PyExc_ValueError, "%s: dim %d must be %lld, got %lld", name, d,
                         (long long)want[d], (long long)t->shape[d]);
            return -1;
        }
    return 0;
}

/* Same device as q, one of the expected dtypes, shape, contiguous last dim. */
static int check_tensor(const DLTensor *t, const DLTensor *q, const char *name, int code, int bits,
                        int ndim, const int64_t *shape)
{
    if (!same_device(t, q)) {
        PyErr_Format(PyExc_ValueError, "%s: must be on the same device as q (%s:%d), got %s:%d",
                     name, device_name(q), (int)q->device.device_id, device_name(t),
                     (int)t->device.device_id);
        return -1;
    }
    if (!is_dtype(t->dtype, code, bits)) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype %s, got %s", name,
                     dtype_name((DLDataType){(uint8_t)code, (uint8_t)bits, 1}), dtype_name(t->dtype));
        return -1;
    }
    if (check_shape(t, name, ndim, shape))
        return -1;
    if (ndim && t->shape[ndim - 1] > 1 && tensor_stride(t, ndim - 1) != 1) {
        PyErr_Format(PyExc_ValueError, "%s: last dim must be contiguous (stride 1), got stride %lld",
                     name, (long long)tensor_stride(t, ndim - 1));
        return -1;
    }
    return 0;
}

/* 1 when t is row-major contiguous (torch's is_contiguous()). */
static int is_compact(const DLTensor *t)
{
    int64_t s = 1;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0)
            return 1; /* an empty tensor is contiguous whatever its strides */
    for (int d = t->ndim - 1; d >= 0; d--) {
        if (t->shape[d] > 1 && tensor_stride(t, d) != s)
            return 0;
        s *= t->shape[d];
    }
    return 1;
}

static int check_contiguous(const DLTensor *t, const char *name)
{
    if (is_compact(t))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: must be contiguous", name);
    return -1;
}

/* softmax_lse: float32, contiguous, shape lshape on q's device; or NULL (None:
 * a forward that does not need it skips the allocation and the stores). */
static int check_lse(const DLTensor *lse, const DLTensor *q, int ndim, const int64_t *lshape)
{
    if (!lse)
        return 0;
    return check_tensor(lse, q, "softmax_lse", kDLFloat, 32, ndim, lshape) ||
           check_contiguous(lse, "softmax_lse");
}

static int as_int(PyObject *o, const char *name, int *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s: expected an int", name);
        return -1;
    }
    if (v < INT32_MIN || v > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %ld does not fit in 32 bits", name, v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int as_float(PyObject *o, const char *name, float *out)
{
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s: expected a float", name);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* fwd                                                                        */
/* ------------------------------------------------------------------------ */

/* Options shared by fwd and fwd_varlen: their last FWD_NOPTS arguments,
 * (alibi_slopes, workspace, softmax_scale, softcap, window_left, window_right,
 *  causal, deterministic, split_size, schedule, stream). */
enum { FWD_NOPTS = 11 };

typedef struct fwd_opts {
    DLTensor *alibi, *ws; /* NULL when None */
    long long stream;     /* cudaStream_t as an int */
} fwd_opts;

static int parse_opts(tensor_args *ta, PyObject *const *a, fad_fwd_params *p, fwd_opts *o)
{
    int causal, deterministic, schedule;
    o->alibi = o->ws = NULL;
    if (a[0] != Py_None && get_tensor(ta, a[0], "alibi_slopes", &o->alibi))
        return -1;
    if (a[1] != Py_None && get_tensor(ta, a[1], "workspace", &o->ws))
        return -1;
    if (as_float(a[2], "softmax_scale", &p->softmax_scale) || as_float(a[3], "softcap", &p->softcap) ||
        as_int(a[4], "window_left", &p->window_left) || as_int(a[5], "window_right", &p->window_right) ||
        as_int(a[6], "causal", &causal) || as_int(a[7], "deterministic", &deterministic) ||
        as_int(a[8], "split_size", &p->split_size) || as_int(a[9], "schedule", &schedule))
        return -1;
    o->stream = PyLong_AsLongLong(a[10]);
    if (o->stream == -1 && PyErr_Occurred())
        return -1;
    p->causal = causal;
    p->deterministic = deterministic;
    p->schedule = (fad_schedule)schedule;
    return 0;
}

/* q first: it fixes device, dtype and rank for everything else. */
static int check_q(const DLTensor *q, int ndim)
{
    if (q->device.device_type != kDLCPU && q->device.device_type != kDLCUDA) {
        PyErr_Format(PyExc_ValueError, "q: must be a CPU or CUDA tensor, got %s", device_name(q));
        return -1;
    }
    if (!is_dtype(q->dtype, kDLFloat, 16) && !is_dtype(q->dtype, kDLBfloat, 16)) {
        PyErr_Format(PyExc_TypeError, "q: expected dtype float16 or bfloat16, got %s",
                     dtype_name(q->dtype));
        return -1;
    }
    const int64_t any[4] = {-1, -1, -1, -1};
    return check_tensor(q, q, "q", q->dtype.code, 16, ndim, any);
}

static int fits_int(int64_t x, const char *name)
{
    if (x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %lld does not fit in 32 bits", name, (long long)x);
        return -1;
    }
    return 0;
}

/* Checks the options' tensors against p (sizes filled in) and stores them. */
static int finish_opts(fad_fwd_params *p, const DLTensor *q, const fwd_opts *o)
{
    if (o->alibi) {
        const int64_t a1[1] = {p->num_heads}, a2[2] = {p->batch, p->num_heads};
        const int two = o->alibi->ndim == 2;
        if (check_tensor(o->alibi, q, "alibi_slopes", kDLFloat, 32, two ? 2 : 1, two ? a2 : a1))
            return -1;
        p->alibi_slopes = (const float *)tensor_data(o->alibi);
        p->alibi_batch_stride = two ? tensor_stride(o->alibi, 0) : 0;
    }
    if (o->ws && (!same_device(o->ws, q) || !is_dtype(o->ws->dtype, kDLUInt, 8) ||
                  o->ws->ndim != 1 || check_contiguous(o->ws, "workspace"))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError,
                            "workspace: expected a 1-D uint8 tensor on the device of q");
        return -1;
    }
    p->dtype = q->dtype.code == kDLBfloat ? FAD_BFLOAT16 : FAD_FLOAT16;
    return 0;
}

/* out (shaped like q, already checked): its pointer and strides into p. */
static void set_out(fad_fwd_params *p, const DLTensor *out)
{
    p->out = tensor_data(out);
    p->out_batch_stride = tensor_stride(out, 0), p->out_row_stride = tensor_stride(out, 1);
    p->out_head_stride = tensor_stride(out, 2);
}

/* A CUDA call runs with its tensors' device current and restores the caller's:
 * enter_device makes dev current (*prev receives the old one), leave_device
 * switches back when they differ. */
static fad_status enter_device(int dev, int *prev, char *msg, size_t msg_len)
{
    return fad_cuda_set_device(dev, prev, msg, msg_len);
}

static void leave_device(int dev, int prev)
{
    if (prev != dev) {
        char ignored[64];
        fad_cuda_set_device(prev, &prev, ignored, sizeof ignored);
    }
}

/* Runs the forward on the CPU or the GPU; everything was checked before.
 * Returns None, or -- when the workspace given is missing or too small, in
 * which case nothing was written -- the bytes it needs, so that the caller can
 * remember sizes per shape and skip a separate sizing call. */
static PyObject *run_fwd(fad_fwd_params *p, const DLTensor *q, const fwd_opts *o)
{
    char msg[512] = "";
    size_t need = 0;
    if (finish_opts(p, q, o))
        return NULL;
    fad_status st;
    if (q->device.device_type == kDLCPU) {
        Py_BEGIN_ALLOW_THREADS /* fad_fwd_cpu checks everything before it writes */
        st = fad_fwd_cpu(p, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    } else {
        int prev = 0;
        st = enter_device(q->device.device_id, &prev, msg, sizeof msg);
        if (st == FAD_OK) {
            st = fad_fwd_cuda(p, o->ws ? tensor_data(o->ws) : NULL,
                              o->ws ? (size_t)o->ws->shape[0] : 0,
                              (struct CUstream_st *)(uintptr_t)o->stream, msg, sizeof msg);
            if (st == FAD_ERR_WORKSPACE)
                st = fad_fwd_workspace_size(p, &need, msg, sizeof msg);
            leave_device(q->device.device_id, prev);
        }
    }
    if (st != FAD_OK)
        return raise_status(st, msg);
    if (need)
        return PyLong_FromSize_t(need);
    Py_RETURN_NONE;
}

/* Backward: grads = (dout, dq, dk, dv) tensors, each the shape and strides of
 * (out, q, k, v); on the GPU the workspace holds one fp32 per softmax_lse element. */
static PyObject *run_bwd(tensor_args *ta, fad_fwd_params *p, const DLTensor *const fwd_t[4],
                         PyObject *const *grads, const fwd_opts *o)
{
    static const char *names[4] = {"dout", "dq", "dk", "dv"};
    fad_bwd_params bp;
    DLTensor *g[4];
    char msg[512] = "";
    const DLTensor *q = fwd_t[1];
    for (int t = 0; t < 4; t++) {
        const DLTensor *like = fwd_t[t];
        if (get_tensor(ta, grads[t], names[t], &g[t]) ||
            check_tensor(g[t], q, names[t], q->dtype.code, 16, like->ndim, like->shape))
            return NULL;
        for (int d = 0; d < like->ndim; d++)
            if (like->shape[d] > 1 && tensor_stride(g[t], d) != tensor_stride(like, d)) {
                PyErr_Format(PyExc_ValueError, "%s: strides must equal those of %s", names[t],
                             t == 0 ? "out" : t == 1 ? "q" : t == 2 ? "k" : "v");
                return NULL;
            }
    }
    if (finish_opts(p, q, o))
        return NULL;
    bp.fwd = *p;
    bp.dout = tensor_data(g[0]), bp.dq = tensor_data(g[1]);
    bp.dk = tensor_data(g[2]), bp.dv = tensor_data(g[3]);
    fad_status st;
    if (q->device.device_type == kDLCPU) {
        Py_BEGIN_ALLOW_THREADS
        st = fad_bwd_cpu(&bp, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    } else {
        int prev = 0;
        st = enter_device(q->device.device_id, &prev, msg, sizeof msg);
        if (st == FAD_OK) {
            st = fad_bwd_cuda(&bp, o->ws ? tensor_data(o->ws) : NULL,
                              o->ws ? (size_t)o->ws->shape[0] : 0,
                              (struct CUstream_st *)(uintptr_t)o->stream, msg, sizeof msg);
            leave_device(q->device.device_id, prev);
        }
    }
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fwd_doc,
"fwd(q, k, v, out, softmax_lse, alibi_slopes, workspace, softmax_scale, softcap,\n"
"    window_left, window_right, causal, deterministic, split_size, schedule, stream)\n"
"--\n\n"
"Attention forward. q, k, v, out, softmax_lse are tensors (torch.Tensor once\n"
"set_dlpack_exchange_api has been called, or DLPack capsules; q (B, Sq, Hq, D),\n"
"k/v (B, Sk, Hkv, D), out like q, softmax_lse (B, Hq, Sq) float32 contiguous, or\n"
"None when the caller does not need it: not computed); alibi_slopes (float32 (Hq,)\n"
"or (B, Hq)) and workspace (uint8, fwd_workspace_size bytes) are such tensors or None.\n"
"stream is a cudaStream_t as an int (ignored on CPU).\n"
"Everything is checked before anything is written. Returns None, or, when the\n"
"workspace is missing or too small (nothing written), the bytes it needs.");

/* Checks the tensors of a padded-layout forward (out and lse NULL-able: not
 * checked, not set) and fills p's pointers, strides and sizes. */
static int check_fwd(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *out,
                     const DLTensor *lse, fad_fwd_params *p)
{
    if (check_q(q, 4))
        return -1;
    const int code = q->dtype.code;
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], D = q->shape[3];
    const int64_t kshape[4] = {B, -1, -1, D};
    if (check_tensor(k, q, "k", code, 16, 4, kshape))
        return -1;
    const int64_t Sk = k->shape[1], Hk = k->shape[2];
    const int64_t vshape[4] = {B, Sk, Hk, D}, oshape[4] = {B, Sq, H, D}, lshape[3] = {B, H, Sq};
    if (check_tensor(v, q, "v", code, 16, 4, vshape) ||
        (out && check_tensor(out, q, "out", code, 16, 4, oshape)) || check_lse(lse, q, 3, lshape) ||
        fits_int(B, "q: batch") ||
        fits_int(Sq, "q: seqlen") || fits_int(H, "q: heads") || fits_int(Sk, "k: seqlen") ||
        fits_int(Hk, "k: heads"))
        return -1;

    p->q = tensor_data(q), p->k = tensor_data(k), p->v = tensor_data(v);
    p->softmax_lse = lse ? (float *)tensor_data(lse) : NULL;
    p->q_batch_stride = tensor_stride(q, 0), p->q_row_stride = tensor_stride(q, 1), p->q_head_stride = tensor_stride(q, 2);
    p->k_batch_stride = tensor_stride(k, 0), p->k_row_stride = tensor_stride(k, 1), p->k_head_stride = tensor_stride(k, 2);
    p->v_batch_stride = tensor_stride(v, 0), p->v_row_stride = tensor_stride(v, 1), p->v_head_stride = tensor_stride(v, 2);
    if (out)
        set_out(p, out);
    p->batch = (int)B, p->seqlen_q = (int)Sq, p->seqlen_k = (int)Sk;
    p->num_heads = (int)H, p->num_heads_k = (int)Hk, p->head_dim = (int)D;
    return 0;
}

/* Fills p from fwd's arguments (padded layout); t receives q, k, v, out. */
static int fill_fwd(tensor_args *ta, PyObject *const *args, fad_fwd_params *p, fwd_opts *o,
                    DLTensor *t[4])
{
    DLTensor *q, *k, *v, *out, *lse = NULL;
    fad_fwd_params_init(p);
    if (get_tensor(ta, args[0], "q", &q) || get_tensor(ta, args[1], "k", &k) ||
        get_tensor(ta, args[2], "v", &v) || get_tensor(ta, args[3], "out", &out) ||
        (args[4] != Py_None && get_tensor(ta, args[4], "softmax_lse", &lse)) ||
        parse_opts(ta, args + 5, p, o) || check_fwd(q, k, v, out, lse, p))
        return -1;
    t[0] = out, t[1] = q, t[2] = k, t[3] = v;
    return 0;
}

static PyObject *fad_py_fwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *t[4];
    if (nargs != 5 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "fwd: expected %d arguments, got %zd", 5 + FWD_NOPTS, nargs);
        return NULL;
    }
    if (fill_fwd(ta, args, &p, &o, t))
        return NULL;
    return run_fwd(&p, t[1], &o);
}

PyDoc_STRVAR(fwd_kvcache_doc,
"fwd_kvcache(q, k_cache, v_cache, out, softmax_lse, cache_seqlens, cache_batch_idx,\n"
"            cache_leftpad, block_table, <the options of fwd>)\n"
"--\n\n"
"Attention of q (B, Sq, Hq, D) over a KV cache (Bc, capacity, Hkv, D): sequence b\n"
"attends cache rows [cache_leftpad[b], cache_seqlens[b]) of entry cache_batch_idx[b]\n"
"(int32 (B,) each; the last two may be None). block_table (None, or int32 (B,\n"
"max_blocks)): a paged cache (pages, page_size, Hkv, D), page_size a multiple of 16;\n"
"position x of sequence b is row x % page_size of page block_table[b, x // page_size]\n"
"(not with cache_batch_idx). out like q, softmax_lse (B, Hq, Sq) or None.");

/* Checks the tensors of a KV-cache forward (out, lse, batch_idx, leftpad, bt
 * NULL-able; out NULL: not checked, not set) and fills p. */
static int check_fwd_kvcache(const DLTensor *q, const DLTensor *kc, const DLTensor *vc,
                             const DLTensor *out, const DLTensor *lse, const DLTensor *seqlens,
                             const DLTensor *batch_idx, const DLTensor *leftpad,
                             const DLTensor *bt, fad_fwd_params *p)
{
    if (check_q(q, 4))
        return -1;
    const int code = q->dtype.code;
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], D = q->shape[3];
    const int64_t kshape[4] = {-1, -1, -1, D};
    if (check_tensor(kc, q, "k_cache", code, 16, 4, kshape))
        return -1;
    const int64_t Bc = kc->shape[0], cap = kc->shape[1], Hk = kc->shape[2];
    const int64_t vshape[4] = {Bc, cap, Hk, D}, oshape[4] = {B, Sq, H, D}, lshape[3] = {B, H, Sq};
    const int64_t bshape[1] = {B};
    if (check_tensor(vc, q, "v_cache", code, 16, 4, vshape) ||
        (out && check_tensor(out, q, "out", code, 16, 4, oshape)) || check_lse(lse, q, 3, lshape) ||
        check_tensor(seqlens, q, "cache_seqlens", kDLInt, 32, 1, bshape) ||
        (batch_idx && check_tensor(batch_idx, q, "cache_batch_idx", kDLInt, 32, 1, bshape)) ||
        (leftpad && check_tensor(leftpad, q, "cache_leftpad", kDLInt, 32, 1, bshape)) ||
        fits_int(B, "q: batch") || fits_int(Sq, "q: seqlen") || fits_int(H, "q: heads") ||
        fits_int(Bc, "k_cache: batch") || fits_int(cap, "k_cache: seqlen") ||
        fits_int(Hk, "k_cache: heads"))
        return -1;
    int64_t seqlen_k = cap; /* paged: max_blocks * page_size */
    if (bt) {
        const int64_t btshape[2] = {B, -1};
        if (check_tensor(bt, q, "block_table", kDLInt, 32, 2, btshape) ||
            fits_int(bt->shape[1] * cap, "block_table: max_blocks * page_size") ||
            fits_int(tensor_stride(bt, 0), "block_table: row stride"))
            return -1;
        seqlen_k = bt->shape[1] * cap;
        p->block_table = (const int32_t *)tensor_data(bt);
        p->block_table_stride = (int)tensor_stride(bt, 0);
        p->page_size = (int)cap;
    }

    p->q = tensor_data(q), p->k = tensor_data(kc), p->v = tensor_data(vc);
    p->softmax_lse = lse ? (float *)tensor_data(lse) : NULL;
    p->cache_seqlens = (const int32_t *)tensor_data(seqlens);
    p->cache_batch_idx = batch_idx ? (const int32_t *)tensor_data(batch_idx) : NULL;
    p->cache_leftpad = leftpad ? (const int32_t *)tensor_data(leftpad) : NULL;
    p->kv_batch = (int)Bc;
    p->q_batch_stride = tensor_stride(q, 0), p->q_row_stride = tensor_stride(q, 1), p->q_head_stride = tensor_stride(q, 2);
    p->k_batch_stride = tensor_stride(kc, 0), p->k_row_stride = tensor_stride(kc, 1), p->k_head_stride = tensor_stride(kc, 2);
    p->v_batch_stride = tensor_stride(vc, 0), p->v_row_stride = tensor_stride(vc, 1), p->v_head_stride = tensor_stride(vc, 2);
    if (out)
        set_out(p, out);
    p->batch = (int)B, p->seqlen_q = (int)Sq, p->seqlen_k = (int)seqlen_k;
    p->num_heads = (int)H, p->num_heads_k = (int)Hk, p->head_dim = (int)D;
    return 0;
}

static PyObject *fad_py_fwd_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *q, *kc, *vc, *out, *lse = NULL, *seqlens, *batch_idx = NULL, *leftpad = NULL, *bt = NULL;
    fad_fwd_params p;
    fwd_opts o;
    if (nargs != 9 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "fwd_kvcache: expected %d arguments, got %zd",
                     9 + FWD_NOPTS, nargs);
        return NULL;
    }
    fad_fwd_params_init(&p);
    if (get_tensor(ta, args[0], "q", &q) || get_tensor(ta, args[1], "k_cache", &kc) ||
        get_tensor(ta, args[2], "v_cache", &vc) || get_tensor(ta, args[3], "out", &out) ||
        (args[4] != Py_None && get_tensor(ta, args[4], "softmax_lse", &lse)) ||
        get_tensor(ta, args[5], "cache_seqlens", &seqlens) ||
        (args[6] != Py_None && get_tensor(ta, args[6], "cache_batch_idx", &batch_idx)) ||
        (args[7] != Py_None && get_tensor(ta, args[7], "cache_leftpad", &leftpad)) ||
        (args[8] != Py_None && get_tensor(ta, args[8], "block_table", &bt)) ||
        parse_opts(ta, args + 9, &p, &o) ||
        check_fwd_kvcache(q, kc, vc, out, lse, seqlens, batch_idx, leftpad, bt, &p))
        return NULL;
    return run_fwd(&p, q, &o);
}

PyDoc_STRVAR(bwd_doc,
"bwd(dout, dq, dk, dv, <the arguments of fwd>)\n"
"--\n\n"
"Gradients of the forward fwd computed (out and softmax_lse are its results).\n"
"dout, dq, dk, dv: capsules shaped and strided like out, q, k, v; dq is written in\n"
"full, dk/dv on the rows some query sees (pass zeros). CUDA tensors need a uint8\n"
"workspace of 4 bytes per softmax_lse element.");

static PyObject *fad_py_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *t[4];
    if (nargs != 4 + 5 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "bwd: expected %d arguments, got %zd", 4 + 5 + FWD_NOPTS,
                     nargs);
        return NULL;
    }
    if (fill_fwd(ta, args + 4, &p, &o, t))
        return NULL;
    return run_bwd(ta, &p, (const DLTensor *const *)t, args, &o);
}

PyDoc_STRVAR(fwd_varlen_doc,
"fwd_varlen(q, k, v, out, softmax_lse, cu_seqlens_q, cu_seqlens_k, seqused_k,\n"
"           block_table, max_seqlen_q, max_seqlen_k, alibi_slopes, workspace,\n"
"           softmax_scale, softcap, window_left, window_right, causal, deterministic,\n"
"           split_size, schedule, stream)\n"
"--\n\n"
"Attention forward over a variable-length batch. q (total_q, Hq, D), k/v (total_k,\n"
"Hkv, D), out like q, softmax_lse (Hq, total_q) float32 contiguous or None; cu_seqlens_q/k\n"
"int32 (B+1,), seqused_k int32 (B,) or None. block_table int32 (B, max_blocks) or\n"
"None: k/v are then pages (num_pages, page_size, Hkv, D) and sequence b's key j is\n"
"row j % page_size of page block_table[b][j / page_size] (cu_seqlens_k gives the\n"
"lengths; max_seqlen_k is the table's capacity). Other arguments as fwd.");

/* Fills p from fwd_varlen's arguments; t receives q, k, v, out. */
static int fill_fwd_varlen(tensor_args *ta, PyObject *const *args, fad_fwd_params *p,
                           fwd_opts *o, DLTensor *t[4])
{
    DLTensor *q, *k, *v, *out, *lse = NULL, *cu_q, *cu_k, *used_k = NULL, *table = NULL;
    int max_q, max_k;

    fad_fwd_params_init(p);
    if (get_tensor(ta, args[0], "q", &q) || get_tensor(ta, args[1], "k", &k) ||
        get_tensor(ta, args[2], "v", &v) || get_tensor(ta, args[3], "out", &out) ||
        (args[4] != Py_None && get_tensor(ta, args[4], "softmax_lse", &lse)) ||
        get_tensor(ta, args[5], "cu_seqlens_q", &cu_q) ||
        get_tensor(ta, args[6], "cu_seqlens_k", &cu_k) ||
        (args[7] != Py_None && get_tensor(ta, args[7], "seqused_k", &used_k)) ||
        (args[8] != Py_None && get_tensor(ta, args[8], "block_table", &table)) ||
        as_int(args[9], "max_seqlen_q", &max_q) || as_int(args[10], "max_seqlen_k", &max_k) ||
        parse_opts(ta, args + 11, p, o) || check_q(q, 3))
        return -1;
    const int code = q->dtype.code;
    const int64_t Tq = q->shape[0], H = q->shape[1], D = q->shape[2];
    /* paged: k/v (num_pages, page_size, Hkv, D), one more leading dim */
    const int kd = table ? 4 : 3;
    const int64_t kshape3[3] = {-1, -1, D}, kshape4[4] = {-1, -1, -1, D};
    if (check_tensor(k, q, "k", code, 16, kd, table ? kshape4 : kshape3))
        return -1;
    const int64_t Tk = k->shape[0], Hk = k->shape[kd - 2];
    const int64_t vshape3[3] = {Tk, Hk, D}, vshape4[4] = {Tk, table ? k->shape[1] : 0, Hk, D};
    const int64_t *vshape = table ? vshape4 : vshape3;
    const int64_t oshape[3] = {Tq, H, D}, lshape[2] = {H, Tq};
    const int64_t cushape[1] = {-1};
    if (check_tensor(v, q, "v", code, 16, kd, vshape) ||
        check_tensor(out, q, "out", code, 16, 3, oshape) || check_lse(lse, q, 2, lshape) ||
        check_tensor(cu_q, q, "cu_seqlens_q", kDLInt, 32, 1, cushape))
        return -1;
    const int64_t B = cu_q->shape[0] - 1;
    const int64_t cukshape[1] = {B + 1}, usedshape[1] = {B};
    if (B < 0) {
        PyErr_SetString(PyExc_ValueError, "cu_seqlens_q: needs at least one entry (batch + 1)");
        return -1;
    }
    const int64_t tshape[2] = {B, -1};
    if (check_tensor(cu_k, q, "cu_seqlens_k", kDLInt, 32, 1, cukshape) ||
        (used_k && check_tensor(used_k, q, "seqused_k", kDLInt, 32, 1, usedshape)) ||
        (table && check_tensor(table, q, "block_table", kDLInt, 32, 2, tshape)) ||
        fits_int(Tq, "q: total rows") || fits_int(Tk, "k: total rows") || fits_int(H, "q: heads") ||
        fits_int(Hk, "k: heads"))
        return -1;
    if (max_q < 0 || max_k < 0) {
        PyErr_Format(PyExc_ValueError, "max_seqlen_q, max_seqlen_k: must be >= 0 (got %d, %d)",
                     max_q, max_k);
        return -1;
    }

    p->q = tensor_data(q), p->k = tensor_data(k), p->v = tensor_data(v), p->out = tensor_data(out);
    p->softmax_lse = lse ? (float *)tensor_data(lse) : NULL;
    p->cu_seqlens_q = (const int32_t *)tensor_data(cu_q);
    p->cu_seqlens_k = (const int32_t *)tensor_data(cu_k);
    p->seqused_k = used_k ? (const int32_t *)tensor_data(used_k) : NULL;
    p->q_row_stride = tensor_stride(q, 0), p->q_head_stride = tensor_stride(q, 1);
    p->k_row_stride = tensor_stride(k, kd - 3), p->k_head_stride = tensor_stride(k, kd - 2);
    p->v_row_stride = tensor_stride(v, kd - 3), p->v_head_stride = tensor_stride(v, kd - 2);
    p->out_row_stride = tensor_stride(out, 0), p->out_head_stride = tensor_stride(out, 1);
    p->batch = (int)B, p->seqlen_q = max_q, p->seqlen_k = max_k;
    p->total_q = (int)Tq, p->total_k = (int)Tk;
    if (table) { /* the pages: sequence lengths from cu_seqlens_k, capacity from the table */
        if (fits_int(k->shape[1], "k: page_size") || fits_int(table->shape[1], "block_table: dim 1") ||
            fits_int(table->shape[1] * k->shape[1], "block_table: capacity"))
            return -1;
        p->block_table = (const int32_t *)tensor_data(table);
        p->block_table_stride = (int)tensor_stride(table, 0);
        p->page_size = (int)k->shape[1];
        p->kv_batch = (int)Tk;
        p->k_batch_stride = tensor_stride(k, 0), p->v_batch_stride = tensor_stride(v, 0);
        p->seqlen_k = (int)(table->shape[1] * k->shape[1]);
        p->total_k = p->seqlen_k; /* keys are found through the table, not cu_seqlens_k's offsets */
    }
    p->num_heads = (int)H, p->num_heads_k = (int)Hk, p->head_dim = (int)D;
    t[0] = out, t[1] = q, t[2] = k, t[3] = v;
    return 0;
}

static PyObject *fad_py_fwd_varlen(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *t[4];
    if (nargs != 11 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "fwd_varlen: expected %d arguments, got %zd",
                     11 + FWD_NOPTS, nargs);
        return NULL;
    }
    if (fill_fwd_varlen(ta, args, &p, &o, t))
        return NULL;
    return run_fwd(&p, t[1], &o);
}

PyDoc_STRVAR(bwd_varlen_doc,
"bwd_varlen(dout, dq, dk, dv, <the arguments of fwd_varlen>)\n"
"--\n\n"
"bwd for a variable-length batch.");

static PyObject *fad_py_bwd_varlen(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *t[4];
    if (nargs != 4 + 11 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "bwd_varlen: expected %d arguments, got %zd",
                     4 + 11 + FWD_NOPTS, nargs);
        return NULL;
    }
    if (fill_fwd_varlen(ta, args + 4, &p, &o, t))
        return NULL;
    return run_bwd(ta, &p, (const DLTensor *const *)t, args, &o);
}

/* ------------------------------------------------------------------------ */
/* fwd_workspace_size                                                         */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(fwd_workspace_size_doc,
"fwd_workspace_size(batch, seqlen_q, seqlen_k, num_heads, num_heads_k, head_dim,\n"
"                   deterministic, split_size, schedule, device_index, total_q=-1) -> int\n"
"--\n\n"
"Bytes of CUDA workspace fwd needs for these sizes on that device (often 0).\n"
"For fwd_varlen pass max_seqlen_q/k as seqlen_q/k and total_q (rows of q).");

static PyObject *fad_py_fwd_workspace_size(PyObject *module, PyObject *const *args,
                                           Py_ssize_t nargs)
{
    (void)module;
    fad_fwd_params p;
    char msg[512] = "";
    int deterministic, schedule, device, prev = 0;
    size_t bytes = 0;

    if (nargs != 10 && nargs != 11) {
        PyErr_Format(PyExc_TypeError, "fwd_workspace_size: expected 10 or 11 arguments, got %zd",
                     nargs);
        return NULL;
    }
    fad_fwd_params_init(&p);
    p.softmax_scale = 1.f;
    if (as_int(args[0], "batch", &p.batch) || as_int(args[1], "seqlen_q", &p.seqlen_q) ||
        as_int(args[2], "seqlen_k", &p.seqlen_k) || as_int(args[3], "num_heads", &p.num_heads) ||
        as_int(args[4], "num_heads_k", &p.num_heads_k) || as_int(args[5], "head_dim", &p.head_dim) ||
        as_int(args[6], "deterministic", &deterministic) ||
        as_int(args[7], "split_size", &p.split_size) || as_int(args[8], "schedule", &schedule) ||
        as_int(args[9], "device_index", &device))
        return NULL;
    p.deterministic = deterministic;
    p.schedule = (fad_schedule)schedule;
    if (nargs == 11) {
        int total_q;
        if (as_int(args[10], "total_q", &total_q))
            return NULL;
        if (total_q >= 0) { /* varlen: the flat rows are (Hq, total_q); pointers are not read */
            static const int32_t dummy[1];
            p.cu_seqlens_q = p.cu_seqlens_k = dummy;
            p.total_q = total_q;
        }
    }
    fad_status st = enter_device(device, &prev, msg, sizeof msg);
    if (st == FAD_OK) {
        st = fad_fwd_workspace_size(&p, &bytes, msg, sizeof msg);
        leave_device(device, prev);
    }
    if (st != FAD_OK)
        return raise_status(st, msg);
    return PyLong_FromSize_t(bytes);
}

/* ------------------------------------------------------------------------ */
/* append_kvcache                                                             */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(append_kvcache_doc,
"append_kvcache(q, q_rot, k, v, k_cache, v_cache, cache_seqlens, seqlens_out,\n"
"               cache_batch_idx, cache_leftpad, block_table, rotary_cos, rotary_sin,\n"
"               rotary_interleaved, rotate_q_per_row, stream)\n"
"--\n\n"
"flash_attn_with_kvcache's rotary and append on CUDA tensors, one kernel (fad.h,\n"
"fad_append_params). q (B, Sq, Hq, D); q_rot like q, contiguous, or None without\n"
"rotary; k, v (B, Snew, Hkv, D) or None; k_cache, v_cache (entries or pages, rows,\n"
"Hkv, D); int32 cache_seqlens (B,), seqlens_out (B,) or None (receives\n"
"cache_seqlens + Snew), cache_batch_idx, cache_leftpad (B,) or None, block_table\n"
"(B, max_blocks) or None; rotary_cos/sin (seqlen_ro, rotary_dim / 2), float32 or\n"
"q's dtype, contiguous, or None.");

/* An optional int32 vector (B,) or matrix (B, n) on q's device (NULL: None). */
static int check_index(const DLTensor *t, const DLTensor *q, const char *name, int ndim)
{
    const int64_t shape[2] = {q->shape[0], -1};
    return t ? check_tensor(t, q, name, kDLInt, 32, ndim, shape) : 0;
}

/* Checks append_kvcache's tensors (q_rot, k, v, seqlens_out, batch_idx,
 * leftpad, table, cos, sin NULL-able; k and v together, cos and sin together)
 * and fills p; p->rotary_interleaved and rotate_q_per_row are the caller's. */
static int check_append(const DLTensor *q, const DLTensor *q_rot, const DLTensor *k,
                        const DLTensor *v, const DLTensor *kc, const DLTensor *vc,
                        const DLTensor *seqlens, const DLTensor *seqlens_out,
                        const DLTensor *batch_idx, const DLTensor *leftpad, const DLTensor *table,
                        const DLTensor *cos, const DLTensor *sin, fad_append_params *p)
{
    if (check_q(q, 4))
        return -1;
    if (q->device.device_type != kDLCUDA) {
        PyErr_SetString(PyExc_ValueError, "q: append_kvcache takes CUDA tensors");
        return -1;
    }
    const int code = q->dtype.code;
    const int64_t B = q->shape[0], Sq = q->shape[1], H = q->shape[2], D = q->shape[3];
    const int64_t any_d[4] = {-1, -1, -1, D};
    if (check_tensor(kc, q, "k_cache", code, 16, 4, any_d))
        return -1;
    const int64_t Hk = kc->shape[2], cshape[4] = {kc->shape[0], kc->shape[1], Hk, D};
    const int64_t qshape[4] = {B, Sq, H, D}, kshape[4] = {B, -1, Hk, D};
    if (check_tensor(vc, q, "v_cache", code, 16, 4, cshape) ||
        (q_rot && (check_tensor(q_rot, q, "q_rot", code, 16, 4, qshape) ||
                   check_contiguous(q_rot, "q_rot"))))
        return -1;
    if (k) {
        const int64_t vshape[4] = {B, k->shape[1], Hk, D};
        if (check_tensor(k, q, "k", code, 16, 4, kshape) || check_tensor(v, q, "v", code, 16, 4, vshape))
            return -1;
    }
    if (!seqlens) {
        PyErr_SetString(PyExc_ValueError, "cache_seqlens: required");
        return -1;
    }
    if (check_index(seqlens, q, "cache_seqlens", 1) || check_index(seqlens_out, q, "seqlens_out", 1) ||
        check_index(batch_idx, q, "cache_batch_idx", 1) ||
        check_index(leftpad, q, "cache_leftpad", 1) || check_index(table, q, "block_table", 2))
        return -1;
    if (cos) {
        const int64_t two[2] = {-1, -1};
        const int f32 = is_dtype(cos->dtype, kDLFloat, 32);
        const int rcode = f32 ? kDLFloat : code, rbits = f32 ? 32 : 16;
        const int64_t sshape[2] = {cos->ndim == 2 ? cos->shape[0] : -1,
                                   cos->ndim == 2 ? cos->shape[1] : -1};
        if (check_tensor(cos, q, "rotary_cos", rcode, rbits, 2, two) ||
            check_contiguous(cos, "rotary_cos") ||
            check_tensor(sin, q, "rotary_sin", rcode, rbits, 2, sshape) ||
            check_contiguous(sin, "rotary_sin"))
            return -1;
        if (!q_rot && Sq > 0) {
            PyErr_SetString(PyExc_ValueError, "q_rot: required with rotary_cos");
            return -1;
        }
    }
    if (fits_int(B, "q: batch") || fits_int(Sq, "q: seqlen") || fits_int(H, "q: heads") ||
        fits_int(kc->shape[0], "k_cache: dim 0") || fits_int(kc->shape[1], "k_cache: dim 1") ||
        fits_int(Hk, "k_cache: heads") || (k && fits_int(k->shape[1], "k: seqlen")) ||
        (cos && fits_int(cos->shape[0], "rotary_cos: seqlen")) ||
        (table && fits_int(table->shape[1], "block_table: dim 1")))
        return -1;

    p->q = tensor_data(q), p->q_rot = q_rot ? tensor_data(q_rot) : NULL;
    p->k = k ? tensor_data(k) : NULL, p->v = v ? tensor_data(v) : NULL;
    p->k_cache = tensor_data(kc), p->v_cache = tensor_data(vc);
    p->cache_seqlens = (const int32_t *)tensor_data(seqlens);
    p->seqlens_out = seqlens_out ? (int32_t *)tensor_data(seqlens_out) : NULL;
    p->cache_batch_idx = batch_idx ? (const int32_t *)tensor_data(batch_idx) : NULL;
    p->cache_leftpad = leftpad ? (const int32_t *)tensor_data(leftpad) : NULL;
    p->block_table = table ? (const int32_t *)tensor_data(table) : NULL;
    p->block_table_stride = table ? (int)tensor_stride(table, 0) : 0;
    p->max_blocks = table ? (int)table->shape[1] : 0;
    p->q_batch_stride = tensor_stride(q, 0), p->q_row_stride = tensor_stride(q, 1);
    p->q_head_stride = tensor_stride(q, 2);
    if (k) {
        p->k_batch_stride = tensor_stride(k, 0), p->k_row_stride = tensor_stride(k, 1);
        p->k_head_stride = tensor_stride(k, 2);
        p->v_batch_stride = tensor_stride(v, 0), p->v_row_stride = tensor_stride(v, 1);
        p->v_head_stride = tensor_stride(v, 2);
    }
    p->kc_batch_stride = tensor_stride(kc, 0), p->kc_row_stride = tensor_stride(kc, 1);
    p->kc_head_stride = tensor_stride(kc, 2);
    p->vc_batch_stride = tensor_stride(vc, 0), p->vc_row_stride = tensor_stride(vc, 1);
    p->vc_head_stride = tensor_stride(vc, 2);
    p->batch = (int)B, p->seqlen_q = (int)Sq, p->seqlen_new = k ? (int)k->shape[1] : 0;
    p->num_heads = (int)H, p->num_heads_k = (int)Hk, p->head_dim = (int)D;
    p->kv_batch = (int)kc->shape[0], p->capacity = (int)kc->shape[1];
    if (cos) {
        p->rotary_cos = tensor_data(cos), p->rotary_sin = tensor_data(sin);
        p->rotary_fp32 = is_dtype(cos->dtype, kDLFloat, 32);
        p->seqlen_ro = (int)cos->shape[0];
        p->rotary_dim = 2 * (int)cos->shape[1];
    }
    p->dtype = code == kDLBfloat ? FAD_BFLOAT16 : FAD_FLOAT16;
    return 0;
}

static PyObject *fad_py_append_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    /* in append_kvcache's argument order; NULL for None */
    static const char *names[13] = {"q", "q_rot", "k", "v", "k_cache", "v_cache", "cache_seqlens",
                                    "seqlens_out", "cache_batch_idx", "cache_leftpad",
                                    "block_table", "rotary_cos", "rotary_sin"};
    DLTensor *t[13] = {NULL};
    int interleaved, per_row;
    long long stream;
    char msg[512] = "";
    fad_append_params p;
    if (nargs != 16) {
        PyErr_Format(PyExc_TypeError, "append_kvcache: expected 16 arguments, got %zd", nargs);
        return NULL;
    }
    for (int i = 0; i < 13; i++)
        if (args[i] != Py_None && get_tensor(ta, args[i], names[i], &t[i]))
            return NULL;
    if (!t[2] != !t[3]) {
        PyErr_SetString(PyExc_ValueError, "k, v: give both or neither");
        return NULL;
    }
    if (!t[11] != !t[12]) {
        PyErr_SetString(PyExc_ValueError, "rotary_cos, rotary_sin: give both or neither");
        return NULL;
    }
    if (as_int(args[13], "rotary_interleaved", &interleaved) ||
        as_int(args[14], "rotate_q_per_row", &per_row))
        return NULL;
    stream = PyLong_AsLongLong(args[15]);
    if (stream == -1 && PyErr_Occurred())
        return NULL;
    memset(&p, 0, sizeof p);
    if (check_append(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11],
                     t[12], &p))
        return NULL;
    p.rotary_interleaved = interleaved, p.rotate_q_per_row = per_row;

    const DLTensor *q = t[0];
    int prev = 0;
    fad_status st = enter_device(q->device.device_id, &prev, msg, sizeof msg);
    if (st == FAD_OK) {
        st = fad_append_cuda(&p, (struct CUstream_st *)(uintptr_t)stream, msg, sizeof msg);
        leave_device(q->device.device_id, prev);
    }
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------------ */
/* infer, infer_kvcache: an inference call's whole per-call path in C         */
/* ------------------------------------------------------------------------ */
/*
 * flash_attn_func and flash_attn_with_kvcache without autograd, softmax_lse or
 * the rarer options spent most of their host time in Python: ~6 of ~8 us. These
 * entries take the call's own arguments and do the rest here. The operands are
 * unpacked through the exchange API, the output and any workspace come from
 * torch's allocator (the API's managed_tensor_allocator: torch's caching
 * allocator, on the current stream), the stream is torch's current one, and the
 * mode is the module's (set_mode). A call they do not take as it is -- a tensor
 * subclass, an operand the general path would copy first, autograd, anything
 * that fails a check -- returns NotImplemented with nothing written and nothing
 * kept, and Python takes the general path, which copies or raises as always.
 * Errors of the run itself (CUDA, allocation) are raised here.
 */

/* Verdicts of the steps below: take the call, leave it to Python, or an error. */
enum { LEAVE = 0, TAKE = 1, FAIL = -1 };

/* obj is taken as it is when it is exactly the tensor type (a subclass may
 * override torch functions); when `plain`, also contiguous with 16-byte aligned
 * data (what the general path would otherwise copy into that form). */
static int take_tensor(tensor_args *ta, PyObject *obj, int plain, DLTensor **t)
{
    if (Py_TYPE(obj) != ta->st->tensor_type)
        return LEAVE;
    if (get_tensor(ta, obj, "tensor", t))
        return FAIL;
    if (plain && (!is_compact(*t) || (uintptr_t)tensor_data(*t) % 16))
        return LEAVE;
    return TAKE;
}

/* LEAVE when autograd would record a call on these tensors: grad mode is on
 * and one of them requires grad. */
static int take_no_grad(const fad_module_state *st, PyObject *const *objs, int n)
{
    int any = 0;
    for (int i = 0; i < n; i++) {
        PyObject *r = PyObject_GetAttr(objs[i], st->requires_grad);
        if (!r)
            return FAIL;
        any |= r == Py_True;
        Py_DECREF(r);
    }
    if (!any)
        return TAKE;
    PyObject *on = PyObject_CallNoArgs(st->is_grad_enabled);
    if (!on)
        return FAIL;
    const int grad = PyObject_IsTrue(on);
    Py_DECREF(on);
    return grad < 0 ? FAIL : grad ? LEAVE : TAKE;
}

/* softmax_scale (None: head_dim ** -0.5, computed as Python does, so the bits
 * match the general path; else a finite float > 0) and causal into p; the
 * window is the default one, the mode the module's. */
static int take_options(const fad_module_state *st, PyObject *scale, PyObject *causal,
                        int head_dim, fad_fwd_params *p)
{
    if (scale == Py_None) {
        p->softmax_scale = (float)pow((double)head_dim, -0.5);
    } else {
        const double s = PyFloat_AsDouble(scale);
        if (s == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return LEAVE;
        }
        if (!(s > 0) || !isfinite(s))
            return LEAVE;
        p->softmax_scale = (float)s;
    }
    const int c = PyObject_IsTrue(causal);
    if (c < 0)
        return FAIL;
    p->causal = c;
    p->window_left = -1;
    p->window_right = c ? 0 : -1;
    p->deterministic = st->deterministic;
    p->split_size = st->split_size;
    p->schedule = st->schedule;
    return TAKE;
}

/* The allocator's error callback: the message as a Python exception. */
static void set_alloc_error(void *ctx, const char *kind, const char *message)
{
    (void)ctx;
    PyErr_Format(strcmp(kind, "MemoryError") ? PyExc_RuntimeError : PyExc_MemoryError,
                 "%s: %s", kind, message);
}

/* A new tensor of torch's from its allocator: like->shape (ndim dims, NULL:
 * the 1-D shape {n}), dtype, on like's device, row-major. NULL on error. */
static DLManagedTensorVersioned *new_tensor(const fad_module_state *st, const DLTensor *like,
                                            int ndim, const int64_t *shape, DLDataType dtype)
{
    DLManagedTensorVersioned *m = NULL;
    DLTensor proto = {NULL, like->device, ndim, dtype, (int64_t *)shape, NULL, 0};
    if (st->api->managed_tensor_allocator(&proto, &m, NULL, set_alloc_error) != 0 || !m) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "out: torch's allocator failed");
        return NULL;
    }
    return m;
}

static void free_tensor(DLManagedTensorVersioned *m)
{
    if (m && m->deleter)
        m->deleter(m);
}

/* Runs the checked forward p into out and lse (NULL-able; owned: on success
 * they become the returned torch tensor, or the pair (out, lse), on failure
 * they are freed), after append (CUDA only,
 * NULL for none: flash_attn_with_kvcache's rotary and append) on the same
 * stream. The forward's own checks and workspace come first, so a call that
 * fails them writes nothing. The workspace, when the plan needs one, is a uint8
 * tensor of torch's for this call, freed after the launch: safe, since the
 * caching allocator hands a block out again only in the order of the stream it
 * was allocated for, the current one the kernels run on. */
static PyObject *run_infer(const fad_module_state *st, fad_fwd_params *p, const DLTensor *q,
                           const fad_append_params *append, DLManagedTensorVersioned *out,
                           DLManagedTensorVersioned *lse)
{
    char msg[512] = "";
    void *obj = NULL, *lse_obj = NULL, *stream = NULL;
    fad_status run = FAD_OK;
    p->dtype = q->dtype.code == kDLBfloat ? FAD_BFLOAT16 : FAD_FLOAT16;
    if (q->device.device_type == kDLCPU) {
        Py_BEGIN_ALLOW_THREADS
        run = fad_fwd_cpu(p, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    } else {
        const int dev = q->device.device_id;
        int prev = 0;
        size_t need = 0;
        DLManagedTensorVersioned *ws = NULL;
        if (st->api->current_work_stream(kDLCUDA, dev, &stream) != 0)
            goto fail;
        run = enter_device(dev, &prev, msg, sizeof msg);
        if (run != FAD_OK)
            goto raise;
        run = fad_fwd_workspace_size(p, &need, msg, sizeof msg);
        if (run == FAD_OK && need) {
            const int64_t n = (int64_t)need;
            ws = new_tensor(st, q, 1, &n, (DLDataType){kDLUInt, 8, 1});
        }
        if (run == FAD_OK && (ws || !need) && append)
            run = fad_append_cuda(append, (struct CUstream_st *)stream, msg, sizeof msg);
        if (run == FAD_OK && (ws || !need))
            run = fad_fwd_cuda(p, ws ? tensor_data(&ws->dl_tensor) : NULL, need,
                               (struct CUstream_st *)stream, msg, sizeof msg);
        free_tensor(ws);
        leave_device(dev, prev);
        if (run == FAD_OK && need && !ws)
            goto fail; /* the allocator's error is set */
    }
raise:
    if (run != FAD_OK) {
        raise_status(run, msg);
        goto fail;
    }
    /* the API takes each tensor, even on failure */
    if (st->api->managed_tensor_to_py_object_no_sync(out, &obj) != 0) {
        free_tensor(lse);
        return NULL;
    }
    if (!lse)
        return (PyObject *)obj;
    if (st->api->managed_tensor_to_py_object_no_sync(lse, &lse_obj) != 0) {
        Py_DECREF((PyObject *)obj);
        return NULL;
    }
    PyObject *pair = PyTuple_Pack(2, (PyObject *)obj, (PyObject *)lse_obj);
    Py_DECREF((PyObject *)obj);
    Py_DECREF((PyObject *)lse_obj);
    return pair;
fail:
    free_tensor(out);
    free_tensor(lse);
    return NULL;
}

/* The common end of the inference entries, given the verdict so far (TAKE:
 * tensors and options are checked and in p): a new output shaped like q (and
 * softmax_lse (B, H, Sq) float32 when want_lse) and the run; or NotImplemented
 * (LEAVE), or NULL (FAIL). */
static PyObject *finish_infer(const fad_module_state *st, int take, fad_fwd_params *p,
                              const DLTensor *q, const fad_append_params *append, PyObject *want_lse)
{
    DLManagedTensorVersioned *out, *lse = NULL;
    const int with_lse = take == TAKE ? PyObject_IsTrue(want_lse) : 0;
    if (take == FAIL || with_lse < 0)
        return NULL;
    if (take == LEAVE) {
        PyErr_Clear(); /* a failed check's message: the general path raises it in its words */
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (!(out = new_tensor(st, q, q->ndim, q->shape, q->dtype)))
        return NULL;
    if (with_lse) {
        const int64_t shape[3] = {q->shape[0], q->shape[2], q->shape[1]};
        if (!(lse = new_tensor(st, q, 3, shape, (DLDataType){kDLFloat, 32, 1}))) {
            free_tensor(out);
            return NULL;
        }
        p->softmax_lse = (float *)tensor_data(&lse->dl_tensor);
    }
    set_out(p, &out->dl_tensor);
    return run_infer(st, p, q, append, out, lse);
}

PyDoc_STRVAR(infer_doc,
"infer(q, k, v, softmax_scale, causal, want_lse) -> out, (out, softmax_lse) or NotImplemented\n"
"--\n\n"
"flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal) for a call\n"
"with no autograd, in the mode set_mode last set: out (and softmax_lse (B, Hq, Sq)\n"
"float32 when want_lse) allocated by torch, launched on torch's current stream.\n"
"NotImplemented (nothing written) when the call is not one it takes as it is: the\n"
"caller then takes the general path (fwd).");

static PyObject *fad_py_infer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *q = NULL, *k, *v;
    fad_fwd_params p;
    int take;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "infer: expected 6 arguments, got %zd", nargs);
        return NULL;
    }
    if (!ta->st->can_allocate)
        Py_RETURN_NOTIMPLEMENTED;
    fad_fwd_params_init(&p);
    if ((take = take_tensor(ta, args[0], 1, &q)) == TAKE &&
        (take = take_tensor(ta, args[1], 1, &k)) == TAKE &&
        (take = take_tensor(ta, args[2], 1, &v)) == TAKE &&
        (take = take_no_grad(ta->st, args, 3)) == TAKE &&
        (take = check_fwd(q, k, v, NULL, NULL, &p) ? LEAVE : TAKE) == TAKE)
        take = take_options(ta->st, args[3], args[4], p.head_dim, &p);
    return finish_infer(ta->st, take, &p, q, NULL, args[5]);
}

/* infer_kvcache's arguments, in order. */
enum { KV_Q, KV_KC, KV_VC, KV_K, KV_V, KV_COS, KV_SIN, KV_SEQLENS, KV_BATCH_IDX, KV_LEFTPAD,
       KV_TABLE, KV_NTENSORS, KV_SCALE = KV_NTENSORS, KV_CAUSAL, KV_INTERLEAVED, KV_WANT_LSE,
       KV_NARGS };

/* The rotary and append step of an infer_kvcache call (some of k, v, cos, sin
 * given): its params, and the tensors it writes that the attention then reads
 * (q_rot, seqlens_out; tmp[0..1], owned by the caller). LEAVE for what only the
 * general path does: CPU tensors (torch ops there), cos/sin to be converted,
 * and every misuse (it raises in its words). */
static int take_append(const fad_module_state *st, DLTensor *const t[KV_NTENSORS],
                       PyObject *interleaved, fad_append_params *ap,
                       DLManagedTensorVersioned *tmp[2])
{
    const DLTensor *q = t[KV_Q], *k = t[KV_K], *cos = t[KV_COS];
    if (q->device.device_type != kDLCUDA || q->ndim != 4 || !t[KV_K] != !t[KV_V] ||
        !t[KV_COS] != !t[KV_SIN] || (k && k->ndim != 4))
        return LEAVE;
    if (cos && (cos->ndim != 2 || cos->shape[1] <= 0 || 2 * cos->shape[1] > q->shape[3] ||
                !(is_dtype(cos->dtype, kDLFloat, 32) || is_dtype(cos->dtype, q->dtype.code, 16))))
        return LEAVE;
    if (cos && !(tmp[0] = new_tensor(st, q, 4, q->shape, q->dtype)))
        return FAIL;
    if (k && k->shape[1] > 0 &&
        !(tmp[1] = new_tensor(st, q, 1, q->shape, (DLDataType){kDLInt, 32, 1}))) /* (B,) */
        return FAIL;
    memset(ap, 0, sizeof *ap);
    if (check_append(q, tmp[0] ? &tmp[0]->dl_tensor : NULL, k, t[KV_V], t[KV_KC], t[KV_VC],
                     t[KV_SEQLENS], tmp[1] ? &tmp[1]->dl_tensor : NULL, t[KV_BATCH_IDX],
                     t[KV_LEFTPAD], t[KV_TABLE], cos, t[KV_SIN], ap))
        return LEAVE;
    const int il = PyObject_IsTrue(interleaved);
    if (il < 0)
        return FAIL;
    ap->rotary_interleaved = il;
    return TAKE;
}

PyDoc_STRVAR(infer_kvcache_doc,
"infer_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,\n"
"              cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,\n"
"              rotary_interleaved, want_lse) -> out, (out, softmax_lse) or NotImplemented\n"
"--\n\n"
"flash_attn_with_kvcache with no score options beyond softmax_scale and causal, as\n"
"infer does for flash_attn_func (that entry has no autograd anyway).\n"
"k, v, rotary_cos, rotary_sin (CUDA only: rotary and append first, one kernel),\n"
"cache_batch_idx, cache_leftpad and block_table may be None.");

static PyObject *fad_py_infer_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    /* plain: the operands the general path copies into a contiguous, aligned form */
    static const int plain[KV_NTENSORS] = {[KV_Q] = 1, [KV_K] = 1, [KV_V] = 1, [KV_COS] = 1,
                                           [KV_SIN] = 1};
    DLTensor *t[KV_NTENSORS] = {NULL};
    DLManagedTensorVersioned *tmp[2] = {NULL, NULL}; /* q_rot, seqlens_out */
    fad_fwd_params p;
    fad_append_params ap;
    int take = TAKE, appends;
    if (nargs != KV_NARGS) {
        PyErr_Format(PyExc_TypeError, "infer_kvcache: expected %d arguments, got %zd", KV_NARGS,
                     nargs);
        return NULL;
    }
    if (!ta->st->can_allocate)
        Py_RETURN_NOTIMPLEMENTED;
    fad_fwd_params_init(&p);
    for (int i = 0; i < KV_NTENSORS && take == TAKE; i++)
        if (args[i] != Py_None || i < KV_K || i == KV_SEQLENS) /* None for a required one: LEAVE */
            take = take_tensor(ta, args[i], plain[i], &t[i]);
    if (take != TAKE)
        return finish_infer(ta->st, take, &p, NULL, NULL, NULL);
    /* Left to the general path: its own checks of a block table (with the other
     * two; on the CPU, every page it names). */
    if (t[KV_TABLE] && (t[KV_BATCH_IDX] || t[KV_LEFTPAD] || t[KV_Q]->device.device_type == kDLCPU))
        take = LEAVE;
    appends = t[KV_K] || t[KV_V] || t[KV_COS] || t[KV_SIN];
    if (take == TAKE && appends)
        take = take_append(ta->st, t, args[KV_INTERLEAVED], &ap, tmp);
    if (take == TAKE) /* the attention reads the rotated q and the lengths after the append */
        take = check_fwd_kvcache(tmp[0] ? &tmp[0]->dl_tensor : t[KV_Q], t[KV_KC], t[KV_VC], NULL,
                                 NULL, tmp[1] ? &tmp[1]->dl_tensor : t[KV_SEQLENS],
                                 t[KV_BATCH_IDX], t[KV_LEFTPAD], t[KV_TABLE], &p) ? LEAVE : TAKE;
    if (take == TAKE)
        take = take_options(ta->st, args[KV_SCALE], args[KV_CAUSAL], p.head_dim, &p);
    if (take == TAKE && appends) /* q rotates per row where the mask is local: causal here */
        ap.rotate_q_per_row = p.causal;
    PyObject *res = finish_infer(ta->st, take, &p, tmp[0] ? &tmp[0]->dl_tensor : t[KV_Q],
                                 appends ? &ap : NULL, args[KV_WANT_LSE]);
    free_tensor(tmp[0]); /* after the launches, in stream order (run_infer's rule) */
    free_tensor(tmp[1]);
    return res;
}

/* ------------------------------------------------------------------------ */
/* module                                                                     */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(has_cuda_doc, "has_cuda() -> bool\n--\n\nTrue when this build has the CUDA path.");

static PyObject *fad_py_has_cuda(PyObject *module, PyObject *unused)
{
    (void)module, (void)unused;
    return PyBool_FromLong(fad_has_cuda());
}

/* ------------------------------------------------------------------------ */
/* torch's DLPack exchange API                                                */
/* ------------------------------------------------------------------------ */

PyDoc_STRVAR(set_dlpack_exchange_api_doc,
"set_dlpack_exchange_api(capsule, tensor_type, is_grad_enabled) -> bool\n"
"--\n\n"
"From now on, objects of tensor_type (and subclasses) may be passed wherever a\n"
"DLPack capsule is taken: they are unpacked through the C exchange API in capsule\n"
"(\"dlpack_exchange_api\", e.g. torch.Tensor.__dlpack_c_exchange_api__), with no\n"
"capsule made and nothing allocated per call. is_grad_enabled (torch's) lets\n"
"infer and infer_kvcache tell inference calls. Returns True when those two can\n"
"run (the API has an allocator, to_py_object and current_work_stream).");

static PyObject *fad_py_set_dlpack_exchange_api(PyObject *module, PyObject *const *args,
                                                Py_ssize_t nargs)
{
    fad_module_state *st = module_state(module);
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "set_dlpack_exchange_api: expected 3 arguments, got %zd",
                     nargs);
        return NULL;
    }
    const DLPackExchangeAPI *api =
        (const DLPackExchangeAPI *)PyCapsule_GetPointer(args[0], "dlpack_exchange_api");
    if (!api)
        return NULL;
    if (!PyType_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "tensor_type: expected a type");
        return NULL;
    }
    if (!PyCallable_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "is_grad_enabled: expected a callable");
        return NULL;
    }
    if (api->header.version.major != 1 || api->header.version.minor < 2 ||
        !api->dltensor_from_py_object_no_sync) {
        PyErr_Format(PyExc_ValueError, "capsule: DLPack exchange API %u.%u without "
                     "dltensor_from_py_object_no_sync (need 1.2 or later)",
                     api->header.version.major, api->header.version.minor);
        return NULL;
    }
    Py_INCREF(args[0]);
    Py_INCREF(args[1]);
    Py_INCREF(args[2]);
    Py_XSETREF(st->api_owner, args[0]);
    Py_XSETREF(st->tensor_type, (PyTypeObject *)args[1]);
    Py_XSETREF(st->is_grad_enabled, args[2]);
    st->api = api;
    st->can_allocate = api->managed_tensor_allocator && api->managed_tensor_to_py_object_no_sync &&
                       api->current_work_stream;
    return PyBool_FromLong(st->can_allocate);
}

PyDoc_STRVAR(set_mode_doc,
"set_mode(deterministic, split_size, schedule)\n"
"--\n\n"
"The mode infer and infer_kvcache run in (flash_attn_det.mode keeps it in step\n"
"with set_deterministic_mode and testing.force_schedule).");

static PyObject *fad_py_set_mode(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    fad_module_state *st = module_state(module);
    int deterministic, split_size, schedule;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "set_mode: expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (as_int(args[0], "deterministic", &deterministic) ||
        as_int(args[1], "split_size", &split_size) || as_int(args[2], "schedule", &schedule))
        return NULL;
    if (split_size <= 0 || split_size % FAD_SPLIT_QUANTUM) {
        PyErr_Format(PyExc_ValueError, "split_size: must be a positive multiple of %d, got %d",
                     FAD_SPLIT_QUANTUM, split_size);
        return NULL;
    }
    if (schedule < FAD_SCHEDULE_AUTO || schedule > FAD_SCHEDULE_CTA_PER_SPLIT) {
        PyErr_Format(PyExc_ValueError, "schedule: unknown value %d", schedule);
        return NULL;
    }
    st->deterministic = deterministic != 0;
    st->split_size = split_size;
    st->schedule = (fad_schedule)schedule;
    Py_RETURN_NONE;
}

static PyMethodDef fad_methods[] = {
    {"fwd", (PyCFunction)(void (*)(void))fad_py_fwd, METH_FASTCALL, fwd_doc},
    {"fwd_varlen", (PyCFunction)(void (*)(void))fad_py_fwd_varlen, METH_FASTCALL, fwd_varlen_doc},
    {"fwd_kvcache", (PyCFunction)(void (*)(void))fad_py_fwd_kvcache, METH_FASTCALL, fwd_kvcache_doc},
    {"bwd", (PyCFunction)(void (*)(void))fad_py_bwd, METH_FASTCALL, bwd_doc},
    {"append_kvcache", (PyCFunction)(void (*)(void))fad_py_append_kvcache, METH_FASTCALL,
     append_kvcache_doc},
    {"bwd_varlen", (PyCFunction)(void (*)(void))fad_py_bwd_varlen, METH_FASTCALL, bwd_varlen_doc},
    {"fwd_workspace_size", (PyCFunction)(void (*)(void))fad_py_fwd_workspace_size, METH_FASTCALL,
     fwd_workspace_size_doc},
    {"has_cuda", fad_py_has_cuda, METH_NOARGS, has_cuda_doc},
    {"set_dlpack_exchange_api", (PyCFunction)(void (*)(void))fad_py_set_dlpack_exchange_api,
     METH_FASTCALL, set_dlpack_exchange_api_doc},
    {"infer", (PyCFunction)(void (*)(void))fad_py_infer, METH_FASTCALL, infer_doc},
    {"infer_kvcache", (PyCFunction)(void (*)(void))fad_py_infer_kvcache, METH_FASTCALL,
     infer_kvcache_doc},
    {"set_mode", (PyCFunction)(void (*)(void))fad_py_set_mode, METH_FASTCALL, set_mode_doc},
    {NULL, NULL, 0, NULL}};

static int fad_exec(PyObject *m)
{
    fad_module_state *st = module_state(m);
    st->deterministic = 1; /* set_deterministic_mode's defaults */
    st->split_size = 512;
    st->schedule = FAD_SCHEDULE_AUTO;
    st->requires_grad = PyUnicode_InternFromString("requires_grad");
    if (!st->requires_grad)
        return -1;
    if (PyModule_AddStringConstant(m, "__version__", FAD_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "SPLIT_QUANTUM", FAD_SPLIT_QUANTUM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_HEAD_DIM", FAD_MAX_HEAD_DIM) < 0 ||
        PyModule_AddIntConstant(m, "SCHEDULE_AUTO", FAD_SCHEDULE_AUTO) < 0 ||
        PyModule_AddIntConstant(m, "SCHEDULE_ONE_CTA", FAD_SCHEDULE_ONE_CTA) < 0 ||
        PyModule_AddIntConstant(m, "SCHEDULE_CTA_PER_SPLIT", FAD_SCHEDULE_CTA_PER_SPLIT) < 0)
        return -1;
    return 0;
}

static int fad_traverse(PyObject *m, visitproc visit, void *arg)
{
    fad_module_state *st = module_state(m);
    Py_VISIT(st->api_owner);
    Py_VISIT(st->tensor_type);
    Py_VISIT(st->is_grad_enabled);
    return 0;
}

static int fad_clear(PyObject *m)
{
    fad_module_state *st = module_state(m);
    st->api = NULL;
    Py_CLEAR(st->api_owner);
    Py_CLEAR(st->tensor_type);
    Py_CLEAR(st->is_grad_enabled);
    Py_CLEAR(st->requires_grad);
    st->can_allocate = 0;
    return 0;
}

static void fad_free(void *m) { fad_clear((PyObject *)m); }

static PyModuleDef_Slot fad_slots[] = {{Py_mod_exec, fad_exec}, {0, NULL}};

PyDoc_STRVAR(module_doc, "flash_attn_det._C: deterministic attention kernels (C/CUDA core).");

static struct PyModuleDef fad_module = {
    PyModuleDef_HEAD_INIT, "flash_attn_det._C", module_doc, sizeof(fad_module_state), fad_methods,
    fad_slots, fad_traverse, fad_clear, fad_free};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&fad_module); }
