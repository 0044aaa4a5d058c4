"""torch.library registration of the entry points, so that torch.compile(fullgraph=True)
traces a model that calls them without a graph break: custom ops with fake (meta)
implementations and registered autograd. Eager calls skip this layer (custom-op dispatch
costs host time at decode); interface.py routes through it only while compiling.
Dropout comes in as dropout_p and the (seed, offset) pair as an int64 (2,) tensor drawn by a
traced torch RNG op (interface._dropout_begin), so the compiled code draws anew per call.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import interface as _I

_LIB = "flash_attn_det"


@torch.library.custom_op(f"{_LIB}::fwd", mutates_args=())
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, alibi_slopes: Optional[Tensor], dropout_p: float = 0.0,
        dropout_seed_offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _I._fwd(q, k, v, softmax_scale, causal, (window_left, window_right), softcap,
                   alibi_slopes, dropout=_dropout(dropout_p, dropout_seed_offset))


def _dropout(dropout_p, seed_offset):
    """The ops' dropout arguments as interface's tuple (None: no dropout)."""
    return None if dropout_p == 0.0 else (dropout_p, 0, 0, None, seed_offset)


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
      dropout_p=0.0, dropout_seed_offset=None):
    B, Sq, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, H, Sq), dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::fwd_varlen", mutates_args=())
def fwd_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], seqused_k: Optional[Tensor],
               block_table: Optional[Tensor] = None, dropout_p: float = 0.0,
               dropout_seed_offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    return _I._fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                          softmax_scale, causal, (window_left, window_right), softcap,
                          alibi_slopes, seqused_k, block_table,
                          dropout=_dropout(dropout_p, dropout_seed_offset))


@fwd_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, alibi_slopes, seqused_k, block_table=None,
      dropout_p=0.0, dropout_seed_offset=None):
    Tq, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((H, Tq), dtype=torch.float32)


@torch.library.custom_op(f"{_LIB}::bwd", mutates_args=())
def bwd(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
        softmax_scale: float, causal: bool, window_left: int, window_right: int, softcap: float,
        alibi_slopes: Optional[Tensor], dropout_p: float = 0.0,
        dropout_seed_offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return _I._backward(dout, q, k, v, out, lse, softmax_scale, causal,
                        (window_left, window_right), softcap, alibi_slopes,
                        dropout=_dropout(dropout_p, dropout_seed_offset))


@torch.library.custom_op(f"{_LIB}::bwd_varlen", mutates_args=())
def bwd_varlen(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
               cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int,
               softmax_scale: float, causal: bool, window_left: int, window_right: int,
               softcap: float, alibi_slopes: Optional[Tensor], seqused_k: Optional[Tensor],
               dropout_p: float = 0.0,
               dropout_seed_offset: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    return _I._backward(dout, q, k, v, out, lse, softmax_scale, causal,
                        (window_left, window_right), softcap, alibi_slopes,
                        varlen=(cu_seqlens_q, cu_seqlens_k, seqused_k, max_seqlen_q,
                                max_seqlen_k), dropout=_dropout(dropout_p, dropout_seed_offset))


@torch.library.custom_op(f"{_LIB}::fwd_kvcache", mutates_args=("k_cache", "v_cache"))
def fwd_kvcache(q: Tensor, k_cache: Tensor, v_cache: Tensor, k: Optional[Tensor],
                v: Optional[Tensor], rotary_cos: Optional[Tensor], rotary_sin: Optional[Tensor],
                cache_seqlens: Tensor, cache_batch_idx: Optional[Tensor],
                cache_leftpad: Optional[Tensor], block_table: Optional[Tensor],
                softmax_scale: float, causal: bool, window_left: int, window_right: int,
                softcap: float, rotary_interleaved: bool,
                alibi_slopes: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    # k/v (new rows) are written into k_cache/v_cache in place: the mutation torch must know of
    return _I._fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                           cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                           (window_left, window_right), softcap, rotary_interleaved, alibi_slopes)


@fwd_kvcache.register_fake
def _(q, k_cache, v_cache, *rest):
    B, Sq, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, H, Sq), dtype=torch.float32)


def _grads_like(q, k, v):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (q, k, v))


@bwd.register_fake
def _(dout, q, k, v, *rest):
    return _grads_like(q, k, v)


@bwd_varlen.register_fake
def _(dout, q, k, v, *rest):
    return _grads_like(q, k, v)


def _setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs[:3], *output)
    ctx.inputs = inputs


def _fwd_backward(ctx, dout, _dlse):  # (the same dropout_p and pair as the forward)
    dq, dk, dv = bwd(dout, *ctx.saved_tensors, *ctx.inputs[3:])
    return (dq, dk, dv) + (None,) * (len(ctx.inputs) - 3)


def _fwd_varlen_backward(ctx, dout, _dlse):
    (cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, alibi,
     used, table, dropout_p, pair) = ctx.inputs[3:]
    if table is not None:
        raise NotImplementedError("block_table: paged KV has no backward (as in flash_attn)")
    dq, dk, dv = bwd_varlen(dout, *ctx.saved_tensors, cu_q, cu_k, max_q, max_k, scale, causal,
                            left, right, softcap, alibi, used, dropout_p, pair)
    return (dq, dk, dv) + (None,) * (len(ctx.inputs) - 3)


fwd.register_autograd(_fwd_backward, setup_context=_setup)
fwd_varlen.register_autograd(_fwd_varlen_backward, setup_context=_setup)
