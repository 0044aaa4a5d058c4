/*
 * blocks.c — the Python entries of the batch-invariant building blocks
 * (fad_blocks.h): gemm and row_reduce on 2-D tensors, CPU or CUDA. Every
 * argument is checked before anything is written; the caller (flash_attn_det.blocks)
 * allocates the outputs.
 */
#include "glue.h"

#include "fad_blocks.h"

/* The block element type of dt, or -1. */
static int etype_of(DLDataType dt)
{
    return is_dtype(dt, kDLBfloat, 16) ? FAD_E_BFLOAT16
         : is_dtype(dt, kDLFloat, 16)  ? FAD_E_FLOAT16
         : is_dtype(dt, kDLFloat, 32)  ? FAD_E_FLOAT32 : -1;
}

/* A 2-D tensor with a unit column stride (a 0-row one may have any), of a block
 * element type; *et, *ld receive its type and row stride. */
static int get_matrix(tensor_args *ta, PyObject *obj, const char *name, DLTensor **t,
                      fad_etype *et, int64_t *ld)
{
    if (get_tensor(ta, obj, name, t))
        return -1;
    const DLTensor *x = *t;
    if (x->ndim != 2) {
        PyErr_Format(PyExc_ValueError, "%s: expected 2 dims, got %d", name, (int)x->ndim);
        return -1;
    }
    const int e = etype_of(x->dtype);
    if (e < 0) {
        PyErr_Format(PyExc_TypeError, "%s: expected dtype float16, bfloat16 or float32", name);
        return -1;
    }
    *et = (fad_etype)e;
    if (x->shape[1] > 1 && tensor_stride(x, 1) != 1) {
        PyErr_Format(PyExc_ValueError, "%s: last dim must be contiguous (stride 1)", name);
        return -1;
    }
    *ld = x->shape[0] > 1 ? tensor_stride(x, 0) : x->shape[1];
    if (x->shape[0] > 1 && *ld < x->shape[1]) {
        PyErr_Format(PyExc_ValueError, "%s: rows overlap (row stride %lld < %lld columns)", name,
                     (long long)*ld, (long long)x->shape[1]);
        return -1;
    }
    return 0;
}

static int check_same_device(const DLTensor *t, const DLTensor *ref, const char *name,
                             const char *ref_name)
{
    if (same_device(t, ref))
        return 0;
    PyErr_Format(PyExc_ValueError, "%s: must be on the same device as %s", name, ref_name);
    return -1;
}

static int get_stream(PyObject *obj, struct CUstream_st **stream)
{
    const unsigned long long s = PyLong_AsUnsignedLongLong(obj);
    if (s == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_SetString(PyExc_TypeError, "stream: expected a cudaStream_t as an int");
        return -1;
    }
    *stream = (struct CUstream_st *)(uintptr_t)s;
    return 0;
}

/* Runs a block on x's device: the CPU entry with the GIL released, else the CUDA
 * one on that device. */
#define RUN_ON(x, cpu_call, cuda_call)                                                    \
    do {                                                                                  \
        if ((x)->device.device_type == kDLCPU) {                                          \
            Py_BEGIN_ALLOW_THREADS st = (cpu_call);                                       \
            Py_END_ALLOW_THREADS                                                          \
        } else {                                                                          \
            int prev_ = 0;                                                                \
            st = enter_device((x)->device.device_id, &prev_, msg, sizeof msg);             \
            if (st == FAD_OK) {                                                           \
                st = (cuda_call);                                                         \
                leave_device((x)->device.device_id, prev_);                               \
            }                                                                             \
        }                                                                                 \
    } while (0)

const char fad_gemm_doc[] =
"gemm(a, b, c, bias, trans_a, trans_b, stream)\n"
"--\n\n"
"c = a' b' (+ bias), 2-D tensors of one dtype (float16, bfloat16, float32) with unit\n"
"column strides on one device: a' = a.T if trans_a else a, b' = b.T if trans_b else b;\n"
"c (m, n) is written, fp32 accumulation. Each row of c has the same bits whatever the\n"
"number of rows (without trans_a). bias: None or (n,) contiguous, without trans_a.\n"
"stream: a cudaStream_t as an int (ignored on the CPU).";

PyObject *fad_py_gemm(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args ta;
    DLTensor *a, *b, *c, *bias = NULL;
    fad_etype ea, eb, ec;
    fad_gemm_params p;
    struct CUstream_st *stream;
    char msg[512] = "";
    fad_status st;
    int trans_a, trans_b;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "gemm: expected 7 arguments, got %zd", nargs);
        return NULL;
    }
    tensor_args_init(&ta, module);
    if (get_matrix(&ta, args[0], "a", &a, &ea, &p.lda) ||
        get_matrix(&ta, args[1], "b", &b, &eb, &p.ldb) ||
        get_matrix(&ta, args[2], "c", &c, &ec, &p.ldc) ||
        as_int(args[4], "trans_a", &trans_a) || as_int(args[5], "trans_b", &trans_b) ||
        get_stream(args[6], &stream))
        return NULL;
    if (check_same_device(b, a, "b", "a") || check_same_device(c, a, "c", "a"))
        return NULL;
    if (eb != ea || ec != ea) {
        PyErr_SetString(PyExc_TypeError, eb != ea ? "b: must have a's dtype" : "c: must have a's dtype");
        return NULL;
    }
    p.etype = ea, p.trans_a = trans_a != 0, p.trans_b = trans_b != 0;
    p.m = p.trans_a ? a->shape[1] : a->shape[0];
    p.k = p.trans_a ? a->shape[0] : a->shape[1];
    p.n = p.trans_b ? b->shape[0] : b->shape[1];
    const int64_t bk = p.trans_b ? b->shape[1] : b->shape[0];
    if (bk != p.k) {
        PyErr_Format(PyExc_ValueError, "b: inner dimension %lld does not match a's %lld",
                     (long long)bk, (long long)p.k);
        return NULL;
    }
    if (c->shape[0] != p.m || c->shape[1] != p.n) {
        PyErr_Format(PyExc_ValueError, "c: expected shape (%lld, %lld), got (%lld, %lld)",
                     (long long)p.m, (long long)p.n, (long long)c->shape[0], (long long)c->shape[1]);
        return NULL;
    }
    if (args[3] != Py_None) {
        if (get_tensor(&ta, args[3], "bias", &bias) || check_same_device(bias, a, "bias", "a"))
            return NULL;
        if (bias->ndim != 1 || bias->shape[0] != p.n || (p.n > 1 && tensor_stride(bias, 0) != 1)) {
            PyErr_Format(PyExc_ValueError, "bias: expected a contiguous (%lld,) tensor", (long long)p.n);
            return NULL;
        }
        if (etype_of(bias->dtype) != (int)ea) {
            PyErr_SetString(PyExc_TypeError, "bias: must have a's dtype");
            return NULL;
        }
    }
    p.a = tensor_data(a), p.b = tensor_data(b), p.c = tensor_data(c);
    p.bias = bias ? tensor_data(bias) : NULL;
    RUN_ON(a, fad_gemm_cpu(&p, msg, sizeof msg), fad_gemm_cuda(&p, stream, msg, sizeof msg));
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

const char fad_row_reduce_doc[] =
"row_reduce(op, x, y, out, stream)\n"
"--\n\n"
"One fp32 result per row of the 2-D tensor x (float16, bfloat16, float32; unit column\n"
"stride) into out (float32, (rows,), contiguous): op 0 sum, 1 dot with y (x's shape,\n"
"any of those dtypes), 2 log-sum-exp. Each row's bits depend on that row alone.\n"
"stream: a cudaStream_t as an int (ignored on the CPU).";

PyObject *fad_py_row_reduce(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args ta;
    DLTensor *x, *y = NULL, *out;
    fad_row_params p;
    struct CUstream_st *stream;
    char msg[512] = "";
    fad_status st;
    int op;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "row_reduce: expected 5 arguments, got %zd", nargs);
        return NULL;
    }
    tensor_args_init(&ta, module);
    memset(&p, 0, sizeof p);
    if (as_int(args[0], "op", &op) || get_matrix(&ta, args[1], "x", &x, &p.x_type, &p.ldx) ||
        get_tensor(&ta, args[3], "out", &out) || get_stream(args[4], &stream))
        return NULL;
    if (op < FAD_ROW_SUM || op > FAD_ROW_LSE) {
        PyErr_Format(PyExc_ValueError, "op: expected 0 (sum), 1 (dot) or 2 (lse), got %d", op);
        return NULL;
    }
    p.op = (fad_row_op)op, p.rows = x->shape[0], p.cols = x->shape[1];
    if (p.cols == 0) {
        PyErr_SetString(PyExc_ValueError, "x: rows of zero length have no reduction");
        return NULL;
    }
    if (p.op == FAD_ROW_DOT) {
        if (args[2] == Py_None) {
            PyErr_SetString(PyExc_ValueError, "y: required for op 1 (dot)");
            return NULL;
        }
        if (get_matrix(&ta, args[2], "y", &y, &p.y_type, &p.ldy) ||
            check_same_device(y, x, "y", "x"))
            return NULL;
        if (y->shape[0] != p.rows || y->shape[1] != p.cols) {
            PyErr_SetString(PyExc_ValueError, "y: must have x's shape");
            return NULL;
        }
        p.y = tensor_data(y);
    }
    if (check_same_device(out, x, "out", "x"))
        return NULL;
    if (!is_dtype(out->dtype, kDLFloat, 32) || out->ndim != 1 || out->shape[0] != p.rows ||
        (p.rows > 1 && tensor_stride(out, 0) != 1)) {
        PyErr_Format(PyExc_ValueError, "out: expected a contiguous float32 (%lld,) tensor",
                     (long long)p.rows);
        return NULL;
    }
    p.x = tensor_data(x), p.out = tensor_data(out);
    RUN_ON(x, fad_row_reduce_cpu(&p, msg, sizeof msg),
           fad_row_reduce_cuda(&p, stream, msg, sizeof msg));
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

/* A contiguous float32 (rows,) tensor on ref's device. */
static int get_row_vector(tensor_args *ta, PyObject *obj, const char *name, const DLTensor *ref,
                          int code, int bits, DLTensor **t)
{
    if (get_tensor(ta, obj, name, t) || check_same_device(*t, ref, name, "x"))
        return -1;
    if (!is_dtype((*t)->dtype, code, bits) || (*t)->ndim != 1 || (*t)->shape[0] != ref->shape[0] ||
        (ref->shape[0] > 1 && tensor_stride(*t, 0) != 1)) {
        PyErr_Format(PyExc_ValueError, "%s: expected a contiguous %s (%lld,) tensor", name,
                     code == kDLInt ? "int64" : "float32", (long long)ref->shape[0]);
        return -1;
    }
    return 0;
}

/* y: x's dtype and shape (checked after get_matrix). */
static int check_like(const DLTensor *y, fad_etype ey, const DLTensor *x, fad_etype ex,
                      const char *name)
{
    if (check_same_device(y, x, name, "x"))
        return -1;
    if (ey != ex || y->shape[0] != x->shape[0] || y->shape[1] != x->shape[1]) {
        PyErr_Format(PyExc_ValueError, "%s: must have x's dtype and shape", name);
        return -1;
    }
    return 0;
}

/* A norm's weight: None (*w NULL), or a contiguous (cols,) tensor of x's type and device. */
static int get_norm_weight(tensor_args *ta, PyObject *obj, const DLTensor *x, fad_etype et,
                           const void **w)
{
    DLTensor *t;
    *w = NULL;
    if (obj == Py_None)
        return 0;
    if (get_tensor(ta, obj, "w", &t) || check_same_device(t, x, "w", "x"))
        return -1;
    if (t->ndim != 1 || t->shape[0] != x->shape[1] || (t->shape[0] > 1 && tensor_stride(t, 0) != 1)) {
        PyErr_Format(PyExc_ValueError, "w: expected a contiguous (%lld,) tensor",
                     (long long)x->shape[1]);
        return -1;
    }
    if (etype_of(t->dtype) != (int)et) {
        PyErr_SetString(PyExc_TypeError, "w: must have x's dtype");
        return -1;
    }
    *w = tensor_data(t);
    return 0;
}

const char fad_rms_norm_doc[] =
"rms_norm(x, w, y, s, eps, stream)\n"
"--\n\n"
"y = round(w * round(x * s)), s = 1 / sqrt(mean(x^2) + eps) per row of the 2-D x\n"
"(float16, bfloat16, float32); w None or (cols,) of x's dtype; y like x; s float32\n"
"(rows,) receives each row's scale. Each row's bits depend on that row alone.";

PyObject *fad_py_rms_norm(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args ta;
    DLTensor *x, *y, *s;
    fad_rmsnorm_params p;
    fad_etype ey;
    struct CUstream_st *stream;
    char msg[512] = "";
    fad_status st;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "rms_norm: expected 6 arguments, got %zd", nargs);
        return NULL;
    }
    tensor_args_init(&ta, module);
    memset(&p, 0, sizeof p);
    if (get_matrix(&ta, args[0], "x", &x, &p.etype, &p.ldx) ||
        get_matrix(&ta, args[2], "y", &y, &ey, &p.ldy) || check_like(y, ey, x, p.etype, "y") ||
        get_row_vector(&ta, args[3], "s", x, kDLFloat, 32, &s) ||
        as_float(args[4], "eps", &p.eps) || get_stream(args[5], &stream))
        return NULL;
    if (get_norm_weight(&ta, args[1], x, p.etype, &p.w))
        return NULL;
    if (x->shape[1] == 0) {
        PyErr_SetString(PyExc_ValueError, "x: rows of zero length have no norm");
        return NULL;
    }
    p.rows = x->shape[0], p.cols = x->shape[1];
    p.x = tensor_data(x), p.y = tensor_data(y), p.s = tensor_data(s);
    RUN_ON(x, fad_rmsnorm_cpu(&p, msg, sizeof msg), fad_rmsnorm_cuda(&p, stream, msg, sizeof msg));
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

const char fad_rms_norm_bwd_doc[] =
"rms_norm_bwd(x, dy, w, s, dx, dw_part, stream)\n"
"--\n\n"
"RMSNorm's backward for rms_norm(x, w, y, s, ...): dx like x (each row's bits from that\n"
"row alone); dw_part None, or (w given) float32 (ceil(rows / RMSNORM_BWD_ROWS), cols),\n"
"contiguous: each block of rows' partial sums of dy * round(x * s), in row order; dw is\n"
"their sum over the blocks in order (fad_blocks.h).";

PyObject *fad_py_rms_norm_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args ta;
    DLTensor *x, *dy, *s, *dx, *part = NULL;
    fad_rmsnorm_bwd_params p;
    fad_etype ey, ed;
    struct CUstream_st *stream;
    char msg[512] = "";
    fad_status st;
    if (nargs != 7) {
        PyErr_Format(PyExc_TypeError, "rms_norm_bwd: expected 7 arguments, got %zd", nargs);
        return NULL;
    }
    tensor_args_init(&ta, module);
    memset(&p, 0, sizeof p);
    if (get_matrix(&ta, args[0], "x", &x, &p.etype, &p.ldx) ||
        get_matrix(&ta, args[1], "dy", &dy, &ey, &p.lddy) || check_like(dy, ey, x, p.etype, "dy") ||
        get_norm_weight(&ta, args[2], x, p.etype, &p.w) ||
        get_row_vector(&ta, args[3], "s", x, kDLFloat, 32, &s) ||
        get_matrix(&ta, args[4], "dx", &dx, &ed, &p.lddx) || check_like(dx, ed, x, p.etype, "dx") ||
        get_stream(args[6], &stream))
        return NULL;
    if (args[5] != Py_None) {
        const int64_t blocks = (x->shape[0] + FAD_RMSNORM_BWD_ROWS - 1) / FAD_RMSNORM_BWD_ROWS;
        if (get_tensor(&ta, args[5], "dw_part", &part) || check_same_device(part, x, "dw_part", "x"))
            return NULL;
        if (!p.w || !is_dtype(part->dtype, kDLFloat, 32) || part->ndim != 2 ||
            part->shape[0] != blocks || part->shape[1] != x->shape[1] ||
            (blocks > 1 && tensor_stride(part, 0) != x->shape[1]) ||
            (x->shape[1] > 1 && tensor_stride(part, 1) != 1)) {
            PyErr_Format(PyExc_ValueError, "dw_part: expected a contiguous float32 (%lld, %lld) "
                         "tensor, and w", (long long)blocks, (long long)x->shape[1]);
            return NULL;
        }
        p.dw_part = tensor_data(part);
    }
    if (x->shape[1] == 0) {
        PyErr_SetString(PyExc_ValueError, "x: rows of zero length have no norm");
        return NULL;
    }
    p.rows = x->shape[0], p.cols = x->shape[1];
    p.x = tensor_data(x), p.dy = tensor_data(dy), p.s = tensor_data(s), p.dx = tensor_data(dx);
    RUN_ON(x, fad_rmsnorm_bwd_cpu(&p, msg, sizeof msg),
           fad_rmsnorm_bwd_cuda(&p, stream, msg, sizeof msg));
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

const char fad_xent_bwd_doc[] =
"xent_bwd(x, lse, g, target, dx, stream)\n"
"--\n\n"
"dx = g * exp(x - lse) - [column == target] * g per row of the 2-D x (float16, bfloat16,\n"
"float32); lse, g float32 (rows,); target None or int64 (rows,) (negative: no term);\n"
"dx like x. The gradient of log-sum-exp / cross-entropy with respect to the logits.";

PyObject *fad_py_xent_bwd(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    tensor_args ta;
    DLTensor *x, *lse, *g, *t = NULL, *dx;
    fad_xent_bwd_params p;
    fad_etype ed;
    struct CUstream_st *stream;
    char msg[512] = "";
    fad_status st;
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "xent_bwd: expected 6 arguments, got %zd", nargs);
        return NULL;
    }
    tensor_args_init(&ta, module);
    memset(&p, 0, sizeof p);
    if (get_matrix(&ta, args[0], "x", &x, &p.etype, &p.ldx) ||
        get_row_vector(&ta, args[1], "lse", x, kDLFloat, 32, &lse) ||
        get_row_vector(&ta, args[2], "g", x, kDLFloat, 32, &g) ||
        (args[3] != Py_None && get_row_vector(&ta, args[3], "target", x, kDLInt, 64, &t)) ||
        get_matrix(&ta, args[4], "dx", &dx, &ed, &p.lddx) || check_like(dx, ed, x, p.etype, "dx") ||
        get_stream(args[5], &stream))
        return NULL;
    if (x->shape[1] == 0) {
        PyErr_SetString(PyExc_ValueError, "x: rows of zero length");
        return NULL;
    }
    p.rows = x->shape[0], p.cols = x->shape[1];
    p.x = tensor_data(x), p.lse = tensor_data(lse), p.g = tensor_data(g);
    p.target = t ? tensor_data(t) : NULL, p.dx = tensor_data(dx);
    RUN_ON(x, fad_xent_bwd_cpu(&p, msg, sizeof msg), fad_xent_bwd_cuda(&p, stream, msg, sizeof msg));
    if (st != FAD_OK)
        return raise_status(st, msg);
    Py_RETURN_NONE;
}

/* The row stride of x's leading dims seen as one (rows, cols) matrix, or -1 when they do
 * not collapse into one evenly strided dim (then the caller reshapes, which copies). */
static int64_t collapsed_row_stride(const DLTensor *x)
{
    int64_t ld = x->shape[x->ndim - 1], expect = -1;
    for (int d = x->ndim - 2; d >= 0; d--) {
        if (x->shape[d] == 1)
            continue;
        const int64_t st = tensor_stride(x, d);
        if (expect < 0)
            ld = st; /* the innermost leading dim of more than one row */
        else if (st != expect)
            return -1;
        expect = st * x->shape[d];
    }
    return ld;
}

/* A weight or bias: a tensor or a subclass of it (nn.Parameter is one; it overrides no
 * torch function); 0 leaves the call to Python. */
static int take_parameter(tensor_args *ta, PyObject *obj, DLTensor **t)
{
    if (!PyObject_TypeCheck(obj, ta->st->tensor_type))
        return 0;
    if (get_tensor(ta, obj, "tensor", t)) {
        PyErr_Clear();
        return 0;
    }
    return 1;
}

const char fad_linear_infer_doc[] =
"linear_infer(x, w, bias) -> y or NotImplemented\n"
"--\n\n"
"flash_attn_det.blocks.linear's inference path in C: y = x w^T (+ bias), x (..., in),\n"
"w (out, in), y (..., out) new from torch's allocator, on torch's current stream.\n"
"NotImplemented when autograd would record the call, or the tensors need the general\n"
"path's copies or checks (which then runs and raises what it raises).";

PyObject *fad_py_linear_infer(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    const fad_module_state *st = module_state(module);
    tensor_args ta;
    DLTensor *x, *w, *bias = NULL;
    fad_gemm_params p;
    char msg[512] = "";
    fad_status run = FAD_OK;
    int64_t shape[8];
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "linear_infer: expected 3 arguments, got %zd", nargs);
        return NULL;
    }
    if (!st->can_allocate)
        Py_RETURN_NOTIMPLEMENTED;
    tensor_args_init(&ta, module);
    int take = infer_take_tensor(&ta, args[0], 0, &x);
    if (take == 1)
        take = take_parameter(&ta, args[1], &w);
    if (take == 1 && args[2] != Py_None)
        take = take_parameter(&ta, args[2], &bias);
    if (take == 1)
        take = infer_take_no_grad(st, args, args[2] == Py_None ? 2 : 3);
    if (take < 0)
        return NULL;
    if (take == 0)
        Py_RETURN_NOTIMPLEMENTED;
    const DLDataType dt = x->dtype;
    const int half = is_dtype(dt, kDLBfloat, 16) || is_dtype(dt, kDLFloat, 16);
    if (!(half || is_dtype(dt, kDLFloat, 32)) || x->ndim < 1 || x->ndim > 8 || w->ndim != 2 ||
        !is_dtype(w->dtype, dt.code, dt.bits) || !same_device(x, w) ||
        x->shape[x->ndim - 1] != w->shape[1] || w->shape[1] == 0 ||
        (x->shape[x->ndim - 1] > 1 && tensor_stride(x, x->ndim - 1) != 1) ||
        (w->shape[1] > 1 && tensor_stride(w, 1) != 1) ||
        (bias && (bias->ndim != 1 || bias->shape[0] != w->shape[0] || !same_device(bias, x) ||
                  !is_dtype(bias->dtype, dt.code, dt.bits) ||
                  (bias->shape[0] > 1 && tensor_stride(bias, 0) != 1))))
        Py_RETURN_NOTIMPLEMENTED;
    p.lda = collapsed_row_stride(x);
    p.ldb = w->shape[0] > 1 ? tensor_stride(w, 0) : w->shape[1];
    const size_t es = dt.bits / 8;
    if (p.lda < 0 || p.ldb < w->shape[1] ||
        (x->device.device_type == kDLCUDA &&
         (((uintptr_t)tensor_data(x) | (uintptr_t)tensor_data(w) |
           (uintptr_t)(bias ? tensor_data(bias) : NULL)) % 16 ||
          (p.lda * es) % 16 || (p.ldb * es) % 16 || (w->shape[0] * es) % 16)))
        Py_RETURN_NOTIMPLEMENTED;
    p.etype = (fad_etype)etype_of(dt);
    p.trans_a = 0, p.trans_b = 1;
    p.k = w->shape[1], p.n = w->shape[0], p.m = 1;
    for (int d = 0; d < x->ndim - 1; d++)
        p.m *= x->shape[d], shape[d] = x->shape[d];
    shape[x->ndim - 1] = p.n;
    p.ldc = p.n;
    DLManagedTensorVersioned *out = infer_new_tensor(st, x, x->ndim, shape, dt);
    if (!out)
        return NULL;
    p.a = tensor_data(x), p.b = tensor_data(w), p.bias = bias ? tensor_data(bias) : NULL;
    p.c = tensor_data(&out->dl_tensor);
    if (x->device.device_type == kDLCPU) {
        Py_BEGIN_ALLOW_THREADS
        run = fad_gemm_cpu(&p, msg, sizeof msg);
        Py_END_ALLOW_THREADS
    } else {
        void *stream = NULL;
        int prev = 0;
        if (st->api->current_work_stream(kDLCUDA, x->device.device_id, &stream) != 0) {
            infer_free_tensor(out);
            return NULL;
        }
        run = enter_device(x->device.device_id, &prev, msg, sizeof msg);
        if (run == FAD_OK) {
            run = fad_gemm_cuda(&p, (struct CUstream_st *)stream, msg, sizeof msg);
            leave_device(x->device.device_id, prev);
        }
    }
    if (run != FAD_OK) {
        infer_free_tensor(out);
        return raise_status(run, msg);
    }
    PyObject *obj = NULL;
    if (st->api->managed_tensor_to_py_object_no_sync(out, (void **)&obj) != 0)
        return NULL;
    return obj;
}
