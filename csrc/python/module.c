/*
 * module.c — flash_attn_det._C: the CPython glue's general entries and the
 * module. Plain C API, no pybind, no libtorch: tensors arrive as torch tensors
 * (unpacked through DLPack's C exchange API) or as DLPack capsules, are checked
 * and turned into an fad_fwd_params by glue.c, and handed to the CPU or CUDA
 * entry of fad.h. Here outputs and workspace are allocated by the caller
 * (torch's caching allocator); the inference entries of infer.c allocate theirs
 * through the exchange API instead.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "glue.h"

#include "fad_blocks.h" /* FAD_RMSNORM_BWD_ROWS */

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

/* One of a dropout tuple's optional tensors: None (*data stays NULL), or a contiguous int (n,)
 * tensor of `bits` bits on q's device, whose data pointer goes to *data. */
static int dropout_tensor(tensor_args *ta, PyObject *obj, const char *name, int bits, int64_t n,
                          const DLTensor *q, const void **data)
{
    DLTensor *t;
    const int64_t shape[1] = {n};
    if (obj == Py_None)
        return 0;
    if (get_tensor(ta, obj, name, &t) || check_tensor(t, q, name, kDLInt, bits, 1, shape) ||
        check_contiguous(t, name))
        return -1;
    *data = tensor_data(t);
    return 0;
}

/* The optional last argument of fwd, fwd_varlen, bwd and bwd_varlen: None, or dropout as
 * (dropout_p, seed, offset[, seq_ids[, seed_offset]]) -- p a float in [0, 1) (checked with
 * the rest, fad_fwd_check), seed and offset integers in [0, 2^64), seq_ids None or an int32
 * (batch) tensor on q's device (fad_fwd_params.dropout_seq_ids), seed_offset None or an int64
 * (2,) contiguous tensor on q's device holding (seed, offset), which the kernels then read in
 * place of seed and offset (fad_fwd_params.dropout_seed_offset: under CUDA graph capture a
 * captured RNG op fills it anew on each replay). After fill_fwd / fill_fwd_varlen: p->batch
 * is known. Only p is written, and nothing runs before the caller's checks pass. */
static int parse_dropout(tensor_args *ta, PyObject *arg, fad_fwd_params *p, const DLTensor *q)
{
    if (arg == Py_None)
        return 0;
    const Py_ssize_t n = PyTuple_Check(arg) ? PyTuple_Size(arg) : 0;
    if (n < 3 || n > 5) {
        PyErr_SetString(PyExc_TypeError, "dropout: expected None or (dropout_p, seed, offset"
                                         "[, seq_ids[, seed_offset]])");
        return -1;
    }
    if (as_float(PyTuple_GetItem(arg, 0), "dropout_p", &p->dropout_p))
        return -1;
    const char *names[2] = {"seed", "offset"};
    uint64_t *dst[2] = {&p->dropout_seed, &p->dropout_offset};
    for (int i = 0; i < 2; i++) {
        PyObject *x = PyTuple_GetItem(arg, i + 1);
        const unsigned long long v = PyLong_Check(x) ? PyLong_AsUnsignedLongLong(x) : 0;
        if (!PyLong_Check(x) || (v == (unsigned long long)-1 && PyErr_Occurred())) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "dropout: %s must be an int in [0, 2**64)", names[i]);
            return -1;
        }
        *dst[i] = v;
    }
    const void *ids = NULL, *pair = NULL;
    if (dropout_tensor(ta, n >= 4 ? PyTuple_GetItem(arg, 3) : Py_None, "dropout_seq_ids", 32,
                       p->batch, q, &ids) ||
        dropout_tensor(ta, n == 5 ? PyTuple_GetItem(arg, 4) : Py_None, "dropout_seed_offset", 64,
                       2, q, &pair))
        return -1;
    p->dropout_seq_ids = (const int32_t *)ids;
    p->dropout_seed_offset = (const int64_t *)pair;
    return 0;
}

/* nargs must be n, or n + 1 with the dropout argument last. */
static int check_nargs(const char *entry, Py_ssize_t nargs, Py_ssize_t n)
{
    if (nargs == n || nargs == n + 1)
        return 0;
    PyErr_Format(PyExc_TypeError, "%s: expected %zd arguments (%zd with dropout), got %zd", entry,
                 n, n + 1, nargs);
    return -1;
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
        p->num_threads = cpu_threads();
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
 * (out, q, k, v); on the GPU the workspace holds one fp32 per softmax_lse element
 * and, where the five-product backward applies (FLASH_ATTN_DET_BWD_DQ), the dQ accumulator: when it is
 * short, nothing is written and the bytes it needs are returned (as run_fwd does).
 * dq None asks for dk/dv only, dk and dv None for dq only (fad_bwd_part). */
static PyObject *run_bwd(tensor_args *ta, fad_fwd_params *p, const DLTensor *const fwd_t[4],
                         PyObject *const *grads, const fwd_opts *o)
{
    static const char *names[4] = {"dout", "dq", "dk", "dv"};
    fad_bwd_params bp;
    DLTensor *g[4] = {NULL, NULL, NULL, NULL};
    char msg[512] = "";
    const DLTensor *q = fwd_t[1];
    const int no_dq = grads[1] == Py_None, no_dk = grads[2] == Py_None,
              no_dv = grads[3] == Py_None;
    if (no_dk != no_dv || (no_dq && no_dk)) {
        PyErr_SetString(PyExc_ValueError, "dq, dk, dv: None is allowed for dq (dk and dv only) "
                                          "or for both dk and dv (dq only)");
        return NULL;
    }
    bp.part = no_dq ? FAD_BWD_DKDV : no_dk ? FAD_BWD_DQ : FAD_BWD_ALL;
    for (int t = 0; t < 4; t++) {
        const DLTensor *like = fwd_t[t];
        if (grads[t] == Py_None && t > 0)
            continue;
        if (get_tensor(ta, grads[t], names[t], &g[t]) ||
            check_tensor(g[t], q, names[t], q->dtype.code, 16, like->ndim, like->shape) ||
            (t > 0 && check_no_overlap(g[t], names[t])))
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
    bp.dout = tensor_data(g[0]), bp.dq = g[1] ? tensor_data(g[1]) : NULL;
    bp.dk = g[2] ? tensor_data(g[2]) : NULL, bp.dv = g[3] ? tensor_data(g[3]) : NULL;
    fad_status st;
    size_t need = 0;
    if (q->device.device_type == kDLCPU) {
        bp.fwd.num_threads = cpu_threads();
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
            if (st == FAD_ERR_WORKSPACE)
                st = fad_bwd_workspace_size(&bp, &need, msg, sizeof msg);
            leave_device(q->device.device_id, prev);
        }
    }
    if (st != FAD_OK)
        return raise_status(st, msg);
    if (need)
        return PyLong_FromSize_t(need);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fwd_doc,
"fwd(q, k, v, out, softmax_lse, alibi_slopes, workspace, softmax_scale, softcap,\n"
"    window_left, window_right, causal, deterministic, split_size, schedule, stream\n"
"    [, dropout])\n"
"--\n\n"
"Attention forward. q, k, v, out, softmax_lse are tensors (torch.Tensor once\n"
"set_dlpack_exchange_api has been called, or DLPack capsules; q (B, Sq, Hq, D),\n"
"k/v (B, Sk, Hkv, D), out like q, softmax_lse (B, Hq, Sq) float32 contiguous, or\n"
"None when the caller does not need it: not computed); alibi_slopes (float32 (Hq,)\n"
"or (B, Hq)) and workspace (uint8, fwd_workspace_size bytes) are such tensors or None.\n"
"stream is a cudaStream_t as an int (ignored on CPU). dropout: None or\n"
"(dropout_p, seed, offset[, seq_ids[, seed_offset]]), the keep mask of\n"
"fad_make_dropout (fad_math.h); seq_ids None or int32 (B,) (each sequence's id in the\n"
"mask); seed_offset None or an int64 (2,) contiguous tensor on q's device holding\n"
"(seed, offset), read by the kernels when they run in place of seed and offset (pass\n"
"0, 0): a CUDA graph that captured the call then redraws the mask on each replay.\n"
"Everything is checked before anything is written. Returns None, or, when the\n"
"workspace is missing or too small (nothing written), the bytes it needs.");

/* Fills p from fwd's arguments (padded layout); t receives q, k, v, out. */
static int fill_fwd(tensor_args *ta, PyObject *const *args, fad_fwd_params *p, fwd_opts *o,
                    DLTensor *t[4])
{
    DLTensor *q, *k, *v, *out, *lse = NULL;
    fad_fwd_params_init(p);
    p->check_indices = ta->st->check_indices;
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
    if (check_nargs("fwd", nargs, 5 + FWD_NOPTS) || fill_fwd(ta, args, &p, &o, t) ||
        (nargs > 5 + FWD_NOPTS && parse_dropout(ta, args[5 + FWD_NOPTS], &p, t[1])))
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

/* fwd_kvcache's arguments -> checked params (p, o; *q_out = q); -1 with an exception set. */
static int parse_fwd_kvcache(tensor_args *ta, PyObject *const *args, Py_ssize_t nargs,
                             const char *entry, fad_fwd_params *p, fwd_opts *o, DLTensor **q_out)
{
    DLTensor *q, *kc, *vc, *out, *lse = NULL, *seqlens, *batch_idx = NULL, *leftpad = NULL, *bt = NULL;
    if (nargs != 9 + FWD_NOPTS) {
        PyErr_Format(PyExc_TypeError, "%s: expected %d arguments, got %zd", entry, 9 + FWD_NOPTS,
                     nargs);
        return -1;
    }
    fad_fwd_params_init(p);
    p->check_indices = ta->st->check_indices;
    if (get_tensor(ta, args[0], "q", &q) || get_tensor(ta, args[1], "k_cache", &kc) ||
        get_tensor(ta, args[2], "v_cache", &vc) || get_tensor(ta, args[3], "out", &out) ||
        (args[4] != Py_None && get_tensor(ta, args[4], "softmax_lse", &lse)) ||
        get_tensor(ta, args[5], "cache_seqlens", &seqlens) ||
        (args[6] != Py_None && get_tensor(ta, args[6], "cache_batch_idx", &batch_idx)) ||
        (args[7] != Py_None && get_tensor(ta, args[7], "cache_leftpad", &leftpad)) ||
        (args[8] != Py_None && get_tensor(ta, args[8], "block_table", &bt)) ||
        parse_opts(ta, args + 9, p, o) ||
        check_fwd_kvcache(q, kc, vc, out, lse, seqlens, batch_idx, leftpad, bt, p))
        return -1;
    *q_out = q;
    return 0;
}

static PyObject *fad_py_fwd_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *q;
    if (parse_fwd_kvcache(ta, args, nargs, "fwd_kvcache", &p, &o, &q))
        return NULL;
    return run_fwd(&p, q, &o);
}

PyDoc_STRVAR(check_fwd_kvcache_doc,
"check_fwd_kvcache(<the arguments of fwd_kvcache>)\n"
"--\n\n"
"Every check fwd_kvcache runs before it writes (fad_fwd_check_call), and nothing\n"
"else: flash_attn_with_kvcache calls it with the lengths after the append, before\n"
"the append writes into the caches, so that a call that would fail writes nothing.");

static PyObject *fad_py_check_fwd_kvcache(PyObject *module, PyObject *const *args,
                                          Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *q;
    char msg[512] = "";
    if (parse_fwd_kvcache(ta, args, nargs, "check_fwd_kvcache", &p, &o, &q) ||
        finish_opts(&p, q, &o))
        return NULL;
    const fad_status st = fad_fwd_check_call(&p, q->device.device_type != kDLCPU, msg, sizeof msg);
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(check_writable_doc,
"check_writable(t, name)\n"
"--\n\n"
"Raises ValueError (naming name) when the elements of t, a tensor a call writes in\n"
"place, overlap in memory: the check the C entries run on their write targets, for\n"
"the CPU append that runs as torch ops.");

static PyObject *fad_py_check_writable(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *t;
    if (check_nargs("check_writable", nargs, 2))
        return NULL;
    const char *name = PyUnicode_AsUTF8AndSize(args[1], NULL);
    if (!name || get_tensor(ta, args[0], name, &t) || check_no_overlap(t, name))
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(fold_splits_doc,
"fold_splits(m, l, o, out, first)\n"
"--\n\n"
"The CPU path's fold of one row's split states into its result, in the order every\n"
"path folds splits (fad_math.h, FAD_MERGE_GROUP): m, l float32 (n,) and o float32\n"
"(n, D), CPU, contiguous, the states (log2 units) of splits first .. first + n - 1;\n"
"out float32 (D + 2,) receives (m, l, o) of the result, unnormalised. For tests of the\n"
"merge order at split counts no call reaches on the CPU.");

static int get_f32(tensor_args *ta, PyObject *obj, const char *name, int ndim, DLTensor **t)
{
    if (get_tensor(ta, obj, name, t))
        return -1;
    if (!is_dtype((*t)->dtype, kDLFloat, 32) || (*t)->ndim != ndim ||
        (*t)->device.device_type != kDLCPU) {
        PyErr_Format(PyExc_ValueError, "%s: must be a %d-dim float32 CPU tensor", name, ndim);
        return -1;
    }
    return check_contiguous(*t, name);
}

static PyObject *fad_py_fold_splits(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    DLTensor *m, *l, *o, *out;
    int first;
    char msg[256] = "";
    if (check_nargs("fold_splits", nargs, 5) || get_f32(ta, args[0], "m", 1, &m) ||
        get_f32(ta, args[1], "l", 1, &l) || get_f32(ta, args[2], "o", 2, &o) ||
        get_f32(ta, args[3], "out", 1, &out) || as_int(args[4], "first", &first))
        return NULL;
    const int64_t n = m->shape[0], D = o->shape[1];
    if (l->shape[0] != n || o->shape[0] != n || out->shape[0] != D + 2 || n > 0x7fffffff ||
        D > 0x7fffffff) {
        PyErr_Format(PyExc_ValueError, "m, l, o, out: shapes (n,), (n,), (n, D), (D + 2,) expected");
        return NULL;
    }
    const fad_status st = fad_cpu_fold_splits(tensor_data(m), tensor_data(l), tensor_data(o), first,
                                              (int)n, (int)D, tensor_data(out), msg, sizeof msg);
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(bwd_doc,
"bwd(dout, dq, dk, dv, <the arguments of fwd>)\n"
"--\n\n"
"Gradients of the forward fwd computed (out and softmax_lse are its results).\n"
"dout, dq, dk, dv: capsules shaped and strided like out, q, k, v; dq is written in\n"
"full, dk/dv on the rows some query sees (pass zeros). dq None computes dk/dv only,\n"
"dk and dv None dq only (the same bits, half the work). CUDA tensors need a uint8\n"
"workspace of 4 bytes per softmax_lse element, and where the five-product backward\n"
"applies (FLASH_ATTN_DET_BWD_DQ) the dQ accumulator after it: given one too small,\n"
"nothing is written and the bytes it needs are returned.");

static PyObject *fad_py_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    fad_fwd_params p;
    fwd_opts o;
    DLTensor *t[4];
    if (check_nargs("bwd", nargs, 4 + 5 + FWD_NOPTS) || fill_fwd(ta, args + 4, &p, &o, t) ||
        (nargs > 4 + 5 + FWD_NOPTS && parse_dropout(ta, args[4 + 5 + FWD_NOPTS], &p, t[1])))
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
    p->check_indices = ta->st->check_indices;
    if (get_tensor(ta, args[0], "q", &q) || get_tensor(ta, args[1], "k", &k) ||
        get_tensor(ta, args[2], "v", &v) || get_tensor(ta, args[3], "out", &out) ||
        (args[4] != Py_None && get_tensor(ta, args[4], "softmax_lse", &lse)) ||
        get_tensor(ta, args[5], "cu_seqlens_q", &cu_q) ||
        get_tensor(ta, args[6], "cu_seqlens_k", &cu_k) ||
        (args[7] != Py_None && get_tensor(ta, args[7], "seqused_k", &used_k)) ||
        (args[8] != Py_None && get_tensor(ta, args[8], "block_table", &table)) ||
        as_int(args[9], "max_seqlen_q", &max_q) || as_int(args[10], "max_seqlen_k", &max_k) ||
        parse_opts(ta, args + 11, p, o) ||
        check_fwd_varlen(q, k, v, out, lse, cu_q, cu_k, used_k, table, max_q, max_k, p))
        return -1;
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
    if (check_nargs("fwd_varlen", nargs, 11 + FWD_NOPTS) || fill_fwd_varlen(ta, args, &p, &o, t) ||
        (nargs > 11 + FWD_NOPTS && parse_dropout(ta, args[11 + FWD_NOPTS], &p, t[1])))
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
    if (check_nargs("bwd_varlen", nargs, 4 + 11 + FWD_NOPTS) ||
        fill_fwd_varlen(ta, args + 4, &p, &o, t) ||
        (nargs > 4 + 11 + FWD_NOPTS && parse_dropout(ta, args[4 + 11 + FWD_NOPTS], &p, t[1])))
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
"               cache_batch_idx, block_table, rotary_cos, rotary_sin,\n"
"               rotary_interleaved, rotate_q_per_row, stream)\n"
"--\n\n"
"flash_attn_with_kvcache's rotary and append on CUDA tensors, one kernel (fad.h,\n"
"fad_append_params). q (B, Sq, Hq, D); q_rot like q, contiguous, or None without\n"
"rotary; k, v (B, Snew, Hkv, D) or None; k_cache, v_cache (entries or pages, rows,\n"
"Hkv, D); int32 cache_seqlens (B,), seqlens_out (B,) or None (receives\n"
"cache_seqlens + Snew), cache_batch_idx (B,) or None, block_table (B, max_blocks)\n"
"or None; rotary_cos/sin (seqlen_ro, rotary_dim / 2), float32 or q's dtype,\n"
"contiguous, or None. Rotary positions are absolute cache rows (flash_attn's rule):\n"
"new row i of sequence b at cache_seqlens[b] + i.");

static PyObject *fad_py_append_kvcache(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args targs, *ta = &targs;
    tensor_args_init(ta, module);
    /* in append_kvcache's argument order; NULL for None */
    static const char *names[12] = {"q", "q_rot", "k", "v", "k_cache", "v_cache", "cache_seqlens",
                                    "seqlens_out", "cache_batch_idx", "block_table",
                                    "rotary_cos", "rotary_sin"};
    DLTensor *t[12] = {NULL};
    int interleaved, per_row;
    long long stream;
    char msg[512] = "";
    fad_append_params p;
    if (nargs != 15) {
        PyErr_Format(PyExc_TypeError, "append_kvcache: expected 15 arguments, got %zd", nargs);
        return NULL;
    }
    for (int i = 0; i < 12; i++)
        if (args[i] != Py_None && get_tensor(ta, args[i], names[i], &t[i]))
            return NULL;
    if (!t[2] != !t[3]) {
        PyErr_SetString(PyExc_ValueError, "k, v: give both or neither");
        return NULL;
    }
    if (!t[10] != !t[11]) {
        PyErr_SetString(PyExc_ValueError, "rotary_cos, rotary_sin: give both or neither");
        return NULL;
    }
    if (as_int(args[12], "rotary_interleaved", &interleaved) ||
        as_int(args[13], "rotate_q_per_row", &per_row))
        return NULL;
    stream = PyLong_AsLongLong(args[14]);
    if (stream == -1 && PyErr_Occurred())
        return NULL;
    memset(&p, 0, sizeof p);
    if (check_append(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11], &p))
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
"the inference entries (infer, infer_varlen, infer_kvcache) tell inference calls.\n"
"Returns True when they can run (the API has an allocator, to_py_object and\n"
"current_work_stream).");

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
    /* replace the held references (Py_XSETREF, spelled out: it is not in the stable ABI) */
    PyObject *old[3] = {st->api_owner, (PyObject *)st->tensor_type, st->is_grad_enabled};
    st->api_owner = args[0];
    st->tensor_type = (PyTypeObject *)args[1];
    st->is_grad_enabled = args[2];
    for (int i = 0; i < 3; i++)
        Py_XDECREF(old[i]);
    st->api = api;
    st->can_allocate = api->managed_tensor_allocator && api->managed_tensor_to_py_object_no_sync &&
                       api->current_work_stream;
    return PyBool_FromLong(st->can_allocate);
}

PyDoc_STRVAR(set_cpu_threads_source_doc,
"set_cpu_threads_source(fn)\n"
"--\n\n"
"fn() -> int (torch.get_num_threads) is asked on every CPU call for the number of\n"
"threads to run on; None: one thread. The thread count never changes a bit.");

static PyObject *fad_py_set_cpu_threads_source(PyObject *module, PyObject *fn)
{
    if (fn != Py_None && !PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "fn: expected a callable or None");
        return NULL;
    }
    set_cpu_threads_source(fn == Py_None ? NULL : fn);
    Py_RETURN_NONE;
}

PyDoc_STRVAR(set_index_checks_doc,
"set_index_checks(enabled)\n"
"--\n\n"
"Checked mode for CUDA calls (flash_attn_det.set_index_checks): every later call\n"
"copies its index tensors to the host and checks them before it writes.");

static PyObject *fad_py_set_index_checks(PyObject *module, PyObject *enabled)
{
    const int on = PyObject_IsTrue(enabled);
    if (on < 0)
        return NULL;
    module_state(module)->check_indices = on;
    Py_RETURN_NONE;
}

static PyObject *fad_py_get_index_checks(PyObject *module, PyObject *unused)
{
    (void)unused;
    return PyBool_FromLong(module_state(module)->check_indices);
}

PyDoc_STRVAR(get_index_checks_doc,
"get_index_checks() -> bool\n"
"--\n\n"
"Whether CUDA calls check their index tensors on the host first.");

PyDoc_STRVAR(set_mode_doc,
"set_mode(deterministic, split_size, schedule)\n"
"--\n\n"
"Sets the process-wide mode every entry runs in. The module state is the one\n"
"copy of it: flash_attn_det.mode (set_deterministic_mode, get_deterministic_mode,\n"
"get_split_size) and testing.force_schedule write and read it here.");

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
    if (split_size <= 0 || split_size % FAD_SPLIT_QUANTUM || split_size > FAD_MAX_SPLIT_SIZE) {
        PyErr_Format(PyExc_ValueError,
                     "split_size: must be a positive multiple of %d, at most %d, got %d",
                     FAD_SPLIT_QUANTUM, FAD_MAX_SPLIT_SIZE, split_size);
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

PyDoc_STRVAR(get_mode_doc,
"get_mode() -> (deterministic, split_size, schedule)\n"
"--\n\n"
"The mode set_mode last set (at import: deterministic, DEFAULT_SPLIT_SIZE, SCHEDULE_AUTO).");

static PyObject *fad_py_get_mode(PyObject *module, PyObject *unused)
{
    (void)unused;
    const fad_module_state *st = module_state(module);
    return Py_BuildValue("(Oii)", st->deterministic ? Py_True : Py_False, st->split_size,
                         (int)st->schedule);
}

static PyMethodDef fad_methods[] = {
    {"fwd", (PyCFunction)(void (*)(void))fad_py_fwd, METH_FASTCALL, fwd_doc},
    {"fwd_varlen", (PyCFunction)(void (*)(void))fad_py_fwd_varlen, METH_FASTCALL, fwd_varlen_doc},
    {"fwd_kvcache", (PyCFunction)(void (*)(void))fad_py_fwd_kvcache, METH_FASTCALL, fwd_kvcache_doc},
    {"check_fwd_kvcache", (PyCFunction)(void (*)(void))fad_py_check_fwd_kvcache, METH_FASTCALL,
     check_fwd_kvcache_doc},
    {"check_writable", (PyCFunction)(void (*)(void))fad_py_check_writable, METH_FASTCALL,
     check_writable_doc},
    {"fold_splits", (PyCFunction)(void (*)(void))fad_py_fold_splits, METH_FASTCALL,
     fold_splits_doc},
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
    {"infer_varlen", (PyCFunction)(void (*)(void))fad_py_infer_varlen, METH_FASTCALL,
     infer_varlen_doc},
    {"infer_kvcache", (PyCFunction)(void (*)(void))fad_py_infer_kvcache, METH_FASTCALL,
     infer_kvcache_doc},
    {"set_mode", (PyCFunction)(void (*)(void))fad_py_set_mode, METH_FASTCALL, set_mode_doc},
    {"get_mode", fad_py_get_mode, METH_NOARGS, get_mode_doc},
    {"set_index_checks", fad_py_set_index_checks, METH_O, set_index_checks_doc},
    {"get_index_checks", fad_py_get_index_checks, METH_NOARGS, get_index_checks_doc},
    {"gemm", (PyCFunction)(void (*)(void))fad_py_gemm, METH_FASTCALL, fad_gemm_doc},
    {"row_reduce", (PyCFunction)(void (*)(void))fad_py_row_reduce, METH_FASTCALL, fad_row_reduce_doc},
    {"rms_norm", (PyCFunction)(void (*)(void))fad_py_rms_norm, METH_FASTCALL, fad_rms_norm_doc},
    {"rms_norm_bwd", (PyCFunction)(void (*)(void))fad_py_rms_norm_bwd, METH_FASTCALL,
     fad_rms_norm_bwd_doc},
    {"xent_bwd", (PyCFunction)(void (*)(void))fad_py_xent_bwd, METH_FASTCALL, fad_xent_bwd_doc},
    {"linear_infer", (PyCFunction)(void (*)(void))fad_py_linear_infer, METH_FASTCALL,
     fad_linear_infer_doc},
    {"set_cpu_threads_source", fad_py_set_cpu_threads_source, METH_O, set_cpu_threads_source_doc},
    {NULL, NULL, 0, NULL}};

/* What setup.py built and why, in one line (build_backend/fad_toolchain.py's
 * build_plan), for `python -m flash_attn_det.verify` to print. */
#ifndef FAD_BUILD
#define FAD_BUILD "not recorded (built without setup.py)"
#endif

static int fad_exec(PyObject *m)
{
    fad_module_state *st = module_state(m);
    /* the defaults of a fresh fad_fwd_params are the process's mode at import */
    fad_fwd_params defaults;
    fad_fwd_params_init(&defaults);
    st->deterministic = defaults.deterministic;
    st->split_size = defaults.split_size;
    st->schedule = defaults.schedule;
    st->requires_grad = PyUnicode_InternFromString("requires_grad");
    if (!st->requires_grad)
        return -1;
    if (PyModule_AddStringConstant(m, "__version__", FAD_VERSION) < 0 ||
        PyModule_AddStringConstant(m, "BUILD", FAD_BUILD) < 0 ||
        PyModule_AddIntConstant(m, "SPLIT_QUANTUM", FAD_SPLIT_QUANTUM) < 0 ||
        PyModule_AddIntConstant(m, "MAX_SPLIT_SIZE", FAD_MAX_SPLIT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "DEFAULT_SPLIT_SIZE", FAD_DEFAULT_SPLIT_SIZE) < 0 ||
        PyModule_AddIntConstant(m, "MAX_HEAD_DIM", FAD_MAX_HEAD_DIM) < 0 ||
        PyModule_AddIntConstant(m, "RMSNORM_BWD_ROWS", FAD_RMSNORM_BWD_ROWS) < 0 ||
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
