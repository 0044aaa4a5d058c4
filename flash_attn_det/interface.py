"""The flash_attn-compatible entry points (forward)."""
import torch
from torch.utils.dlpack import to_dlpack

from . import _C
from .mode import _state

# flash_attn's rule for operands: last dim contiguous. The kernels also move
# 16-byte chunks, so rows must start 16-byte aligned; anything else is copied.
_ALIGN = 16


def _operand(x, name):
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() and x.stride(-1) != 1 and x.shape[-1] > 1:
        return x.contiguous()
    if x.is_cuda and (x.data_ptr() % _ALIGN or
                      any(s % 8 for s, n in zip(x.stride()[:-1], x.shape[:-1]) if n > 1)):
        return x.clone(memory_format=torch.contiguous_format)  # contiguous() may return x itself
    return x


def _window(window_size, causal):
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size: expected a pair of ints, got {window_size!r}") from None
    if left < -1 or right < -1:
        raise ValueError(f"window_size: entries must be -1 (unbounded) or >= 0, got {window_size!r}")
    return left, 0 if causal else right


def _current_stream(device):
    return torch._C._cuda_getCurrentRawStream(device.index if device.index is not None
                                              else torch.cuda.current_device())


def _fwd(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """Runs the forward kernel; returns (out, softmax_lse)."""
    q, k, v = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    if q.dim() != 4:
        raise ValueError(f"q: expected 4 dims (batch, seqlen, nheads, headdim), got {q.dim()}")
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise NotImplementedError(
            "flash_attn_det: the backward pass is not implemented yet; call the forward under "
            "torch.no_grad() / torch.inference_mode() or with inputs that do not require grad")
    B, Sq, H, D = q.shape
    if softmax_scale is None:
        softmax_scale = D ** -0.5
    elif not softmax_scale > 0 or softmax_scale == float("inf"):
        # (the C API reads 0 as "default"; from Python an explicit 0 is a mistake)
        raise ValueError(f"softmax_scale: must be finite and > 0, got {softmax_scale!r}")
    left, right = _window(window_size, causal)
    if alibi_slopes is not None:
        alibi_slopes = _operand(alibi_slopes, "alibi_slopes")
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device)
    det, split_size, schedule = _state["enabled"], _state["split_size"], _state["schedule"]
    workspace, stream = None, 0
    if q.is_cuda:
        Sk, Hk = (k.shape[1], k.shape[2]) if k.dim() == 4 else (0, 1)
        nbytes = _C.fwd_workspace_size(B, Sq, Sk, H, Hk, D, det, split_size, schedule,
                                       q.device.index)
        if nbytes:
            workspace = to_dlpack(torch.empty(nbytes, dtype=torch.uint8, device=q.device))
        stream = _current_stream(q.device)
    _C.fwd(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out), to_dlpack(lse),
           None if alibi_slopes is None else to_dlpack(alibi_slopes), workspace,
           float(softmax_scale), float(softcap), left, right, int(bool(causal)), int(det),
           split_size, schedule, stream)
    return out, lse


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """Attention with flash_attn's semantics; bit-reproducible in deterministic mode.

    q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim),
    nheads % nheads_k == 0 (GQA/MQA, no K/V expansion). fp16 or bf16; headdim a
    multiple of 8 up to 256. Causal masks are aligned to the bottom-right corner
    (row i sees keys j <= i + seqlen_k - seqlen_q). window_size=(left, right):
    row i sees keys in [i + Sk - Sq - left, i + Sk - Sq + right] (-1 = unbounded).
    softcap > 0: scores become softcap * tanh(scores / softcap). alibi_slopes:
    fp32 (nheads,) or (batch, nheads); adds -slope * |i + Sk - Sq - j|.
    deterministic: accepted for flash_attn compatibility (it concerns the
    backward pass there); the forward's determinism is set_deterministic_mode's.

    Returns out (batch, seqlen_q, nheads, headdim), or (out, softmax_lse, None)
    with softmax_lse (batch, nheads, seqlen_q) fp32 when return_attn_probs.
    Rows that see no key get out 0 and lse -inf.
    """
    if dropout_p:
        raise NotImplementedError("dropout_p: dropout is not implemented by flash_attn_det yet; "
                                  "pass dropout_p=0.0")
    out, lse = _fwd(q, k, v, softmax_scale, causal, window_size, softcap, alibi_slopes)
    return (out, lse, None) if return_attn_probs else out
