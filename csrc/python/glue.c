/*
 * glue.c — the argument layer of flash_attn_det._C: Python objects to DLTensors
 * (DLPack's C exchange API or capsules), the checks every entry runs on them (in
 * a fixed order, each message naming the argument), and their translation into
 * the fad.h parameter structs. No entry points here: module.c and infer.c.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "glue.h"

/* ------------------------------------------------------------------------ */
/* errors                                                                     */
/* ------------------------------------------------------------------------ */

PyObject *raise_status(fad_status st, const char *msg)
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

fad_module_state *module_state(PyObject *module)
{
    return (fad_module_state *)PyModule_GetState(module);
}

/* torch.get_num_threads, once Python hands it over (set_cpu_threads_source):
 * asked on every CPU call, so that torch.set_num_threads takes effect at once. */
static PyObject *cpu_threads_source;

void set_cpu_threads_source(PyObject *fn)
{
    PyObject *old = cpu_threads_source;
    Py_XINCREF(fn);
    cpu_threads_source = fn;
    Py_XDECREF(old);
}

int cpu_threads(void)
{
    if (!cpu_threads_source)
        return 1;
    PyObject *r = PyObject_CallObject(cpu_threads_source, NULL);
    const long n = r ? PyLong_AsLong(r) : -1;
    Py_XDECREF(r);
    if (n < 1) { /* (a source that fails leaves one thread: no call ever fails for it) */
        PyErr_Clear();
        return 1;
    }
    return n > 4096 ? 4096 : (int)n;
}

void tensor_args_init(tensor_args *ta, PyObject *module)
{
    ta->st = module_state(module);
    ta->used = 0;
}

/* The exchange API refused a tensor (torch raises for a meta tensor, say):
 * the same failure as a ValueError that names the argument, with the first
 * line of torch's message (the rest is a C++ backtrace). */
static int dlpack_refused(const char *name)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *text = value ? PyObject_Str(value) : NULL;
    Py_ssize_t len = 0;
    const char *s = text ? PyUnicode_AsUTF8AndSize(text, &len) : NULL;
    if (!s) {
        PyErr_Clear();
        s = "unknown error", len = 13;
    }
    const char *nl = memchr(s, '\n', (size_t)len);
    PyObject *line = PyUnicode_FromStringAndSize(s, nl ? nl - s : len);
    if (line) {
        PyErr_Format(PyExc_ValueError, "%s: cannot be passed to the kernels through DLPack: %U",
                     name, line);
        Py_DECREF(line);
    }
    Py_XDECREF(text);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
}

/* obj -> DLTensor: a torch tensor through the exchange API (no capsule, no
 * allocation), or the DLTensor borrowed from a capsule. Either way the caller's
 * tensor stays alive for the whole call, so nothing is consumed. */
int get_tensor(tensor_args *ta, PyObject *obj, const char *name, DLTensor **out)
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
            return dlpack_refused(name);
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
    /* the type's name through the stable ABI (no tp_name), on this error path only */
    PyObject *type_name = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__name__");
    if (type_name) {
        PyErr_Format(PyExc_TypeError, "%s: expected a torch.Tensor or a DLPack capsule, got %S",
                     name, type_name);
        Py_DECREF(type_name);
    }
    return -1;
}

void *tensor_data(const DLTensor *t) { return (char *)t->data + t->byte_offset; }

/* Stride of dim d in elements (DLPack allows NULL strides for compact tensors). */
int64_t tensor_stride(const DLTensor *t, int d)
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

int is_dtype(DLDataType dt, int code, int bits)
{
    return dt.code == code && dt.bits == bits && dt.lanes == 1;
}

int same_device(const DLTensor *a, const DLTensor *b)
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
int check_tensor(const DLTensor *t, const DLTensor *q, const char *name, int code, int bits,
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
int is_compact(const DLTensor *t)
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

int check_contiguous(const DLTensor *t, const char *name)
{
    if (is_compact(t))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: must be contiguous", name);
    return -1;
}

/* A tensor the call writes must give every element its own memory, or the result depends on
 * which write lands last: an expand()ed cache (stride 0) puts every sequence's rows in one
 * place; an as_strided view whose row stride is shorter than a row makes rows share their
 * tails. The test: the dims of size > 1, sorted by |stride| (innermost first), must each step
 * at least past the span of the dims inside it (span = 1 + sum of (size - 1) * |stride| over
 * them). Every tensor it accepts is free of overlap; it refuses every overlapping one, and also
 * a few that interleave without overlap (shape (3, 2), strides (2, 3): offsets 0, 2, 4, 3, 5,
 * 7), which no layout torch, a KV cache or fad.h's params produce. Row-major, padded,
 * transposed, sliced and permuted views all pass. */
int check_no_overlap(const DLTensor *t, const char *name)
{
    enum { MAX_DIMS = 8 };
    int64_t stride[MAX_DIMS], size[MAX_DIMS];
    int dim[MAX_DIMS], n = 0;
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0)
            return 0; /* nothing is written */
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] <= 1)
            continue;
        const int64_t st = tensor_stride(t, d);
        if (st == 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: dim %d has stride 0 (an expand()ed tensor?): its rows share memory, "
                         "and it is written in place", name, d);
            return -1;
        }
        if (n == MAX_DIMS) {
            PyErr_Format(PyExc_ValueError, "%s: more than %d dims of size > 1", name, MAX_DIMS);
            return -1;
        }
        int i = n++; /* insertion sort by |stride| */
        for (; i > 0 && stride[i - 1] > (st < 0 ? -st : st); i--)
            stride[i] = stride[i - 1], size[i] = size[i - 1], dim[i] = dim[i - 1];
        stride[i] = st < 0 ? -st : st, size[i] = t->shape[d], dim[i] = d;
    }
    int64_t span = 1;
    for (int i = 0; i < n; i++) {
        if (stride[i] < span) {
            PyErr_Format(PyExc_ValueError,
                         "%s: its elements overlap in memory (dim %d's stride %lld is less than "
                         "%lld, the span of the dims inside it), and it is written in place",
                         name, dim[i], (long long)stride[i], (long long)span);
            return -1;
        }
        const int64_t reach = mul_sat(size[i] - 1, stride[i]); /* (saturating: no overflow) */
        span = reach > INT64_MAX - span ? INT64_MAX : span + reach;
    }
    return 0;
}

/* softmax_lse: float32, contiguous, shape lshape on q's device; or NULL (None:
 * a forward that does not need it skips the allocation and the stores). */
int check_lse(const DLTensor *lse, const DLTensor *q, int ndim, const int64_t *lshape)
{
    if (!lse)
        return 0;
    return check_tensor(lse, q, "softmax_lse", kDLFloat, 32, ndim, lshape) ||
           check_contiguous(lse, "softmax_lse");
}

int as_int(PyObject *o, const char *name, int *out)
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

int as_float(PyObject *o, const char *name, float *out)
{
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Format(PyExc_TypeError, "%s: expected a float", name);
        return -1;
    }
    *out = (float)v;
    return 0;
}

/* q first: it fixes device, dtype and rank for everything else. */
int check_q(const DLTensor *q, int ndim)
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

/* Lengths, heads, batch and the query rows of a call (batch x seqlen x heads: the grid's
 * CTAs and the rows of softmax_lse are counted in int) are at most 2^31 - 1. */
int fits_int(int64_t x, const char *name)
{
    if (x > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "%s: %lld is past the limit of 2^31 - 1", name,
                     (long long)x);
        return -1;
    }
    return 0;
}

/* A sequence's keys (FAD_MAX_SEQLEN_K, fad_internal.h, says why not 2^31 - 1). */
static int fits_keys(int64_t n, const char *name)
{
    if (n > FAD_MAX_SEQLEN_K) {
        PyErr_Format(PyExc_ValueError, "%s: %lld keys in a sequence, past the limit of 2^31 - 2^16 "
                     "(%d)", name, (long long)n, FAD_MAX_SEQLEN_K);
        return -1;
    }
    return 0;
}

/* a * b for sizes a, b >= 0, INT64_MAX where that would overflow */
int64_t mul_sat(int64_t a, int64_t b)
{
    return a && b > INT64_MAX / a ? INT64_MAX : a * b;
}

/* out (shaped like q, already checked): its pointer and strides into p, whose
 * layout is set (varlen, cu_seqlens_q set: (total_q, Hq, D); else (B, Sq, Hq, D)). */
void set_out(fad_fwd_params *p, const DLTensor *out)
{
    const int d = p->cu_seqlens_q ? 0 : 1; /* the row dim */
    p->out = tensor_data(out);
    p->out_batch_stride = d ? tensor_stride(out, 0) : 0;
    p->out_row_stride = tensor_stride(out, d), p->out_head_stride = tensor_stride(out, d + 1);
}

/* A CUDA call runs with its tensors' device current and restores the caller's:
 * enter_device makes dev current (*prev receives the old one), leave_device
 * switches back when they differ. */
fad_status enter_device(int dev, int *prev, char *msg, size_t msg_len)
{
    return fad_cuda_set_device(dev, prev, msg, msg_len);
}

void leave_device(int dev, int prev)
{
    if (prev != dev) {
        char ignored[64];
        fad_cuda_set_device(prev, &prev, ignored, sizeof ignored);
    }
}

/* ------------------------------------------------------------------------ */
/* the tensors of each entry -> fad_fwd_params / fad_append_params           */
/* ------------------------------------------------------------------------ */

/* Checks the tensors of a padded-layout forward (out and lse NULL-able: not
 * checked, not set) and fills p's pointers, strides and sizes. */
int check_fwd(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *out,
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
        (out && (check_tensor(out, q, "out", code, 16, 4, oshape) || check_no_overlap(out, "out"))) ||
        check_lse(lse, q, 3, lshape) ||
        fits_int(B, "q: batch") || fits_int(Sq, "q: seqlen") || fits_int(H, "q: heads") ||
        fits_int(mul_sat(mul_sat(B, Sq), H), "q: batch * seqlen * heads") ||
        fits_keys(Sk, "k: seqlen") || fits_int(Hk, "k: heads"))
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

/* Checks the tensors of a KV-cache forward (out, lse, batch_idx, leftpad, bt
 * NULL-able; out NULL: not checked, not set) and fills p. */
int check_fwd_kvcache(const DLTensor *q, const DLTensor *kc, const DLTensor *vc,
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
        (out && (check_tensor(out, q, "out", code, 16, 4, oshape) || check_no_overlap(out, "out"))) ||
        check_lse(lse, q, 3, lshape) ||
        check_tensor(seqlens, q, "cache_seqlens", kDLInt, 32, 1, bshape) ||
        (batch_idx && check_tensor(batch_idx, q, "cache_batch_idx", kDLInt, 32, 1, bshape)) ||
        (leftpad && check_tensor(leftpad, q, "cache_leftpad", kDLInt, 32, 1, bshape)) ||
        fits_int(B, "q: batch") || fits_int(Sq, "q: seqlen") || fits_int(H, "q: heads") ||
        fits_int(mul_sat(mul_sat(B, Sq), H), "q: batch * seqlen * heads") ||
        fits_int(Bc, "k_cache: batch") || fits_keys(cap, "k_cache: seqlen") ||
        fits_int(Hk, "k_cache: heads"))
        return -1;
    int64_t seqlen_k = cap; /* paged: max_blocks * page_size */
    if (bt) {
        const int64_t btshape[2] = {B, -1};
        if (check_tensor(bt, q, "block_table", kDLInt, 32, 2, btshape) ||
            fits_keys(mul_sat(bt->shape[1], cap), "block_table: max_blocks * page_size") ||
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

/* Checks the tensors of a variable-length forward (out, lse, used_k, table
 * NULL-able; out NULL: not checked, not set) and fills p. */
int check_fwd_varlen(const DLTensor *q, const DLTensor *k, const DLTensor *v, const DLTensor *out,
                     const DLTensor *lse, const DLTensor *cu_q, const DLTensor *cu_k,
                     const DLTensor *used_k, const DLTensor *table, int max_q, int max_k,
                     fad_fwd_params *p)
{
    if (check_q(q, 3))
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
        (out && (check_tensor(out, q, "out", code, 16, 3, oshape) || check_no_overlap(out, "out"))) ||
        check_lse(lse, q, 2, lshape) ||
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
        fits_int(Tq * H, "q: total rows * heads") ||
        fits_int(Hk, "k: heads"))
        return -1;
    if (max_q < 0 || max_k < 0) {
        PyErr_Format(PyExc_ValueError, "max_seqlen_q, max_seqlen_k: must be >= 0 (got %d, %d)",
                     max_q, max_k);
        return -1;
    }
    if (fits_keys(max_k, "max_seqlen_k"))
        return -1;

    p->q = tensor_data(q), p->k = tensor_data(k), p->v = tensor_data(v);
    p->softmax_lse = lse ? (float *)tensor_data(lse) : NULL;
    p->cu_seqlens_q = (const int32_t *)tensor_data(cu_q);
    p->cu_seqlens_k = (const int32_t *)tensor_data(cu_k);
    p->seqused_k = used_k ? (const int32_t *)tensor_data(used_k) : NULL;
    p->q_row_stride = tensor_stride(q, 0), p->q_head_stride = tensor_stride(q, 1);
    p->k_row_stride = tensor_stride(k, kd - 3), p->k_head_stride = tensor_stride(k, kd - 2);
    p->v_row_stride = tensor_stride(v, kd - 3), p->v_head_stride = tensor_stride(v, kd - 2);
    if (out)
        set_out(p, out);
    p->batch = (int)B, p->seqlen_q = max_q, p->seqlen_k = max_k;
    p->total_q = (int)Tq, p->total_k = (int)Tk;
    if (table) { /* the pages: sequence lengths from cu_seqlens_k, capacity from the table */
        if (fits_int(k->shape[1], "k: page_size") || fits_int(table->shape[1], "block_table: dim 1") ||
            fits_keys(mul_sat(table->shape[1], k->shape[1]), "block_table: capacity"))
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
    return 0;
}

/* An optional int32 vector (B,) or matrix (B, n) on q's device (NULL: None). */
static int check_index(const DLTensor *t, const DLTensor *q, const char *name, int ndim)
{
    const int64_t shape[2] = {q->shape[0], -1};
    return t ? check_tensor(t, q, name, kDLInt, 32, ndim, shape) : 0;
}

/* Checks append_kvcache's tensors (q_rot, k, v, seqlens_out, batch_idx,
 * table, cos, sin NULL-able; k and v together, cos and sin together)
 * and fills p; p->rotary_interleaved and rotate_q_per_row are the caller's. */
int check_append(const DLTensor *q, const DLTensor *q_rot, const DLTensor *k,
                        const DLTensor *v, const DLTensor *kc, const DLTensor *vc,
                        const DLTensor *seqlens, const DLTensor *seqlens_out,
                        const DLTensor *batch_idx, const DLTensor *table,
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
        if (check_tensor(k, q, "k", code, 16, 4, kshape) || check_tensor(v, q, "v", code, 16, 4, vshape) ||
            check_no_overlap(kc, "k_cache") || check_no_overlap(vc, "v_cache"))
            return -1;
    }
    if (!seqlens) {
        PyErr_SetString(PyExc_ValueError, "cache_seqlens: required");
        return -1;
    }
    if (check_index(seqlens, q, "cache_seqlens", 1) || check_index(seqlens_out, q, "seqlens_out", 1) ||
        check_index(batch_idx, q, "cache_batch_idx", 1) || check_index(table, q, "block_table", 2))
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
