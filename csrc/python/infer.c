/*
 * infer.c — flash_attn_det._C's inference entries, infer, infer_varlen and
 * infer_kvcache: an inference call's whole per-call path in C.
 *
 * flash_attn_func, flash_attn_varlen_func and flash_attn_with_kvcache without
 * autograd or the rarer options spent most of their host time in Python: ~6 of
 * ~8 us. These entries take the call's own arguments and do the rest here. The
 * operands are unpacked through the exchange API; the output, softmax_lse, any
 * workspace and the append step's tensors come from torch's allocator (the API's
 * managed_tensor_allocator: torch's caching allocator, on the current stream);
 * the stream is torch's current one, and the mode is the module's (set_mode). A
 * call they do not take as it is -- a tensor subclass, an operand the general
 * path would copy first, autograd, anything that fails a check -- returns
 * NotImplemented with nothing written and nothing kept, and Python takes the
 * general path, which copies or raises as always. Errors of the run itself
 * (CUDA, allocation) are raised here.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#include "glue.h"

/* Verdicts of the steps below: take the call, leave it to Python, or an error. */
enum { LEAVE = 0, TAKE = 1, FAIL = -1 };

/* obj is taken as it is when it is exactly the tensor type (a subclass may
 * override torch functions); when `plain`, also contiguous with 16-byte aligned
 * data (what the general path would otherwise copy into that form). */
static int take_tensor(tensor_args *ta, PyObject *obj, int plain, DLTensor **t)
{
    if (Py_TYPE(obj) != ta->st->tensor_type)
        return LEAVE;
    if (get_tensor(ta, obj, "tensor", t)) { /* (a meta tensor, say) the general path names it */
        PyErr_Clear();
        return LEAVE;
    }
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
 * match the general path; else > 0 and finite as a float) and causal into p; the
 * window is the default one, the mode the module's. */
static int take_options(const fad_module_state *st, PyObject *scale, PyObject *causal,
                        int head_dim, fad_fwd_params *p)
{
    if (scale == Py_None) {
        p->softmax_scale = fad_default_softmax_scale(head_dim);
    } else {
        const double s = PyFloat_AsDouble(scale);
        if (s == -1.0 && PyErr_Occurred()) {
            PyErr_Clear();
            return LEAVE;
        }
        /* checked as the float the C API reads, where 0 means "the default": a scale that
         * rounds to 0 or inf there goes to the general path, which raises */
        const float f = (float)s;
        if (!(f > 0) || !isfinite(f))
            return LEAVE;
        p->softmax_scale = f;
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

/* A new tensor of torch's from its allocator: shape (ndim dims), dtype, on
 * like's device, row-major. NULL with the exception set on error. */
static DLManagedTensorVersioned *new_tensor(const fad_module_state *st, const DLTensor *like,
                                            int ndim, const int64_t *shape, DLDataType dtype)
{
    DLManagedTensorVersioned *m = NULL;
    DLTensor proto = {NULL, like->device, ndim, dtype, (int64_t *)shape, NULL, 0};
    if (st->api->managed_tensor_allocator(&proto, &m, NULL, set_alloc_error) != 0 || !m) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_RuntimeError, "torch's allocator failed");
        return NULL;
    }
    return m;
}

/* A uint8 workspace of n bytes on like's device (NULL with the error set). */
static DLManagedTensorVersioned *new_workspace(const fad_module_state *st, const DLTensor *like,
                                               size_t n)
{
    const int64_t shape[1] = {(int64_t)n};
    return new_tensor(st, like, 1, shape, (DLDataType){kDLUInt, 8, 1});
}

/* Bytes of a new (row-major) tensor of 16- or 32-bit elements. */
static size_t tensor_bytes(const DLTensor *t)
{
    size_t n = t->dtype.bits / 8;
    for (int d = 0; d < t->ndim; d++)
        n *= (size_t)t->shape[d];
    return n;
}

static void free_tensor(DLManagedTensorVersioned *m)
{
    if (m && m->deleter)
        m->deleter(m);
}

/* Runs the checked forward p into out and lse (NULL-able; owned: on success
 * they become the returned torch tensor, or the pair (out, lse), on failure
 * they are freed), after append (CUDA only, NULL for none: flash_attn_with_
 * kvcache's rotary and append) on the same stream. Nothing of the caller's is
 * written by a call that fails a check: fad_fwd_cuda checks before it launches,
 * and an append runs only after the forward's checks (and take_append's of its
 * alignment rule). The workspace, when the plan needs one, is a uint8 tensor of
 * torch's for this call, freed after the launch: safe, since the caching
 * allocator hands a block out again only in the order of the stream it was
 * allocated for, the current one the kernels run on. */
static PyObject *run_infer(const fad_module_state *st, fad_fwd_params *p, const DLTensor *q,
                           const fad_append_params *append, DLManagedTensorVersioned *out,
                           DLManagedTensorVersioned *lse)
{
    char msg[512] = "";
    void *obj = NULL, *lse_obj = NULL, *stream = NULL;
    fad_status run = FAD_OK;
    p->dtype = q->dtype.code == kDLBfloat ? FAD_BFLOAT16 : FAD_FLOAT16;
    /* A varlen batch: rows no valid sequence covers are not written, so they are
     * filled first, as the general path fills them -- 0 on the CPU (which raises
     * on bad lengths instead), NaN on the GPU (which does not read them back). */
    const size_t out_bytes = p->cu_seqlens_q ? tensor_bytes(&out->dl_tensor) : 0;
    const size_t lse_bytes = p->cu_seqlens_q && lse ? tensor_bytes(&lse->dl_tensor) : 0;
    if (q->device.device_type == kDLCPU) {
        if (out_bytes) /* (an empty out may have a NULL data pointer: no memset(NULL, 0, 0)) */
            memset(tensor_data(&out->dl_tensor), 0, out_bytes);
        if (lse_bytes)
            memset(tensor_data(&lse->dl_tensor), 0, lse_bytes);
        p->num_threads = cpu_threads();
        Py_BEGIN_ALLOW_THREADS
        run = fad_fwd_cpu(p, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    } else {
        const int dev = q->device.device_id;
        int prev = 0, no_memory = 0;
        size_t need = 0;
        DLManagedTensorVersioned *ws = NULL;
        struct CUstream_st *s;
        if (st->api->current_work_stream(kDLCUDA, dev, &stream) != 0)
            goto fail;
        s = (struct CUstream_st *)stream;
        run = enter_device(dev, &prev, msg, sizeof msg);
        if (run != FAD_OK)
            goto raise;
        /* An append must wait for the attention's checks, so its workspace size
         * (which runs them) comes first. Otherwise the launch itself says whether
         * a workspace is needed, as in run_fwd: the common call that needs none
         * runs one check and one plan. */
        if (append)
            run = fad_fwd_workspace_size(p, &need, msg, sizeof msg);
        if (run == FAD_OK && need)
            no_memory = !(ws = new_workspace(st, q, need));
        if (run == FAD_OK && !no_memory && append)
            run = fad_append_cuda(append, s, msg, sizeof msg);
        if (run == FAD_OK && !no_memory && out_bytes) /* NaN: 0x7fc0 bf16, 0x7e00 fp16 */
            run = fad_cuda_fill32(tensor_data(&out->dl_tensor),
                                  p->dtype == FAD_BFLOAT16 ? 0x7fc07fc0u : 0x7e007e00u,
                                  out_bytes / 4, s, msg, sizeof msg);
        if (run == FAD_OK && !no_memory && lse_bytes)
            run = fad_cuda_fill32(tensor_data(&lse->dl_tensor), 0x7fc00000u, lse_bytes / 4, s,
                                  msg, sizeof msg);
        if (run == FAD_OK && !no_memory)
            run = fad_fwd_cuda(p, ws ? tensor_data(&ws->dl_tensor) : NULL, need, s, msg,
                               sizeof msg);
        if (run == FAD_ERR_WORKSPACE && !append) { /* nothing launched: size, allocate, again */
            run = fad_fwd_workspace_size(p, &need, msg, sizeof msg);
            if (run == FAD_OK)
                no_memory = !(ws = new_workspace(st, q, need));
            if (run == FAD_OK && !no_memory)
                run = fad_fwd_cuda(p, tensor_data(&ws->dl_tensor), need, s, msg, sizeof msg);
        }
        free_tensor(ws);
        leave_device(dev, prev);
        if (no_memory)
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
    if (p->head_dim % 8) /* Python pads it to a multiple of 8 (interface.py, _head_pad) */
        take = LEAVE;
    if (take == LEAVE) {
        PyErr_Clear(); /* a failed check's message: the general path raises it in its words */
        Py_RETURN_NOTIMPLEMENTED;
    }
    if (!(out = new_tensor(st, q, q->ndim, q->shape, q->dtype)))
        return NULL;
    if (with_lse) { /* (B, Hq, Sq), or (Hq, total_q) for a varlen batch */
        const int varlen = p->cu_seqlens_q != NULL;
        const int64_t shape[3] = {varlen ? q->shape[1] : q->shape[0],
                                  varlen ? q->shape[0] : q->shape[2], q->shape[1]};
        if (!(lse = new_tensor(st, q, 3 - varlen, shape, (DLDataType){kDLFloat, 32, 1}))) {
            free_tensor(out);
            return NULL;
        }
        p->softmax_lse = (float *)tensor_data(&lse->dl_tensor);
    }
    set_out(p, &out->dl_tensor);
    return run_infer(st, p, q, append, out, lse);
}

/* The common start of the entries: the argument count (else a TypeError:
 * FAIL), an API that allocates (else LEAVE), p initialised, and the first
 * n_plain arguments taken as plain operands into t (q, k, v). */
static int take_start(tensor_args *ta, const char *entry, PyObject *const *args, Py_ssize_t nargs,
                      Py_ssize_t want, int n_plain, DLTensor **t, fad_fwd_params *p)
{
    int take = TAKE;
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s: expected %zd arguments, got %zd", entry, want, nargs);
        return FAIL;
    }
    if (!ta->st->can_allocate)
        return LEAVE;
    fad_fwd_params_init(p);
    p->check_indices = ta->st->check_indices;
    for (int i = 0; i < n_plain && take == TAKE; i++)
        take = take_tensor(ta, args[i], 1, &t[i]);
    return take;
}

const char infer_doc[] = PyDoc_STR(
"infer(q, k, v, softmax_scale, causal, want_lse) -> out, (out, softmax_lse) or NotImplemented\n"
"--\n\n"
"flash_attn_func(q, k, v, softmax_scale=softmax_scale, causal=causal) for a call\n"
"with no autograd, in the mode set_mode last set: out (and softmax_lse (B, Hq, Sq)\n"
"float32 when want_lse) allocated by torch, launched on torch's current stream.\n"
"NotImplemented (nothing written) when the call is not one it takes as it is: the\n"
"caller then takes the general path (fwd).");

PyObject *fad_py_infer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *qkv[3] = {NULL};
    fad_fwd_params p;
    int take = take_start(ta, "infer", args, nargs, 6, 3, qkv, &p);
    if (take == TAKE && (take = take_no_grad(ta->st, args, 3)) == TAKE &&
        (take = check_fwd(qkv[0], qkv[1], qkv[2], NULL, NULL, &p) ? LEAVE : TAKE) == TAKE)
        take = take_options(ta->st, args[3], args[4], p.head_dim, &p);
    return finish_infer(ta->st, take, &p, qkv[0], NULL, take == FAIL ? NULL : args[5]);
}

/* A max_seqlen argument: a Python int that fits in 32 bits (else LEAVE: the
 * general path converts or raises). */
static int take_int(PyObject *o, int *out)
{
    if (!PyLong_CheckExact(o))
        return LEAVE;
    const long v = PyLong_AsLong(o);
    if ((v == -1 && PyErr_Occurred()) || v < INT32_MIN || v > INT32_MAX)
        return LEAVE;
    *out = (int)v;
    return TAKE;
}

const char infer_varlen_doc[] = PyDoc_STR(
"infer_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,\n"
"             seqused_k, block_table, softmax_scale, causal, want_lse)\n"
"    -> out, (out, softmax_lse) or NotImplemented\n"
"--\n\n"
"flash_attn_varlen_func with no autograd and no score options beyond softmax_scale\n"
"and causal, as infer does for flash_attn_func: out (total_q, Hq, D) and\n"
"softmax_lse (Hq, total_q), filled first as the general path fills them (0 on the\n"
"CPU, NaN on the GPU). seqused_k and block_table may be None.");

PyObject *fad_py_infer_varlen(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *qkv[3] = {NULL}, *cu_q, *cu_k, *used = NULL, *table = NULL;
    fad_fwd_params p;
    int max_q, max_k;
    int take = take_start(ta, "infer_varlen", args, nargs, 12, 3, qkv, &p);
    if (take == TAKE && (take = take_tensor(ta, args[3], 0, &cu_q)) == TAKE &&
        (take = take_tensor(ta, args[4], 0, &cu_k)) == TAKE &&
        (take = take_int(args[5], &max_q)) == TAKE && (take = take_int(args[6], &max_k)) == TAKE &&
        (args[7] == Py_None || (take = take_tensor(ta, args[7], 0, &used)) == TAKE) &&
        (args[8] == Py_None || (take = take_tensor(ta, args[8], 0, &table)) == TAKE) &&
        (take = take_no_grad(ta->st, args, 3)) == TAKE &&
        (take = check_fwd_varlen(qkv[0], qkv[1], qkv[2], NULL, NULL, cu_q, cu_k, used, table,
                                 max_q, max_k, &p) ? LEAVE : TAKE) == TAKE)
        take = take_options(ta->st, args[9], args[10], p.head_dim, &p);
    return finish_infer(ta->st, take, &p, qkv[0], NULL, take == FAIL ? NULL : args[11]);
}

/* infer_kvcache's arguments, in order. */
enum { KV_Q, KV_KC, KV_VC, KV_K, KV_V, KV_COS, KV_SIN, KV_SEQLENS, KV_BATCH_IDX, KV_LEFTPAD,
       KV_TABLE, KV_NTENSORS, KV_SCALE = KV_NTENSORS, KV_CAUSAL, KV_INTERLEAVED, KV_WANT_LSE,
       KV_NARGS };

/* 1 when the kernels' 16-byte rule holds for t's rows (fad_core.c's
 * check_alignment, which fad_fwd_cuda runs only after an append would have
 * written the cache): aligned data, strides of 8 elements, row stride < 2^23. */
static int rows_aligned(const DLTensor *t)
{
    if ((uintptr_t)tensor_data(t) % 16)
        return 0;
    for (int d = 0; d + 1 < t->ndim; d++)
        if (t->shape[d] > 1 && tensor_stride(t, d) % 8)
            return 0;
    return t->ndim < 2 || t->shape[1] <= 1 ||
           (tensor_stride(t, 1) >= 0 && tensor_stride(t, 1) < ((int64_t)1 << 23));
}

/* What the rotary and append step writes and the attention then reads: the
 * rotated q (B, Sq, H, D) and the new lengths (B,) int32, row-major views into
 * one scratch tensor of torch's (one allocation, not two; the caller frees it
 * after the launches, in stream order as run_infer's workspace). A view whose
 * data is NULL is not written (no rotary; nothing appended). */
typedef struct append_out {
    DLManagedTensorVersioned *mem;
    DLTensor q_rot, seqlens;
} append_out;

/* The rotary and append step of an infer_kvcache call (some of k, v, cos, sin
 * given): its params, and its outputs in o. LEAVE for what only the general
 * path does: CPU tensors (torch ops there), cos/sin to be converted, and every
 * misuse (it raises in its words). */
static int take_append(const fad_module_state *st, DLTensor *const t[KV_NTENSORS],
                       PyObject *interleaved, fad_append_params *ap, append_out *o)
{
    const DLTensor *q = t[KV_Q], *k = t[KV_K], *cos = t[KV_COS];
    if (q->device.device_type != kDLCUDA || q->ndim != 4 || !t[KV_K] != !t[KV_V] ||
        !t[KV_COS] != !t[KV_SIN] || (k && k->ndim != 4) || !rows_aligned(t[KV_KC]) ||
        !rows_aligned(t[KV_VC]))
        return LEAVE;
    if (cos && (cos->ndim != 2 || cos->shape[1] <= 0 || 2 * cos->shape[1] > q->shape[3] ||
                !(is_dtype(cos->dtype, kDLFloat, 32) || is_dtype(cos->dtype, q->dtype.code, 16))))
        return LEAVE;
    /* q_rot first, its room rounded up to 256 bytes (and never empty, so that
     * its data is not NULL), then the lengths */
    const size_t q_room = cos ? (tensor_bytes(q) + 256) / 256 * 256 : 0;
    const size_t n_room = k && k->shape[1] > 0 ? (size_t)q->shape[0] * 4 : 0;
    char *base = NULL;
    if (q_room + n_room) {
        if (!(o->mem = new_workspace(st, q, q_room + n_room)))
            return FAIL;
        base = tensor_data(&o->mem->dl_tensor);
    }
    o->q_rot = (DLTensor){q_room ? base : NULL, q->device, 4, q->dtype, q->shape, NULL, 0};
    o->seqlens = (DLTensor){n_room ? base + q_room : NULL, q->device, 1,
                            (DLDataType){kDLInt, 32, 1}, q->shape /* (B,) */, NULL, 0};
    memset(ap, 0, sizeof *ap);
    if (check_append(q, o->q_rot.data ? &o->q_rot : NULL, k, t[KV_V], t[KV_KC], t[KV_VC],
                     t[KV_SEQLENS], o->seqlens.data ? &o->seqlens : NULL, t[KV_BATCH_IDX],
                     t[KV_TABLE], cos, t[KV_SIN], ap))
        return LEAVE;
    const int il = PyObject_IsTrue(interleaved);
    if (il < 0)
        return FAIL;
    ap->rotary_interleaved = il;
    return TAKE;
}

const char infer_kvcache_doc[] = PyDoc_STR(
"infer_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,\n"
"              cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,\n"
"              rotary_interleaved, want_lse) -> out, (out, softmax_lse) or NotImplemented\n"
"--\n\n"
"flash_attn_with_kvcache with no score options beyond softmax_scale and causal, as\n"
"infer does for flash_attn_func (that entry has no autograd anyway).\n"
"k, v, rotary_cos, rotary_sin (CUDA only: rotary and append first, one kernel),\n"
"cache_batch_idx, cache_leftpad and block_table may be None.");

PyObject *fad_py_infer_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    /* plain: the operands the general path copies into a contiguous, aligned form */
    static const int plain[KV_NTENSORS] = {[KV_Q] = 1, [KV_K] = 1, [KV_V] = 1, [KV_COS] = 1,
                                           [KV_SIN] = 1};
    DLTensor *t[KV_NTENSORS] = {NULL};
    append_out o = {NULL, {NULL}, {NULL}};
    fad_fwd_params p;
    fad_append_params ap;
    int appends;
    int take = take_start(ta, "infer_kvcache", args, nargs, KV_NARGS, 1, t, &p);
    for (int i = KV_Q + 1; i < KV_NTENSORS && take == TAKE; i++)
        if (args[i] != Py_None || i < KV_K || i == KV_SEQLENS) /* None for a required one: LEAVE */
            take = take_tensor(ta, args[i], plain[i], &t[i]);
    if (take != TAKE)
        return finish_infer(ta->st, take, &p, NULL, NULL, NULL);
    /* Left to the general path: its own checks of a block table (with the other
     * two; on the CPU, every page it names). */
    if (t[KV_TABLE] && (t[KV_BATCH_IDX] || t[KV_LEFTPAD] || t[KV_Q]->device.device_type == kDLCPU))
        take = LEAVE;
    appends = t[KV_K] || t[KV_V] || t[KV_COS] || t[KV_SIN];
    /* Checked mode (set_index_checks): this entry's attention reads the lengths
     * the append kernel writes, so its check could only run after the append;
     * the general path checks the lengths after the append before it writes. */
    if (take == TAKE && appends && ta->st->check_indices)
        take = LEAVE;
    if (take == TAKE && appends)
        take = take_append(ta->st, t, args[KV_INTERLEAVED], &ap, &o);
    /* the attention reads the rotated q and the lengths after the append */
    const DLTensor *q = o.q_rot.data ? &o.q_rot : t[KV_Q];
    if (take == TAKE)
        take = check_fwd_kvcache(q, t[KV_KC], t[KV_VC], NULL, NULL,
                                 o.seqlens.data ? &o.seqlens : t[KV_SEQLENS], t[KV_BATCH_IDX],
                                 t[KV_LEFTPAD], t[KV_TABLE], &p) ? LEAVE : TAKE;
    if (take == TAKE)
        take = take_options(ta->st, args[KV_SCALE], args[KV_CAUSAL], p.head_dim, &p);
    if (take == TAKE && appends) /* q rotates per row where the mask is local: causal here */
        ap.rotate_q_per_row = p.causal;
    PyObject *res = finish_infer(ta->st, take, &p, q, appends ? &ap : NULL, args[KV_WANT_LSE]);
    free_tensor(o.mem); /* after the launches, in stream order (run_infer's rule) */
    return res;
}

/* ---- for the other inference entries (blocks.c) ---- */

int infer_take_tensor(tensor_args *ta, PyObject *obj, int plain, DLTensor **t)
{
    return take_tensor(ta, obj, plain, t);
}

int infer_take_no_grad(const fad_module_state *st, PyObject *const *objs, int n)
{
    return take_no_grad(st, objs, n);
}

DLManagedTensorVersioned *infer_new_tensor(const fad_module_state *st, const DLTensor *like,
                                           int ndim, const int64_t *shape, DLDataType dtype)
{
    return new_tensor(st, like, ndim, shape, dtype);
}

void infer_free_tensor(DLManagedTensorVersioned *m) { free_tensor(m); }
