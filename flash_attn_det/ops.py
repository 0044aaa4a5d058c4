"""torch.library registration of the entry points, so that torch.compile(fullgraph=True)
traces a model that calls them without a graph break: custom ops with fake (meta)
implementations and registered autograd. Eager calls skip this layer (custom-op dispatch
costs host time at decode); interface.py routes through it only while compiling.
Dropout comes in as dropout_p alone: the forward ops draw their (seed, offset) when they run,
exactly as an eager call draws (interface._dropout_begin: torch's generator read on the host,
or under CUDA graph capture a captured device draw), so compiled and eager code share masks,
whichever frames a model's graph breaks or recompile limits leave eager; the ops return the
pair (int64 (2,), on q's device) for the backward ops, which take it as an input. The forward
ops carry torch.Tag.nondeterministic_seeded, so torch's partitioner, where it recomputes one
in the backward (activation checkpointing), gives it the forward's generator state (else the
rerun would draw another mask), and each call gets its own empty (0,) tensor,
dropout_nonce: AOTAutograd's CSE folds calls with equal arguments into one unless they are
torch's own random ops, and aten.empty, which it never folds, keeps two calls with the same
q, k, v (MC dropout, say) two draws.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import interface as _I

_LIB = "flash_attn_det"


_SEEDED = (torch.Tag.nondeterministic_seeded,)


def _pair(q, seed, offset):
    """(seed, offset) host ints as the int64 (2,) pair on q's device, copied without a host
    sync (a pinned staging tensor); a seed of 2**63 or more wraps to the negative int64 of
    the same bits, which the kernels read back as uint64 (fad_seq.h fad_dropout_of)."""
    t = torch.tensor([seed - (seed >> 63 << 64), offset], dtype=torch.int64)
    return t if q.device.type == "cpu" else t.pin_memory().to(q.device, non_blocking=True)


def _empty_pair(q):
    return q.new_empty((2,), dtype=torch.int64)


def _drawn(q, dropout_p):
    """(dropout, commit, pair) for a forward op run with dropout_p: the draw of an eager call
    (interface._dropout_begin), its pair for the backward op (a (2,) placeholder that no one
    reads without dropout)."""
    dropout, commit = _I._dropout_begin(dropout_p, q)
    if dropout is None:
        return None, commit, _empty_pair(q)
    if len(dropout) > 4:  # (under CUDA graph capture: the captured device draw)
        return dropout, commit, dropout[4]
    return dropout, commit, _pair(q, dropout[1], dropout[2])


def _dropout(dropout_p, seed_offset):
    """The backward ops' dropout arguments as interface's tuple (None: no dropout)."""
    return None if dropout_p == 0.0 else (dropout_p, 0, 0, None, seed_offset)


@torch.library.custom_op(f"{_LIB}::fwd", mutates_args=(), tags=_SEEDED)
def fwd(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
        window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
        dropout_p: float = 0.0,
        dropout_nonce: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    dropout, commit, pair = _drawn(q, dropout_p)
    out, lse = _I._fwd(q, k, v, softmax_scale, causal, (window_left, window_right), softcap,
                       alibi_slopes, dropout=dropout)
    commit()
    return out, lse, pair


@fwd.register_fake
def _(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
      dropout_p=0.0, dropout_nonce=None):
    B, Sq, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((B, H, Sq), dtype=torch.float32), _empty_pair(q)


@torch.library.custom_op(f"{_LIB}::fwd_varlen", mutates_args=(), tags=_SEEDED)
def fwd_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor,
               max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
               window_left: int, window_right: int, softcap: float,
               alibi_slopes: Optional[Tensor], seqused_k: Optional[Tensor],
               block_table: Optional[Tensor] = None, dropout_p: float = 0.0,
               dropout_nonce: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    dropout, commit, pair = _drawn(q, dropout_p)
    out, lse = _I._fwd_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              softmax_scale, causal, (window_left, window_right), softcap,
                              alibi_slopes, seqused_k, block_table, dropout=dropout)
    commit()
    return out, lse, pair


@fwd_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, alibi_slopes, seqused_k, block_table=None,
      dropout_p=0.0, dropout_nonce=None):
    Tq, H, _ = q.shape
    return torch.empty_like(q, memory_format=torch.contiguous_format), \
        q.new_empty((H, Tq), dtype=torch.float32), _empty_pair(q)


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
                alibi_slopes: Optional[Tensor], num_splits: int = 0) -> Tuple[Tensor, Tensor]:
    # k/v (new rows) are written into k_cache/v_cache in place: the mutation torch must know of
    return _I._fwd_kvcache(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens,
                           cache_batch_idx, cache_leftpad, block_table, softmax_scale, causal,
                           (window_left, window_right), softcap, rotary_interleaved, alibi_slopes,
                           num_splits=num_splits)


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


def _setup(ctx, inputs, output):  # (q, k, v, out, lse, pair)
    ctx.save_for_backward(*inputs[:3], *output)
    ctx.inputs = inputs


def _fwd_backward(ctx, dout, _dlse, _dpair):  # (the forward's dropout_p and drawn pair)
    *saved, pair = ctx.saved_tensors
    dq, dk, dv = bwd(dout, *saved, *ctx.inputs[3:-1], pair)  # (inputs[-1]: the nonce)
    return (dq, dk, dv) + (None,) * (len(ctx.inputs) - 3)


def _fwd_varlen_backward(ctx, dout, _dlse, _dpair):
    (cu_q, cu_k, max_q, max_k, scale, causal, left, right, softcap, alibi,
     used, table, dropout_p, _nonce) = ctx.inputs[3:]
    if table is not None:
        raise NotImplementedError("block_table: paged KV has no backward (as in flash_attn)")
    *saved, pair = ctx.saved_tensors
    dq, dk, dv = bwd_varlen(dout, *saved, cu_q, cu_k, max_q, max_k, scale, causal,
                            left, right, softcap, alibi, used, dropout_p, pair)
    return (dq, dk, dv) + (None,) * (len(ctx.inputs) - 3)


fwd.register_autograd(_fwd_backward, setup_context=_setup)
fwd_varlen.register_autograd(_fwd_varlen_backward, setup_context=_setup)
