"""The flash_attn-compatible entry points: forward and autograd on CPU and GPU."""
import math
import operator
import struct

import torch
from torch.utils.dlpack import to_dlpack

from . import _C
from . import dropout as _dropout
from . import mode as _mode
from .scores import masked_scores

# Tensors go to _C through torch's DLPack C exchange API where torch has it (>= 2.11): the
# C side unpacks the tensor object itself, no capsule is made (~0.3 us per tensor saved).
# Older torch: a DLPack capsule per tensor.
# With an allocator in that API too, inference calls take _C.infer / infer_varlen /
# infer_kvcache, the whole per-call path in C (None: every call takes the general path).
# CPU calls run on torch.get_num_threads() threads, asked per call (the bits do not depend on it).
_C.set_cpu_threads_source(torch.get_num_threads)
_EXCHANGE_API = getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)
_infer = _infer_varlen = _infer_kvcache = None
if _EXCHANGE_API is not None:
    if _C.set_dlpack_exchange_api(_EXCHANGE_API, torch.Tensor, torch.is_grad_enabled):
        _infer, _infer_varlen, _infer_kvcache = _C.infer, _C.infer_varlen, _C.infer_kvcache

    def _dl(t):
        return t
else:
    _dl = to_dlpack

# flash_attn's rule for operands: last dim contiguous. The kernels also move
# 16-byte chunks, so rows must start 16-byte aligned; anything else is copied.
_ALIGN = 16


def _operand(x, name):
    if type(x) is torch.Tensor and x.is_contiguous() and not x.data_ptr() % _ALIGN:
        return x  # the common case, decided in ~0.2 us (contiguous: strides are products of dims)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() and x.stride(-1) != 1 and x.shape[-1] > 1:
        return x.contiguous()
    if x.is_cuda and (x.data_ptr() % _ALIGN or
                      any(s % 8 for s, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)):
        return x.clone(memory_format=torch.contiguous_format)  # contiguous() may return x itself
    return x


def _window(window_size, causal):
    if type(window_size) is tuple and window_size == (-1, -1):  # the default, in ~0.1 us
        return -1, 0 if causal else -1
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError, OverflowError):  # (OverflowError: int(inf))
        raise ValueError(f"window_size: expected a pair of ints, got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size: entries must be -1 (unbounded) or >= 0, got {window_size!r}")
    return left, 0 if causal else right


# Workspace bytes the CUDA forward last asked for, per plan key (shapes and mode). A call
# passes the remembered size; the C side answers with the bytes it needs instead of running
# when that is short (a first call, or a plan knob that changed), having written nothing.
_WS_BYTES = {}


def _launch(entry, head, tail, q, key, extra=()):
    """entry(*head, workspace, *tail, stream, *extra) with the workspace its plan needs."""
    if not q.is_cuda:
        return entry(*head, None, *tail, 0, *extra)
    stream = _current_stream(q)
    nbytes = _WS_BYTES.get(key, 0)
    need = entry(*head, _workspace(nbytes, q.device), *tail, stream, *extra)
    if need is not None:
        _check_workspace(need, q.device)
        if len(_WS_BYTES) > 4096:
            _WS_BYTES.clear()
        _WS_BYTES[key] = need
        entry(*head, _workspace(need, q.device), *tail, stream, *extra)


def _check_workspace(nbytes, device):
    """A plan's workspace (split partials of a CTA-per-split schedule) larger than the device
    is refused by name before torch is asked for it; the one-CTA schedule (num_splits=1)
    gives the same bits with no workspace (past 1024 splits of a sequence, a fixed pool of
    about 1 MB an SM)."""
    total = torch.cuda.get_device_properties(device).total_memory
    if nbytes > total:
        raise ValueError(f"workspace: this call's plan needs {nbytes} bytes of split partials, "
                         f"more than the device's {total}; num_splits=1 (or the automatic "
                         "schedule) computes the same bits without them")


def _workspace(nbytes, device):
    return _dl(torch.empty(nbytes, dtype=torch.uint8, device=device)) if nbytes else None


def _needs_grad(q, k, v):
    """True when autograd must record the call."""
    return torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or
                                        getattr(k, "requires_grad", False) or
                                        getattr(v, "requires_grad", False))


def _as_f32(x):
    """x rounded to fp32 as the C side will read it (inf past fp32's range)."""
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _number(x, name):
    """float(x), or a TypeError naming the argument (x a str, a list, None...)."""
    if isinstance(x, (float, int)) and not isinstance(x, bool):
        return float(x)
    try:
        return float(x) if isinstance(x, torch.Tensor) and x.numel() == 1 else float(x.__float__())
    except (AttributeError, TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name}: expected a number, got {type(x).__name__}") from None


def _length(x, name):
    """int(x) for a length argument (an int, or a one-element integer tensor), else a
    TypeError or ValueError naming it (None, a float, NaN, a string...)."""
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point():
        return int(x)
    if isinstance(x, float) and x.is_integer():
        return int(x)
    raise (ValueError if isinstance(x, float) else TypeError)(
        f"{name}: expected an int, got {x!r}")


def _options(head_dim, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """The arguments every forward entry shares, checked."""
    if head_dim <= 0:
        raise ValueError(f"head_dim: must be at least 1 (got {head_dim})")
    if softmax_scale is None:
        softmax_scale = head_dim ** -0.5
    else:
        softmax_scale = _number(softmax_scale, "softmax_scale")
        # the C side reads it as a float, where 0 means "the default scale": a scale that
        # rounds to 0 or inf there is refused here (the C inference entries leave it to us)
        if not 0 < _as_f32(softmax_scale) < math.inf:
            raise ValueError(f"softmax_scale: must be > 0 and finite as an fp32 (about 1.4e-45 "
                             f"to 3.4e38), got {softmax_scale!r}")
    softcap = _number(softcap, "softcap")
    left, right = _window(window_size, causal)
    if alibi_slopes is not None:
        alibi_slopes = _dl(_operand(alibi_slopes, "alibi_slopes"))
    return alibi_slopes, float(softmax_scale), float(softcap), left, right, int(bool(causal))


def _current_stream(t):
    """The raw cudaStream_t of t's device's current stream (~0.3 us; torch.cuda.current_stream()
    costs ~7 us)."""
    return torch._C._cuda_getCurrentRawStream(t.get_device())


def _opt(t):
    """An optional tensor argument of _C: None, or the tensor as _C takes it."""
    return None if t is None else _dl(t)


def _fwd(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes, want_lse=True,
         dropout=None):
    """Runs the forward kernel on a padded batch; returns (out, softmax_lse), softmax_lse
    None unless want_lse (then it is neither allocated nor written). dropout: None or
    (dropout_p, seed, offset[, seq_ids[, seed_offset]]) (_dropout_begin's)."""
    q, k, v = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dims (batch, seqlen, nheads, headdim), got {q.dim()}")
    shape = q.shape  # (each tensor attribute read costs ~0.1-0.2 us; the call is host-bound)
    B, Sq, H, D = shape
    opts = _options(D, softmax_scale, causal, window_size, softcap, alibi_slopes)
    out = torch.empty_like(q)  # (~3 us cheaper than torch.empty(shape, ...))
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device) if want_lse else None
    det, split_size, schedule = _mode.current()
    _launch(_C.fwd, (_dl(q), _dl(k), _dl(v), _dl(out), _opt(lse),
                     opts[0]), (*opts[1:], int(det), split_size, schedule), q,
            (0, shape, k.shape, det, split_size, schedule, q.get_device()),
            _c_dropout(dropout))
    return out, lse


def _fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                causal, window_size, softcap, alibi_slopes, seqused_k, block_table=None,
                want_lse=True, dropout=None):
    """Runs the forward kernel on a variable-length batch; returns (out, softmax_lse),
    softmax_lse None unless want_lse."""
    q, k, v = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    if q.dim() != 3:
        raise ValueError(f"q: expected 3 dims (total_q, nheads, headdim), got {q.dim()}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected an int32 torch.Tensor, got {type(t).__name__}")
    max_seqlen_q, max_seqlen_k = (_length(max_seqlen_q, "max_seqlen_q"),
                                  _length(max_seqlen_k, "max_seqlen_k"))
    if max_seqlen_q < 0 or max_seqlen_k < 0:
        raise ValueError(f"max_seqlen_q, max_seqlen_k: must be >= 0, got {max_seqlen_q}, "
                         f"{max_seqlen_k}")
    Tq, H, D = q.shape
    opts = _options(D, softmax_scale, causal, window_size, softcap, alibi_slopes)
    B = max(cu_seqlens_q.shape[0] - 1, 0) if cu_seqlens_q.dim() == 1 else 0
    # On the GPU cu_seqlens are not read back (no sync): a sequence whose bounds fall
    # outside q/k is skipped by the kernel, and NaN-filled outputs make that loud.
    fill = float("nan") if q.is_cuda else 0.0
    out = torch.full(q.shape, fill, dtype=q.dtype, device=q.device)
    lse = torch.full((H, Tq), fill, dtype=torch.float32, device=q.device) if want_lse else None
    det, split_size, schedule = _mode.current()
    _launch(_C.fwd_varlen,
            (_dl(q), _dl(k), _dl(v), _dl(out), _opt(lse),
             _dl(cu_seqlens_q), _dl(cu_seqlens_k), _opt(seqused_k), _opt(block_table),
             int(max_seqlen_q),
             int(max_seqlen_k), opts[0]), (*opts[1:], int(det), split_size, schedule), q,
            (1, q.shape, k.shape, B, int(max_seqlen_q), int(max_seqlen_k),
             None if block_table is None else block_table.shape, det, split_size, schedule,
             q.get_device()), _c_dropout(dropout))
    return out, lse


def _backward(dout, q, k, v, out, lse, softmax_scale, causal, window_size, softcap,
              alibi_slopes, varlen=None, dropout=None, part="all"):
    """dq, dk, dv of a forward call. varlen: (cu_seqlens_q, cu_seqlens_k, seqused_k,
    max_seqlen_q, max_seqlen_k) for the variable-length entry; dropout: the forward's.
    part "dq" or "dkdv" computes only those (the others come back None) with the bits of
    "all" at about half the work (context parallel asks for one part per call)."""
    if part not in ("all", "dq", "dkdv"):
        raise ValueError(f"part: expected 'all', 'dq' or 'dkdv', got {part!r}")
    q, k, v, out, dout = (t.contiguous() for t in (q, k, v, out, dout))
    # Every path writes each element of a dense call's gradients (dK/dV rows that no query sees
    # get zeros from their key block's walk of no step), so they start empty: zero-filling dK
    # and dV cost two memsets a call (84 us at 32k tokens, H16 D128 on an H100). Zeros where a
    # kernel leaves rows: varlen keys past seqused_k or between sequences, varlen dq rows past
    # cu_seqlens_q[-1] (0, as the forward writes there), and a call with no query row, which
    # launches nothing (tests/test_backward.py poisons what starts empty).
    alloc = torch.empty_like if varlen is None and q.shape[1] > 0 else torch.zeros_like
    dq = dk = dv = None
    if part != "dkdv":
        dq = alloc(q)
    if part != "dq":
        dk, dv = alloc(k), alloc(v)
    opts = _options(q.shape[-1], softmax_scale, causal, window_size, softcap, alibi_slopes)
    tensors = [_opt(t) for t in (dout, dq, dk, dv, q, k, v, out, lse)]
    ws_bytes, stream, ws_key = 0, 0, None
    if q.is_cuda:  # scratch for the row sums dout . out (one fp32 per softmax_lse element) and,
        # where the five-product backward applies (FLASH_ATTN_DET_BWD_DQ), the fp32 dQ
        # accumulator: the C side answers with the bytes it needs when they are short (having
        # written nothing), remembered per shape (varlen: the accumulator has a tile more a
        # sequence, so the number of sequences enters the size beside the rows)
        ws_key = ("bwd", q.shape, k.shape, q.dtype, q.device, part, opts[1:],
                  dropout is not None,
                  None if varlen is None else (varlen[0].shape[0], *varlen[3:]))
        ws_bytes = _WS_BYTES.get(ws_key, lse.numel() * 4)
        stream = _current_stream(q)
    det, split_size, schedule = _mode.current()
    mode = (int(det), split_size, schedule, stream)
    extra = _c_dropout(dropout)

    def run(nbytes):
        ws = _dl(torch.empty(nbytes, dtype=torch.uint8, device=q.device)) if q.is_cuda else None
        if varlen is None:
            return _C.bwd(*tensors, opts[0], ws, *opts[1:], *mode, *extra)
        cu_q, cu_k, used, max_q, max_k = varlen
        return _C.bwd_varlen(*tensors, _dl(cu_q), _dl(cu_k),
                             _opt(used), None, int(max_q), int(max_k),
                             opts[0], ws, *opts[1:], *mode, *extra)

    need = run(ws_bytes)
    if need is not None:
        if len(_WS_BYTES) > 4096:
            _WS_BYTES.clear()
        _WS_BYTES[ws_key] = need
        # (a second short answer would leave the gradients unwritten: never silently)
        if run(need) is not None:
            raise RuntimeError(f"backward: the workspace of {need} bytes the call asked for "
                               f"was refused as short")
    return dq, dk, dv


def _no_zero_grads(ctx):
    """No zero-filled gradient for softmax_lse, which takes none (non-differentiable), nor
    for an unused out: autograd would fill one of lse's size at every backward (a kernel
    launch, 3 us at 32k tokens and 16 heads); backward gets None instead."""
    ctx.set_materialize_grads(False)


class _FlashAttnFunc(torch.autograd.Function):
    """flash_attn_func under autograd in eager mode (ops.py registers the same for compile)."""

    @staticmethod
    def forward(ctx, q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                dropout=None):
        out, lse = _fwd(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                        dropout=dropout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = (softmax_scale, causal, window_size, softcap, alibi_slopes)
        ctx.dropout = dropout
        ctx.mark_non_differentiable(lse)
        _no_zero_grads(ctx)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # (out took no gradient: neither do q, k, v)
            return (None,) * 9
        return (*_backward(dout, *ctx.saved_tensors, *ctx.opts, dropout=ctx.dropout),) + \
            (None,) * 6


class _FlashAttnVarlenFunc(torch.autograd.Function):
    """flash_attn_varlen_func under autograd in eager mode."""

    @staticmethod
    def forward(ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                softmax_scale, causal, window_size, softcap, alibi_slopes, seqused_k,
                dropout=None):
        out, lse = _fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                               softmax_scale, causal, window_size, softcap, alibi_slopes,
                               seqused_k, dropout=dropout)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.opts = (softmax_scale, causal, window_size, softcap, alibi_slopes)
        ctx.varlen = (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q, max_seqlen_k)
        ctx.dropout = dropout
        ctx.mark_non_differentiable(lse)
        _no_zero_grads(ctx)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        if dout is None:  # (out took no gradient: neither do q, k, v)
            return (None,) * 14
        dq, dk, dv = _backward(dout, *ctx.saved_tensors, *ctx.opts, varlen=ctx.varlen,
                               dropout=ctx.dropout)
        return (dq, dk, dv) + (None,) * 11


class _FlashAttnPagedFunc(torch.autograd.Function):
    """flash_attn_varlen_func on paged KV with an input that requires grad: the forward runs
    (as in flash_attn); only reaching the backward raises."""

    @staticmethod
    def forward(ctx, q, k, v, block_table, want_lse, dropout, *args):
        out, lse = _fwd_varlen(q, k, v, *args, block_table, want_lse=want_lse, dropout=dropout)
        if lse is not None:
            ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        raise NotImplementedError("block_table: paged KV has no backward (as in flash_attn); "
                                  "call flash_attn_varlen_func with block_table under "
                                  "torch.no_grad() when its output is part of a loss")


def _no_dropout(dropout_p):
    if dropout_p:
        raise NotImplementedError("dropout_p: context-parallel attention has no dropout yet; "
                                  "pass dropout_p=0.0")


def _no_commit():
    pass


def _dropout_seq_ids(ids, batch, q):
    """dropout_seq_ids as _C takes them: None, or int32 (batch,) on q's device holding each
    sequence's identity (uint32 bits). ids: None, one int for every sequence, or one int per
    sequence (a sequence of ints or an integer tensor), each in [0, 2**32)."""
    if ids is None:
        return None
    if _dropout.capturing(q):  # (before torch raises a CUDA error that ends the capture)
        raise NotImplementedError("dropout_seq_ids: not under CUDA graph capture (the ids are "
                                  "checked and copied on the host); pass None there")
    if torch.compiler.is_compiling():  # (the same host checks would break the graph)
        raise NotImplementedError("dropout_seq_ids: not under torch.compile (the ids are "
                                  "checked on the host); pass None there")
    if isinstance(ids, bool) or not isinstance(ids, (int, list, tuple, torch.Tensor)):
        raise TypeError(f"dropout_seq_ids: expected None, an int or one int per sequence, "
                        f"got {type(ids).__name__}")
    t = torch.as_tensor(ids)
    if t.dtype.is_floating_point or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"dropout_seq_ids: expected integers, got {t.dtype}")
    if t.dim() == 0:
        t = t.expand(batch)
    if t.dim() != 1 or t.shape[0] != batch:
        raise ValueError(f"dropout_seq_ids: expected one id per sequence ({batch}), got shape "
                         f"{tuple(t.shape)}")
    t = t.to(torch.int64)
    if t.numel():  # (both bounds in one read: ids on the GPU cost one host sync, not two)
        lo, hi = torch.stack(torch.aminmax(t)).tolist()
        if lo < 0 or hi >= 2 ** 32:
            raise ValueError("dropout_seq_ids: ids must be in [0, 2**32)")
    return torch.where(t >= 2 ** 31, t - 2 ** 32, t).to(torch.int32).to(q.device).contiguous()


def _dropout_begin(dropout_p, q, seq_ids=None, batch=0, s_dmask=False):
    """(dropout, commit): dropout None or (p, seed, offset, seq_ids) for the call (seq_ids:
    _dropout_seq_ids' tensor or None); commit() advances the random generator once the
    call has run (a call that raises does not). Under CUDA graph capture dropout is
    (p, 0, 0, seq_ids, pair), pair dropout.draw_captured's device tensor that the kernels
    read (each replay draws anew), and commit does nothing. While torch.compile traces, it
    is (p, 0, 0, None) and nothing is drawn: host values would be baked into the graph as
    constants, so the forward op draws when it runs, through this same function (ops.py).
    s_dmask: the caller returns S_dmask, which is built on the host from (seed, offset):
    refused under either."""
    p = _number(dropout_p, "dropout_p")  # (its range: fad_fwd_check, before anything runs)
    ids = _dropout_seq_ids(seq_ids, batch, q)  # (checked with or without dropout)
    if p == 0.0:
        return None, _no_commit
    compiling = torch.compiler.is_compiling()
    if compiling or _dropout.capturing(q):
        if s_dmask:
            where = "torch.compile" if compiling else "CUDA graph capture"
            raise NotImplementedError(
                f"return_attn_probs: no S_dmask with dropout under {where} (it is built on "
                f"the host from the seed and offset, which are drawn on the device there); "
                f"pass return_attn_probs=False")
        if compiling:  # (ids: None, _dropout_seq_ids refuses them while compiling)
            return (p, 0, 0, ids), _no_commit
        return (p, 0, 0, ids, _dropout.draw_captured(q)), _no_commit
    seed, offset, commit = _dropout.draw(q, p)
    return (p, seed, offset, ids), commit


def _op_dropout(dropout, q):
    """(dropout_p, dropout_nonce) as the forward custom ops (ops.py) take a call's dropout:
    they draw the seed and offset themselves when they run; the nonce, an empty tensor of
    the call's own, keeps the compiler from folding two calls into one draw."""
    if dropout is None:
        return 0.0, None
    return float(dropout[0]), torch.empty((0,), dtype=torch.int64, device=q.device)


def _c_dropout(dropout):
    """A _C entry's trailing dropout argument: () without dropout, else (the tuple,) with its
    tensors (seq_ids, the captured pair) as _C takes them (capsules on a torch without the
    DLPack exchange API, whose tensor objects _C cannot unpack)."""
    if dropout is None:
        return ()
    return (tuple(_opt(x) if isinstance(x, torch.Tensor) else x for x in dropout),)


def _index32(t, name):
    """An int64 index tensor (what torch.tensor([0, 3, 8]) gives flash_attn users) as the int32
    the kernels read; anything else as it is, for the usual checks. On CPU a value past int32
    is an error naming the argument (on the GPU that check would be a sync, under
    torch.compile a graph break). Only the general path pays for it: the C fast paths leave
    int64 index tensors to it (NotImplemented)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        return t
    if (not t.is_cuda and t.numel() and not torch.compiler.is_compiling()
            and not -2 ** 31 <= int(t.min()) <= int(t.max()) < 2 ** 31):
        raise ValueError(f"{name}: int64 values past int32's range (the kernels read int32)")
    return t.to(torch.int32)


def _batch_of(x, dim=0, minus=0):
    """x.shape[dim] - minus for a tensor (the batch the seq ids must match), else 0 (the
    call's own checks then raise their errors)."""
    return x.shape[dim] - minus if isinstance(x, torch.Tensor) and x.dim() > dim else 0


_MAX_HEAD_DIM = 256


def _head_pad(q, *others):
    """Zero columns that bring a head dim that is not a multiple of 8 up to one: the
    kernels move 16-byte chunks, and flash_attn pads such head dims the same way (in
    Python, and in C++ for the KV cache). 0 when no padding applies: a multiple of 8, a
    head dim past 256, or operands whose last dims differ from q's (the checks then raise
    their usual errors). Zero columns add exact zeros to every q . k, so the padded call
    is the same attention, and its bits obey the same contract."""
    if not isinstance(q, torch.Tensor) or not q.dim():
        return 0
    D = q.shape[-1]
    if not 0 < D <= _MAX_HEAD_DIM or D % 8 == 0:
        return 0
    for t in others:
        if t is not None and (not isinstance(t, torch.Tensor) or not t.dim() or t.shape[-1] != D):
            return 0
    return 8 - D % 8


_INT32_MAX = 2 ** 31 - 1


def _check_sizes(q, *others):
    """Refuses, before anything is allocated (out, a padded or contiguous copy), a call whose
    sizes the kernels cannot count: every dim but the head dim, and q's rows (the product of
    those dims: the grid's CTAs and softmax_lse's rows), at most 2**31 - 1. others: (name,
    tensor) pairs, a tensor None or not a tensor being left to the call's own checks. An
    expand()ed q of 2**31 rows would otherwise ask torch for its out first. (A few max/prod
    calls: this runs on every call of the general path.)"""
    for name, t in (("q", q),) + others:
        if isinstance(t, torch.Tensor) and t.dim() > 1 and max(t.shape[:-1]) > _INT32_MAX:
            d = next(d for d, n in enumerate(t.shape[:-1]) if n > _INT32_MAX)
            raise ValueError(f"{name}: dim {d} is {t.shape[d]}, past the limit of 2**31 - 1")
    if isinstance(q, torch.Tensor) and q.dim() and math.prod(q.shape[:-1]) > _INT32_MAX:
        raise ValueError(f"q: {math.prod(q.shape[:-1])} rows (the product of its dims but the "
                         "last), past the limit of 2**31 - 1")


def _pad_last(t, pad):
    return None if t is None else torch.nn.functional.pad(t, (0, pad))


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False, *, dropout_seq_ids=None):
    """Attention with flash_attn's semantics; bit-reproducible in deterministic mode.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim),
    nheads % nheads_k == 0 (GQA/MQA, no K/V expansion). fp16 or bf16; headdim a
    up to 256 (one that is not a multiple of 8 is padded with zeros and the output sliced,
    as flash_attn does). Causal masks are aligned to the bottom-right corner
    (row i sees keys j <= i + seqlen_k - seqlen_q). window_size=(left, right):
    row i sees keys in [i + Sk - Sq - left, i + Sk - Sq + right] (-1 = unbounded).
    softcap > 0: scores become softcap * tanh(scores / softcap). alibi_slopes:
    fp32 (nheads,) or (batch, nheads); adds -slope * |i + Sk - Sq - j|.
    deterministic: accepted for flash_attn compatibility (it concerns the
    backward pass there); the forward's determinism is set_deterministic_mode's.

    dropout_p > 0: dropout with a keep mask keyed by positions (docs/api.md, "Dropout"), so a
    sequence is dropped alike in any batch; dropout_seq_ids (flash_attn_det's own keyword:
    None, one int, or one int in [0, 2**32) per batch entry) tells sequences at the same
    positions apart: a sequence's mask depends on its id, not on its batch index.

    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, None)
    with softmax_lse (batch, nheads, seqlen_q) fp32 when return_attn_probs (with dropout,
    S_dmask in flash_attn's convention in place of None).
    Rows that see no key get out 0 and lse -inf.
    """
    if (_infer is not None and not (dropout_p or softcap) and alibi_slopes is None
            and window_size == (-1, -1) and dropout_seq_ids is None
            and not torch.compiler.is_compiling()):
        res = _infer(q, k, v, softmax_scale, causal, return_attn_probs)
        if res is not NotImplemented:  # (NotImplemented: not a call it takes as it is)
            return (*res, None) if return_attn_probs else res
    _check_sizes(q, ("k", k), ("v", v))
    pad = _head_pad(q, k, v)
    if pad:  # (autograd slices the padded gradients back through the pad)
        D = q.shape[-1]
        res = flash_attn_func(_pad_last(q, pad), _pad_last(k, pad), _pad_last(v, pad), dropout_p,
                              D ** -0.5 if softmax_scale is None else softmax_scale, causal,
                              window_size, softcap, alibi_slopes, deterministic, return_attn_probs,
                              dropout_seq_ids=dropout_seq_ids)
        return (res[0][..., :D], *res[1:]) if return_attn_probs else res[..., :D]
    dropout, commit = _dropout_begin(dropout_p, q, dropout_seq_ids, _batch_of(q),
                                     return_attn_probs)
    if torch.compiler.is_compiling():
        left, right = _window(window_size, causal)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
        out, lse, _ = torch.ops.flash_attn_det.fwd(q, k, v, scale, bool(causal), left, right,
                                                   float(softcap), alibi_slopes,
                                                   *_op_dropout(dropout, q))
    elif _needs_grad(q, k, v):
        out, lse = _FlashAttnFunc.apply(q, k, v, softmax_scale, causal, window_size, softcap,
                                        alibi_slopes, dropout)
    else:  # inference: softmax_lse only when asked for
        out, lse = _fwd(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes,
                        want_lse=return_attn_probs, dropout=dropout)
    commit()
    if not return_attn_probs:
        return out
    return out, lse, _s_dmask(q, k, None, softmax_scale, causal, window_size, softcap,
                              alibi_slopes, dropout)


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None, seqused_k=None, *,
                           dropout_seq_ids=None):
    """flash_attn_func over a batch of sequences packed along the first axis.

    q: (total_q, nheads, headdim), k/v: (total_k, nheads_k, headdim); sequence b is rows
    [cu_seqlens_q[b], cu_seqlens_q[b+1]) of q and [cu_seqlens_k[b], cu_seqlens_k[b+1]) of
    k/v (int32, batch + 1 entries); max_seqlen_q/k bound the lengths. seqused_k (int32,
    (batch,)): sequence b attends only its first seqused_k[b] keys. Masks, scale, softcap,
    ALiBi ((nheads,) or (batch, nheads)) as flash_attn_func, per sequence. A sequence's
    bits equal those of flash_attn_func on that sequence alone (deterministic mode).
    Returns out (total_q, nheads, headdim), or (out, softmax_lse (nheads, total_q), None).
    block_table (int32 (batch, max_blocks), inference only): k/v are pages (num_pages,
    page_size, nheads_k, headdim), page_size a multiple of 16; sequence b's key j is row
    j % page_size of page block_table[b][j // page_size], cu_seqlens_k (and seqused_k) give
    the lengths; the same bits as the keys laid out contiguously. dropout_seq_ids: one
    id per sequence (as flash_attn_func's).
    """
    if (_infer_varlen is not None and not (dropout_p or softcap) and alibi_slopes is None
            and window_size == (-1, -1) and dropout_seq_ids is None
            and not torch.compiler.is_compiling()):
        res = _infer_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                            seqused_k, block_table, softmax_scale, causal, return_attn_probs)
        if res is not NotImplemented:  # (NotImplemented: not a call it takes as it is)
            return (*res, None) if return_attn_probs else res
    _check_sizes(q, ("k", k), ("v", v))
    cu_seqlens_q, cu_seqlens_k = (_index32(cu_seqlens_q, "cu_seqlens_q"),
                                  _index32(cu_seqlens_k, "cu_seqlens_k"))
    seqused_k, block_table = _index32(seqused_k, "seqused_k"), _index32(block_table, "block_table")
    pad = _head_pad(q, k, v)
    if pad:  # (paged k/v: the pages are copied, as flash_attn's padding does)
        D = q.shape[-1]
        res = flash_attn_varlen_func(
            _pad_last(q, pad), _pad_last(k, pad), _pad_last(v, pad), cu_seqlens_q, cu_seqlens_k,
            max_seqlen_q, max_seqlen_k, dropout_p, D ** -0.5 if softmax_scale is None
            else softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
            return_attn_probs, block_table, seqused_k, dropout_seq_ids=dropout_seq_ids)
        return (res[0][..., :D], *res[1:]) if return_attn_probs else res[..., :D]
    args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
            window_size, softcap, alibi_slopes, seqused_k)
    dropout, commit = _dropout_begin(dropout_p, q, dropout_seq_ids,
                                     _batch_of(cu_seqlens_q, 0, 1), return_attn_probs)
    if torch.compiler.is_compiling():
        left, right = _window(window_size, causal)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
        out, lse, _ = torch.ops.flash_attn_det.fwd_varlen(
            q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), scale,
            bool(causal), left, right, float(softcap), alibi_slopes, seqused_k, block_table,
            *_op_dropout(dropout, q))
    elif _needs_grad(q, k, v) and block_table is not None:
        out, lse = _FlashAttnPagedFunc.apply(q, k, v, block_table, return_attn_probs, dropout,
                                             *args[3:])
    elif _needs_grad(q, k, v):
        out, lse = _FlashAttnVarlenFunc.apply(*args, dropout)
    else:  # inference: softmax_lse only when asked for
        out, lse = _fwd_varlen(*args, block_table, want_lse=return_attn_probs, dropout=dropout)
    commit()
    if not return_attn_probs:
        return out
    return out, lse, _s_dmask(q, k, (cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                     max_seqlen_k, block_table), softmax_scale, causal,
                              window_size, softcap, alibi_slopes, dropout)


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """The key block of S_dmask's convention (flash_attn's helper of the same name, which its
    tests use to decode S_dmask): flash_attn_det's S_dmask is relative to each row's own max,
    one block per row."""
    return 1 << 30


def _s_dmask(q, k, varlen, softmax_scale, causal, window_size, softcap, alibi_slopes, dropout):
    """S_dmask as flash_attn returns it with return_attn_probs=True and dropout (None without
    dropout): (batch, nheads, seqlen_q, seqlen_k), both rounded up to 128, q's dtype. Entry
    (b, h, i, j) is exp(score - the row's max score) for a key j that row i sees, negated
    where dropout drops it, and 0 elsewhere. Computed here in fp32 from q and k (and the
    mask from dropout.keep_mask): a debugging aid, O(seqlen_q * seqlen_k) memory."""
    if dropout is None:
        return None
    p, ids = dropout[0], dropout[3]
    seed, offset = _dropout.seed_offset(dropout)
    ids = [0] * (q.shape[0] if varlen is None else len(varlen[0]) - 1) if ids is None else \
        [x & 0xFFFFFFFF for x in ids.tolist()]
    H, D = q.shape[-2], q.shape[-1]
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    left, right = _window(window_size, causal)
    if varlen is None:
        B, Lq, Lk = q.shape[0], q.shape[1], k.shape[1]
        seqs = [(b, q[b], k[b], Lq, Lk) for b in range(B)]
        max_q, max_k = Lq, Lk
    else:
        cu_q, cu_k, used, max_q, max_k, table = varlen
        if table is not None:
            raise NotImplementedError("return_attn_probs: no S_dmask for paged KV")
        cu_q, cu_k = cu_q.tolist(), cu_k.tolist()
        used = None if used is None else used.tolist()
        B = len(cu_q) - 1
        seqs = []
        for b in range(B):
            Lq, Lk = cu_q[b + 1] - cu_q[b], cu_k[b + 1] - cu_k[b]
            Lk = Lk if used is None else min(Lk, used[b])
            seqs.append((b, q[cu_q[b]:cu_q[b + 1]], k[cu_k[b]:cu_k[b] + Lk], Lq, Lk))
    rq, rk = (int(max_q) + 127) // 128 * 128, (int(max_k) + 127) // 128 * 128
    S = torch.zeros((B, H, rq, rk), dtype=q.dtype, device=q.device)
    heads = torch.arange(H, device=q.device)
    for b, qb, kb, Lq, Lk in seqs:
        if Lq == 0 or Lk == 0:
            continue
        kb = kb.float().repeat_interleave(H // kb.shape[1], dim=1).transpose(0, 1)  # (H, Lk, D)
        i = torch.arange(Lq, device=q.device).view(-1, 1) + (Lk - Lq)  # key-space position
        j = torch.arange(Lk, device=q.device).view(1, -1)
        slope = None
        if alibi_slopes is not None:
            slope = (alibi_slopes[b] if alibi_slopes.dim() == 2 else alibi_slopes).float().view(-1, 1, 1)
        s = masked_scores(qb.float().transpose(0, 1), kb, scale, float(softcap), slope,
                          i, j, left, right)  # (H, Lq, Lk)
        m = s.amax(-1, keepdim=True)
        a = torch.exp(s - torch.where(m == -math.inf, 0.0, m))
        keep = _dropout.keep_mask(p, seed, offset, heads, i.view(-1), j.view(-1), ids[b])
        S[b, :, :Lq, :Lk] = torch.where(keep, a, -a).to(q.dtype)
    return S


def _rotary(x, cos, sin, pos, interleaved):
    """x (B, S, H, D) with its first rotary_dim = 2 * cos.shape[1] dims rotated at positions
    pos (B, S), in fp32 (flash_attn's rotary: GPT-J pairs (2j, 2j+1) when interleaved, else
    GPT-NeoX halves (j, j + rotary_dim/2)). A position outside cos/sin gives NaN: never a
    silently wrong rotation."""
    half = cos.shape[1]
    bad = (pos < 0) | (pos >= cos.shape[0])
    safe = pos.clamp(0, cos.shape[0] - 1)
    c = cos[safe].float().masked_fill(bad[..., None], float("nan"))[:, :, None]
    s = sin[safe].float()[:, :, None]
    xr = x[..., :2 * half].float()
    x0, x1 = (xr[..., 0::2], xr[..., 1::2]) if interleaved else (xr[..., :half], xr[..., half:])
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    y = torch.stack((y0, y1), dim=-1).flatten(-2) if interleaved else torch.cat((y0, y1), dim=-1)
    return torch.cat((y.to(x.dtype), x[..., 2 * half:]), dim=-1)


def _kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                    cache_batch_idx, rotary_interleaved, rotate_q_per_row,
                    block_table=None, before_write=None):
    """flash_attn_with_kvcache's steps before attention: rotary on q and the new keys, new
    keys/values written at rows cache_seqlens + i. Returns (q, cache_seqlens after). CPU
    tensors are checked in full first (nothing is written on failure), then run as torch ops
    (the reference the CUDA kernel's bits are tested against); CUDA tensors go to the kernel
    (_kvcache_append_cuda), which does not read indices back: a row that would land outside
    the cache is not written, and the attention reports that sequence as NaN.
    before_write(n_new), if given, runs once this step's own checks pass and before anything
    is written: the caller's checks of what comes after (the attention's)."""
    B, Sq = q.shape[:2]
    n_new = 0
    if k is not None or v is not None:
        if k is None or v is None:
            raise ValueError("k, v: give both or neither")
        k, v = _operand(k, "k"), _operand(v, "v")
        if k.dim() != 4 or k.shape[0] != B or k.shape[2:] != k_cache.shape[2:] or v.shape != k.shape:
            raise ValueError(f"k, v: expected (batch={B}, seqlen_new, {k_cache.shape[2]}, "
                             f"{k_cache.shape[3]}) each, got {tuple(k.shape)}, {tuple(v.shape)}")
        if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype:
            raise TypeError(f"k, v: expected dtypes {k_cache.dtype}, {v_cache.dtype} (those of "
                            f"k_cache, v_cache), got {k.dtype}, {v.dtype}")
        n_new = k.shape[1]
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos, rotary_sin: give both or neither")
    if rotary_cos is not None:
        if (rotary_cos.dim() != 2 or rotary_sin.shape != rotary_cos.shape
                or not 0 < 2 * rotary_cos.shape[1] <= q.shape[-1]):
            raise ValueError("rotary_cos, rotary_sin: expected (seqlen_ro, rotary_dim / 2) with "
                             f"rotary_dim <= headdim, got {tuple(rotary_cos.shape)}, "
                             f"{tuple(rotary_sin.shape)}")
    start = None if q.is_cuda else cache_seqlens  # rotary positions: absolute cache rows
    if not q.is_cuda:  # host tensors: check everything before writing anything
        if n_new:  # (CUDA tensors: the append's C entry runs the same check itself)
            _writable(k_cache, "k_cache"), _writable(v_cache, "v_cache")
        capacity = (k_cache.shape[1] if block_table is None
                    else block_table.shape[1] * k_cache.shape[1])
        if int((cache_seqlens + n_new).max()) > capacity or int(cache_seqlens.min()) < 0:
            raise ValueError(f"cache_seqlens: appending {n_new} rows passes the cache's "
                             f"{capacity} rows")
        if rotary_cos is not None:
            last = int((start + max(n_new, Sq if rotate_q_per_row else 1) - 1).max())
            if int(start.min()) < 0 or last >= rotary_cos.shape[0]:
                raise ValueError(f"rotary_cos: positions up to {last} need more than its "
                                 f"{rotary_cos.shape[0]} rows")
    if before_write is not None:
        before_write(n_new)
    if q.is_cuda:  # one kernel (csrc/cuda/append.cu) does the steps below, same bits
        return _kvcache_append_cuda(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                    cache_seqlens, cache_batch_idx, rotary_interleaved,
                                    rotate_q_per_row, block_table)
    pos = start.long()[:, None]  # (flash_attn's rule, cache_leftpad or not)
    if rotary_cos is not None:
        q_pos = pos + (torch.arange(Sq, device=q.device) if rotate_q_per_row else 0)
        q = _rotary(q, rotary_cos, rotary_sin, q_pos.expand(B, Sq), rotary_interleaved)
    if n_new:
        if rotary_cos is not None:
            k = _rotary(k, rotary_cos, rotary_sin, pos + torch.arange(n_new, device=q.device),
                        rotary_interleaved)
        rows = cache_seqlens.long()[:, None] + torch.arange(n_new, device=q.device)
        if block_table is None:
            entry = (torch.arange(B, device=q.device) if cache_batch_idx is None
                     else cache_batch_idx.long())[:, None]
            rows = rows.clamp(0, k_cache.shape[1] - 1)
        else:  # paged: row r of sequence b is row r % page of block block_table[b, r // page]
            page = k_cache.shape[1]
            slot = (rows // page).clamp(0, block_table.shape[1] - 1)
            entry = block_table.long().gather(1, slot).clamp(0, k_cache.shape[0] - 1)
            rows = rows % page
        k_cache[entry, rows] = k
        v_cache[entry, rows] = v
    return q, cache_seqlens + n_new


def _kvcache_append_cuda(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                         cache_batch_idx, rotary_interleaved, rotate_q_per_row, block_table):
    """_kvcache_append on CUDA tensors: one launch instead of a few dozen torch ops."""
    q_rot, rot = None, (None, None)
    if rotary_cos is not None:
        if rotary_cos.dtype not in (torch.float32, q.dtype):  # the kernel reads these two
            rotary_cos, rotary_sin = rotary_cos.float(), rotary_sin.float()
        rot = (_dl(rotary_cos.contiguous()), _dl(rotary_sin.contiguous()))
        q_rot = torch.empty_like(q, memory_format=torch.contiguous_format)
    seqlens_out = torch.empty_like(cache_seqlens) if k is not None and k.shape[1] else None
    _C.append_kvcache(_dl(q), _opt(q_rot), _opt(k), _opt(v), _dl(k_cache),
                      _dl(v_cache), _dl(cache_seqlens), _opt(seqlens_out),
                      _opt(cache_batch_idx), _opt(block_table), *rot,
                      int(bool(rotary_interleaved)), int(bool(rotate_q_per_row)),
                      _current_stream(q))
    return (q if q_rot is None else q_rot), (cache_seqlens if seqlens_out is None else seqlens_out)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None,
                            block_table=None, softmax_scale=None, causal=False,
                            window_size=(-1, -1), softcap=0.0, rotary_interleaved=True,
                            alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Attention over a KV cache (inference: no autograd), flash_attn's semantics.

    q: (batch, seqlen_q, nheads, headdim); k_cache/v_cache: (batch_cache, capacity,
    nheads_k, headdim). k, v (batch, seqlen_new, nheads_k, headdim): appended in place at
    cache rows cache_seqlens[b] + i before attention. rotary_cos/sin (seqlen_ro, rotary_dim/2):
    rotate the new keys at positions cache_seqlens + i (absolute cache rows, cache_leftpad or
    not: flash_attn's rule), and q at the same positions when causal or local (else all of q
    at cache_seqlens); rotary_interleaved picks GPT-J pairs over GPT-NeoX halves. Sequence b then attends cache rows
    [cache_leftpad[b], cache_seqlens[b] + seqlen_new) of entry cache_batch_idx[b] (defaults:
    0, the capacity, b), its queries being the last seqlen_q positions. cache_seqlens: int or
    int32 (batch,). In deterministic mode a row's bits do not depend on the capacity, the
    entry, leftpad (rotary aside: its positions are cache rows), the other sequences, or whether it comes from a prefill, a chunk or a
    one-token decode. num_splits (an int, flash_attn's: 0 automatic, 1 do not split, > 1
    split): in deterministic mode the keys are always walked in split_size splits, which fix
    the bits, so num_splits only says how the GPU spreads them over CTAs: 1 runs every split of
    a (sequence, kv head) in one CTA, folded in registers (no combine kernel: faster for a
    batch of same-length sequences that fills most SMs, slower for a long sequence among short
    ones, whose splits then queue in one CTA), > 1 gives each split a CTA plus the combine, 0
    lets the plan choose from the shapes; the bits are the same whichever. Fast mode ignores it
    (its plan adapts to the batch and the GPU). block_table (int32
    (batch, max_blocks)): a paged cache (num_blocks, page_size, nheads_k, headdim), page_size
    a multiple of 16; the kernels read the pages in place through the table (same bits as a
    contiguous cache, whatever the page size or block order). A block index outside the
    cache is an error on CPU tensors; on the GPU the rows that would read it are NaN.
    Returns out, or (out, softmax_lse (batch, nheads, seqlen_q)).
    """
    # (the default 0 without a call: this is decode's per-call path)
    schedule = None if type(num_splits) is int and not num_splits else _schedule_of(num_splits)
    if (_infer_kvcache is not None and not softcap and alibi_slopes is None
            and window_size == (-1, -1) and cache_seqlens is not None and schedule is None
            and not torch.compiler.is_compiling()):
        res = _infer_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                             cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                             rotary_interleaved, return_softmax_lse)
        if res is not NotImplemented:
            return res
    _check_sizes(q, ("k_cache", k_cache), ("v_cache", v_cache), ("k", k), ("v", v))
    cache_seqlens, cache_batch_idx = (_index32(cache_seqlens, "cache_seqlens"),
                                      _index32(cache_batch_idx, "cache_batch_idx"))
    cache_leftpad, block_table = (_index32(cache_leftpad, "cache_leftpad"),
                                  _index32(block_table, "block_table"))
    pad = _head_pad(q, k_cache, v_cache, k, v)
    if pad:
        return _kvcache_padded(
            pad, q, k_cache, v_cache, k, v, rotary_cos=rotary_cos, rotary_sin=rotary_sin,
            cache_seqlens=cache_seqlens, cache_batch_idx=cache_batch_idx,
            cache_leftpad=cache_leftpad, block_table=block_table, softmax_scale=softmax_scale,
            causal=causal, window_size=window_size, softcap=softcap,
            rotary_interleaved=rotary_interleaved, alibi_slopes=alibi_slopes,
            num_splits=num_splits, return_softmax_lse=return_softmax_lse)
    if cache_seqlens is None and isinstance(k_cache, torch.Tensor) and k_cache.dim():
        cache_seqlens = k_cache.shape[1] if k is None else 0
    if isinstance(cache_seqlens, int) and isinstance(q, torch.Tensor) and q.dim():
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
            cache_leftpad, block_table)
    if torch.compiler.is_compiling():
        left, right = _window(window_size, causal)
        scale = q.shape[-1] ** -0.5 if softmax_scale is None else float(softmax_scale)
        out, lse = torch.ops.flash_attn_det.fwd_kvcache(*args, scale, bool(causal), left, right,
                                                        float(softcap), bool(rotary_interleaved),
                                                        alibi_slopes, int(num_splits))
    else:
        out, lse = _fwd_kvcache(*args, softmax_scale, causal, window_size, softcap,
                                rotary_interleaved, alibi_slopes, want_lse=return_softmax_lse,
                                num_splits=num_splits)
    return (out, lse) if return_softmax_lse else out


def _schedule_of(num_splits):
    """flash_attn_with_kvcache's num_splits as the schedule of a deterministic-mode call (None:
    the mode's own, automatic unless testing.force_schedule set one). Checked before anything
    runs, so a bad value leaves the caches as they were."""
    try:
        num_splits = operator.index(num_splits)
    except TypeError:
        raise TypeError(f"num_splits: expected an int, got {type(num_splits).__name__}") from None
    if num_splits <= 0 or not _mode.current()[0]:  # (flash_attn: below 1 is its heuristic)
        return None
    return _C.SCHEDULE_ONE_CTA if num_splits == 1 else _C.SCHEDULE_CTA_PER_SPLIT


def _writable(t, name):
    """Refuses a tensor written in place whose elements overlap in memory (a stride-0 dim, or
    strides shorter than the dims inside them): the C entries' own check (glue.c)."""
    _C.check_writable(_dl(t), name)


def _kvcache_padded(pad, q, k_cache, v_cache, k, v, **kw):
    """flash_attn_with_kvcache for a head dim that is not a multiple of 8: on zero-padded
    copies of q, the caches and the new k/v (kw: the other arguments), then the caches
    copied back when something was appended -- flash_attn's C++ does the same, copy
    included. A call that raises has written nothing into the caller's caches."""
    D = q.shape[-1]
    if k is not None:  # (the padded copies below would hide an expand()ed cache from the checks)
        _writable(k_cache, "k_cache"), _writable(v_cache, "v_cache")
    k_pad, v_pad = _pad_last(k_cache, pad), _pad_last(v_cache, pad)
    if kw["softmax_scale"] is None:  # the unpadded head dim's default
        kw["softmax_scale"] = D ** -0.5
    res = flash_attn_with_kvcache(_pad_last(q, pad), k_pad, v_pad, _pad_last(k, pad),
                                  _pad_last(v, pad), **kw)
    if k is not None:
        k_cache.copy_(k_pad[..., :D])
        v_cache.copy_(v_pad[..., :D])
    return (res[0][..., :D], res[1]) if kw["return_softmax_lse"] else res[..., :D]


def _fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                 cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                 rotary_interleaved, alibi_slopes, want_lse=True, num_splits=0):
    """flash_attn_with_kvcache's work once cache_seqlens is a tensor; returns (out, lse),
    lse None unless want_lse. num_splits: as flash_attn_with_kvcache's (_schedule_of)."""
    call_schedule = _schedule_of(num_splits)
    q = _operand(q, "q")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() and t.stride(-1) != 1:
            raise ValueError(f"{name}: last dim must be contiguous (the cache is written in place)")
    if q.dim() != 4 or k_cache.dim() != 4:
        raise ValueError(f"q, k_cache: expected 4 dims, got {q.dim()}, {k_cache.dim()}")
    if v_cache.dtype != k_cache.dtype:
        raise TypeError(f"v_cache: expected dtype {k_cache.dtype} (that of k_cache), "
                        f"got {v_cache.dtype}")
    B, Sq, H, D = q_shape = q.shape
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError("cache_seqlens: expected an int or an int32 tensor")
    opts = _options(D, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if block_table is not None:
        _check_block_table(block_table, q, k_cache, cache_batch_idx, cache_leftpad)
        n_new = 0 if k is None else k.shape[1]
        if not q.is_cuda:  # host tensors: every block the call reads or writes must exist
            bad = _bad_pages(block_table, k_cache.shape[0], k_cache.shape[1],
                             cache_seqlens + n_new)
            if bool(bad.any()):
                raise ValueError(f"block_table: sequence {int(bad.nonzero()[0])} names a block "
                                 f"outside the cache's {k_cache.shape[0]}")
    out = torch.empty_like(q)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device) if want_lse else None
    det, split_size, schedule = _mode.current()
    if call_schedule is not None:
        schedule = call_schedule

    def head(q, cache_seqlens):  # fwd_kvcache's arguments before the workspace
        return (_dl(q), _dl(k_cache), _dl(v_cache), _dl(out), _opt(lse), _dl(cache_seqlens),
                _opt(cache_batch_idx), _opt(cache_leftpad), _opt(block_table), opts[0])
    tail = (*opts[1:], int(det), split_size, schedule)

    if k is not None or v is not None or rotary_cos is not None or rotary_sin is not None:
        def check_attention(n_new):
            # The caches are the caller's state: the attention's own checks run on the lengths
            # and the q it will see, before the append writes a row.
            # (GPU: not read, unless the index checks are on: set_index_checks)
            after = (cache_seqlens if q.is_cuda and not _mode.get_index_checks()
                     else cache_seqlens + n_new)
            q_seen = (q if rotary_cos is None or not q.is_cuda
                      else torch.empty_like(q, memory_format=torch.contiguous_format))
            _C.check_fwd_kvcache(*head(q_seen, after), None, *tail, 0)

        local = opts[3] >= 0 or opts[4] >= 0  # window_left, window_right (causal: right 0)
        q, cache_seqlens = _kvcache_append(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin,
                                           cache_seqlens, cache_batch_idx,
                                           rotary_interleaved, local, block_table,
                                           before_write=check_attention)
    # A sequence whose cache rows fall outside k_cache (indices are not read back on the
    # GPU) gets NaN rows from the kernels; on the CPU the call raises first.
    _launch(_C.fwd_kvcache, head(q, cache_seqlens), tail, q,
            (2, q_shape, k_cache.shape,
             None if block_table is None else block_table.shape[1], det, split_size, schedule,
             q.get_device()))
    return out, lse


def _check_block_table(block_table, q, k_cache, cache_batch_idx, cache_leftpad):
    if not isinstance(block_table, torch.Tensor) or block_table.dtype != torch.int32:
        raise TypeError("block_table: expected an int32 tensor (batch, max_blocks_per_seq)")
    if block_table.dim() != 2 or block_table.shape[0] != q.shape[0]:
        raise ValueError(f"block_table: expected shape (batch={q.shape[0]}, max_blocks_per_seq), "
                         f"got {tuple(block_table.shape)}")
    if block_table.device != q.device:
        raise ValueError(f"block_table: must be on {q.device}, got {block_table.device}")
    if cache_batch_idx is not None or cache_leftpad is not None:
        raise ValueError("block_table: cannot be combined with cache_batch_idx or cache_leftpad")


def _bad_pages(block_table, num_blocks, page, cache_seqlens):
    """bad[b]: sequence b needs (for its cache_seqlens rows) a block index outside the cache.
    Slots past what a sequence needs may hold anything."""
    need = (cache_seqlens.long() + page - 1) // page
    used = torch.arange(block_table.shape[1], device=block_table.device)[None] < need[:, None]
    return (used & ((block_table < 0) | (block_table >= num_blocks))).any(dim=1)


def _unbind_packed(x, n, dim, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() <= dim or x.shape[dim] != n:
        raise ValueError(f"{name}: expected {n} along dim {dim}, got shape {tuple(x.shape)}")
    return x.unbind(dim)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False, *,
                              dropout_seq_ids=None):
    """flash_attn_func with qkv: (batch, seqlen, 3, nheads, headdim), read in place."""
    q, k, v = _unbind_packed(qkv, 3, 2, "qkv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs,
                           dropout_seq_ids=dropout_seq_ids)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *,
                             dropout_seq_ids=None):
    """flash_attn_func with kv: (batch, seqlen_k, 2, nheads_k, headdim), read in place."""
    k, v = _unbind_packed(kv, 2, 2, "kv")
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                           alibi_slopes, deterministic, return_attn_probs,
                           dropout_seq_ids=dropout_seq_ids)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=(-1, -1),
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False, *, dropout_seq_ids=None):
    """flash_attn_varlen_func with qkv: (total, 3, nheads, headdim)."""
    q, k, v = _unbind_packed(qkv, 3, 1, "qkv")
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen,
                                  dropout_p, softmax_scale, causal, window_size, softcap,
                                  alibi_slopes, deterministic, return_attn_probs,
                                  dropout_seq_ids=dropout_seq_ids)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                    max_seqlen_k, dropout_p=0.0, softmax_scale=None,
                                    causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False,
                                    return_attn_probs=False, *, dropout_seq_ids=None):
    """flash_attn_varlen_func with kv: (total_k, 2, nheads_k, headdim)."""
    k, v = _unbind_packed(kv, 2, 1, "kv")
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                                  max_seqlen_k, dropout_p, softmax_scale, causal, window_size,
                                  softcap, alibi_slopes, deterministic, return_attn_probs,
                                  dropout_seq_ids=dropout_seq_ids)
