"""Batch-invariant building blocks for the rest of a model: linear, RMSNorm, log_softmax,
cross_entropy and token log-probabilities, with autograd, on CUDA and CPU tensors.

    from flash_attn_det import blocks
    y = blocks.linear(x, weight, bias)          # like torch.nn.functional.linear
    y = blocks.rms_norm(x, weight, eps)         # like Llama's / Qwen2's RMSNorm
    lp = blocks.log_softmax(logits)             # like torch.log_softmax(logits.float(), -1)
    loss = blocks.cross_entropy(logits, target) # like torch.nn.functional.cross_entropy

Each output row has the same bits whatever else is in the call: one row alone, in a batch
of 64, in a decode step or in a packed training batch. torch's own kernels do not promise
that: cuBLAS picks its matrix-product kernel (split-K among them) by the number of rows,
and torch's row reductions split a row across threads by the number of rows. Here every row
reduction runs through flash_attn_det's own (fixed order per row, _C.row_reduce) and every
matrix product through one pinned algorithm per weight shape (_C.gemm). Elementwise torch
ops are invariant by nature and are used for the rest.

Gradients: dx of every block is per row too, so per-sequence input gradients do not depend
on the batch; weight gradients (summed over rows) are the same bits run to run. See
docs/design.md, "batch-invariant-models".
"""
import torch

from . import _C
from . import interface as _interface
from .interface import _dl

_SUM, _LSE = 0, 2  # (fad_row_op; DOT, 1, is the C API's)
# linear's inference path in C needs torch's allocator through the DLPack exchange API
# (torch >= 2.11), as the attention's (interface._infer)
_linear_infer = _C.linear_infer if _interface._infer is not None else None
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled",
                        lambda: torch.is_autocast_enabled("cuda") or torch.is_autocast_enabled("cpu"))


def _stream(t):
    return torch._C._cuda_getCurrentRawStream(t.get_device()) if t.is_cuda else 0


def _rows(x):
    """x as a 2-D (rows, last dim) view with a unit column stride, copied when it must be:
    on the GPU rows start 16-byte aligned."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if x2.is_cuda and (x2.data_ptr() % 16 or (x2.shape[0] > 1 and
                                              x2.stride(0) * x2.element_size() % 16)):
        x2 = x2.clone(memory_format=torch.contiguous_format)
    return x2


def _gemm(a, b, trans_a, trans_b, bias=None):
    """a' b' (+ bias) of 2-D tensors (the prime: transposed when asked), fresh and contiguous."""
    m = a.shape[1] if trans_a else a.shape[0]
    n = b.shape[0] if trans_b else b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    _C.gemm(_dl(a), _dl(b), _dl(c), None if bias is None else _dl(bias), trans_a, trans_b,
            _stream(a))
    return c


def _row_reduce(op, x2, y2=None):
    out = torch.empty(x2.shape[0], dtype=torch.float32, device=x2.device)
    _C.row_reduce(op, _dl(x2), None if y2 is None else _dl(y2), _dl(out), _stream(x2))
    return out


def _check_same(name, t, ref):
    if t.dtype != ref.dtype:
        raise TypeError(f"{name}: expected dtype {ref.dtype} (the input's), got {t.dtype}")
    if t.device != ref.device:
        raise ValueError(f"{name}: expected device {ref.device} (the input's), got {t.device}")


# ---------------------------------------------------------------------------------------
# linear


def _linear_fwd(x, weight, bias):
    x2 = _rows(x)
    y = _gemm(x2, _rows(weight), 0, 1, None if bias is None else bias.contiguous())
    return y.view(*x.shape[:-1], weight.shape[0])


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _linear_fwd(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy2 = _rows(dy)
        dx = dw = db = None
        if ctx.needs_input_grad[0]:  # per row: the same pinned product as the forward's
            dx = _gemm(dy2, _rows(weight), 0, 0).view(*dy.shape[:-1], weight.shape[1])
        if ctx.needs_input_grad[1]:  # summed over rows: the same bits run to run
            dw = _gemm(dy2, _rows(x), 1, 0)
        if ctx.has_bias and ctx.needs_input_grad[2]:
            db = dy2.sum(0)
        return dx, dw, db


def linear(x, weight, bias=None):
    """torch.nn.functional.linear(x, weight, bias) with batch-invariant rows: x (..., in),
    weight (out, in), bias (out,) or None, one dtype (float16, bfloat16 or float32; under
    autocast, the autocast dtype). fp32 accumulation."""
    if _linear_infer is not None and not _any_autocast():
        # inference with no copies to make: the whole call in C (NotImplemented otherwise)
        y = _linear_infer(x, weight, bias)
        if y is not NotImplemented:
            return y
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError("weight: expected a 2-D (out_features, in_features) tensor")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x: last dim must be in_features={weight.shape[1]}, got shape "
                         f"{tuple(x.shape)}")
    if torch.is_autocast_enabled(x.device.type):  # what autocast does for F.linear
        dt = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dt), weight.to(dt)
        bias = None if bias is None else bias.to(dt)
    _check_same("weight", weight, x)
    if bias is not None:
        _check_same("bias", bias, x)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias: expected shape ({weight.shape[0]},), got {tuple(bias.shape)}")
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                    (bias is not None and bias.requires_grad)):
        return _Linear.apply(x, weight, bias)
    return _linear_fwd(x, weight, bias)


# ---------------------------------------------------------------------------------------
# row reductions with autograd (each backward elementwise or per row)


def _rms_fwd(x2, weight, eps):
    y = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
    scale = torch.empty(x2.shape[0], dtype=torch.float32, device=x2.device)
    _C.rms_norm(_dl(x2), None if weight is None else _dl(weight), _dl(y), _dl(scale), eps,
                _stream(x2))
    return y, scale


class _RMSNorm(torch.autograd.Function):
    """y = w * round(x * s), s = rsqrt(mean(x^2) + eps): the fused kernel forward (the same
    bits with and without autograd); the backward one fused kernel too (transformers'
    graph op by op: dx per row; dw from fixed blocks of rows summed in order)."""

    @staticmethod
    def forward(ctx, x2, weight, eps):
        y, scale = _rms_fwd(x2, weight, eps)
        ctx.save_for_backward(x2, weight, scale)
        return y

    @staticmethod
    def backward(ctx, dy):
        x2, weight, scale = ctx.saved_tensors
        dy2 = _rows(dy)
        dx = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
        part = None
        if weight is not None and ctx.needs_input_grad[1]:
            blocks = -(-x2.shape[0] // _C.RMSNORM_BWD_ROWS)
            part = torch.empty((blocks, x2.shape[1]), dtype=torch.float32, device=x2.device)
        _C.rms_norm_bwd(_dl(x2), _dl(dy2), None if weight is None else _dl(weight), _dl(scale),
                        _dl(dx), None if part is None else _dl(part), _stream(x2))
        dw = None if part is None else part.sum(0).to(weight.dtype)
        return dx, dw, None


def _lse_minus_pick(x2, target):
    """lse(x[r]) - x[r, target[r]] in fp32 per row (target None or < 0: lse alone)."""
    lse = _row_reduce(_LSE, x2)
    if target is None:
        return lse, lse
    picked = x2.gather(1, target.clamp(min=0)[:, None]).squeeze(1).float()
    return lse, lse - torch.where(target >= 0, picked, torch.zeros((), device=x2.device))


class _LSEPick(torch.autograd.Function):
    """lse(x[r]) - x[r, target[r]]: cross-entropy of a row (target None: log-sum-exp). The
    backward is one elementwise kernel: g * softmax(x) - g at the target."""

    @staticmethod
    def forward(ctx, x2, target):
        lse, out = _lse_minus_pick(x2, target)
        ctx.save_for_backward(x2, lse, target)
        return out

    @staticmethod
    def backward(ctx, g):
        x2, lse, target = ctx.saved_tensors
        dx = torch.empty(x2.shape, dtype=x2.dtype, device=x2.device)
        _C.xent_bwd(_dl(x2), _dl(lse), _dl(g.float().contiguous()),
                    None if target is None else _dl(target), _dl(dx), _stream(x2))
        return dx, None


def _lse_pick(x, target):
    x2 = _rows(x)
    t = None if target is None else target.reshape(-1).to(torch.int64).contiguous()
    out = _LSEPick.apply(x2, t) if _grad_on(x) else _lse_minus_pick(x2, t)[1]
    return out.view(x.shape[:-1])


class _LogSoftmax(torch.autograd.Function):
    """x - lse(x) per row, fp32 out; dx = dy - exp(y) * sum(dy) per row."""

    @staticmethod
    def forward(ctx, x2):
        y = x2.float() - _row_reduce(_LSE, x2)[:, None]
        ctx.save_for_backward(y)
        ctx.in_dtype = x2.dtype
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dy2 = _rows(dy.float())
        return (dy2 - torch.exp(y) * _row_reduce(_SUM, dy2)[:, None]).to(ctx.in_dtype)


def _grad_on(*ts):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in ts)


# ---------------------------------------------------------------------------------------
# RMSNorm, log_softmax, cross_entropy


def rms_norm(x, weight, eps=1e-6):
    """Llama's / Qwen2's RMSNorm with batch-invariant rows:
    weight * (x.float() * rsqrt(mean(x.float()**2, -1) + eps)).to(x.dtype)
    (the same roundings as transformers' LlamaRMSNorm; weight None: no scale)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[-1] == 0:
        raise ValueError("x: expected a tensor with a non-empty last dim")
    if weight is not None and (weight.dim() != 1 or weight.shape[0] != x.shape[-1]):
        raise ValueError(f"weight: expected shape ({x.shape[-1]},), got {tuple(weight.shape)}")
    if weight is not None and weight.dtype != x.dtype:  # transformers' type promotion
        h = rms_norm(x, None, eps)
        return weight * h
    x2 = _rows(x)
    y = (_RMSNorm.apply(x2, weight, float(eps)) if _grad_on(x, weight)
         else _rms_fwd(x2, weight, float(eps))[0])
    return y.view(x.shape)


def log_softmax(x, dim=-1):
    """torch.log_softmax(x.float(), dim) with batch-invariant rows (fp32 out)."""
    if dim not in (-1, x.dim() - 1):
        x = x.movedim(dim, -1)
    x2 = _rows(x)
    y = _LogSoftmax.apply(x2) if _grad_on(x) else x2.float() - _row_reduce(_LSE, x2)[:, None]
    y = y.view(*x.shape)
    return y if dim in (-1, x.dim() - 1) else y.movedim(-1, dim)


def logsumexp(x):
    """torch.logsumexp(x.float(), -1) with batch-invariant rows."""
    return _lse_pick(x, None)


def token_logprobs(logits, tokens):
    """log_softmax(logits.float())[..., token]: each position's log-probability of its
    token, logits (..., vocab), tokens (...) int. Batch-invariant per position."""
    if tokens.shape != logits.shape[:-1]:
        raise ValueError(f"tokens: expected shape {tuple(logits.shape[:-1])}, got "
                         f"{tuple(tokens.shape)}")
    if ((tokens < 0) | (tokens >= logits.shape[-1])).any():
        raise ValueError(f"tokens: expected ids in [0, {logits.shape[-1]})")
    return -_lse_pick(logits, tokens)


def cross_entropy(logits, target, ignore_index=-100, reduction="mean"):
    """torch.nn.functional.cross_entropy(logits.float(), target) over the last dim with
    batch-invariant rows: logits (..., vocab) or (N, vocab), target (...) int.
    reduction "none" gives each row's loss; "sum" keeps each row's gradient independent of
    the batch; "mean" divides by the count of rows not ignored (as torch does)."""
    if reduction not in ("none", "sum", "mean"):
        raise ValueError(f"reduction: expected 'none', 'sum' or 'mean', got {reduction!r}")
    if target.shape != logits.shape[:-1]:
        raise ValueError(f"target: expected shape {tuple(logits.shape[:-1])}, got "
                         f"{tuple(target.shape)}")
    keep = target != ignore_index
    loss = _lse_pick(logits, torch.where(keep, target, torch.full_like(target, -1)))
    loss = torch.where(keep, loss, torch.zeros((), device=logits.device))
    if reduction == "none":
        return loss
    total = loss.sum()
    return total if reduction == "sum" else total / keep.sum()
