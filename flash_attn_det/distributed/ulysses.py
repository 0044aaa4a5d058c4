"""Head-parallel (Ulysses) attention whose every bit equals one device's.

Inputs are sharded along the sequence (layout.py) as for context_parallel_attn_func. An
all-to-all turns each rank's rows of every head into every row of its 1/world_size of the
heads; each rank then runs the ordinary single-device call on whole sequences, and a second
all-to-all brings the outputs back to sequence shards. Heads never mix in attention, and a KV
head's query heads stay on one rank (rank r holds query heads [r*H/P, (r+1)*H/P) and KV heads
[r*Hkv/P, (r+1)*Hkv/P), the same groups), so the bits, gradients included (the all-to-alls
only move them), are one device's. Needs nheads and nheads_k divisible by world_size.
"""
import torch

from ..interface import flash_attn_func, flash_attn_varlen_func
from .comm import all_to_all
from .layout import place
from .sequence import _make_plan


def _sizes(plan):
    return [plan.local_rows(r) for r in range(plan.world)]


def _seq_to_heads(x, plan):
    """This rank's rows of every head (heads on dim -2) -> every row of this rank's heads."""
    P, sd = plan.world, plan.seq_dim
    xs = x.movedim(sd, 0)
    n, H = xs.shape[0], xs.shape[-2]
    xs = xs.unflatten(-2, (P, H // P)).movedim(-3, 0)   # (P, n, ..., H/P, D): rank p's heads
    recv = all_to_all(xs.flatten(0, 1), [n] * P, _sizes(plan), plan.group)
    full = place(list(recv.split(_sizes(plan))), plan.all_ranges, plan.total, 0)
    return full.movedim(0, sd)


def _heads_to_seq(y, plan):
    """The inverse of _seq_to_heads."""
    P, sd = plan.world, plan.seq_dim
    ys = y.movedim(sd, 0)
    send = torch.cat([ys.narrow(0, s, e - s) for r in plan.all_ranges for s, e in r])
    n = plan.local_rows()
    recv = all_to_all(send, _sizes(plan), [n] * P, plan.group)     # (P * n, ..., H/P, D)
    return recv.unflatten(0, (P, n)).movedim(0, -3).flatten(-3, -2).movedim(0, sd)


class _Exchange(torch.autograd.Function):
    """_seq_to_heads (to_heads) or _heads_to_seq under autograd: the gradient goes back
    through the other one (both only move bits)."""

    @staticmethod
    def forward(ctx, x, plan, to_heads):
        ctx.plan, ctx.to_heads = plan, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(x, plan)

    @staticmethod
    def backward(ctx, g):
        return (_heads_to_seq if ctx.to_heads else _seq_to_heads)(g, ctx.plan), None, None


def _check_heads(plan, q, k):
    H, Hk = q.shape[-2], k.shape[-2]
    if H % plan.world or Hk % plan.world:
        raise ValueError(f"q, k: ulysses needs nheads ({H}) and nheads_k ({Hk}) divisible by "
                         f"the world size ({plan.world}); use context_parallel_attn_func")


def _my_slopes(alibi_slopes, plan, H):
    if alibi_slopes is None:
        return None
    hp = H // plan.world
    return alibi_slopes.narrow(-1, plan.rank * hp, hp)


def _lse_to_seq(lse, plan):
    """softmax_lse (B, H/P, N) or (H/P, T) of the local call -> this rank's rows of every
    head, laid out as q's lse ((B, H, rows) or (H, rows))."""
    x = lse.movedim(-2, -1).unsqueeze(-1)   # heads on dim -2, like q
    return _heads_to_seq(x, plan).squeeze(-1).movedim(-1, -2)


def _run(plan, q, k, v, alibi_slopes, return_attn_probs, call):
    _check_heads(plan, q, k)
    qh, kh, vh = (_Exchange.apply(t, plan, True) for t in (q, k, v))
    res = call(qh, kh, vh, _my_slopes(alibi_slopes, plan, q.shape[-2]))
    if not return_attn_probs:
        return _Exchange.apply(res, plan, False)
    return _Exchange.apply(res[0], plan, False), _lse_to_seq(res[1], plan), None


def ulysses_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                      window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                      return_attn_probs=False, *, group=None, layout="contiguous"):
    """context_parallel_attn_func's call and result (sequence shards in and out, one device's
    bits, autograd), computed head-parallel: two all-to-alls each way instead of all-gathers."""
    plan = _make_plan(q, k, v, group, layout, None, dropout_p)
    return _run(plan, q, k, v, alibi_slopes, return_attn_probs, lambda qh, kh, vh, sl:
                flash_attn_func(qh, kh, vh, 0.0, softmax_scale, causal, window_size, softcap, sl,
                                return_attn_probs=return_attn_probs))


def ulysses_attn_varlen_func(q, k, v, cu_seqlens, dropout_p=0.0, softmax_scale=None,
                             causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False, *, group=None,
                             layout="contiguous"):
    """context_parallel_attn_varlen_func's call and result, computed head-parallel."""
    plan = _make_plan(q, k, v, group, layout, cu_seqlens, dropout_p)
    cu = torch.tensor(plan.cu_seqlens, dtype=torch.int32, device=q.device)
    longest = max([b - a for a, b in zip(plan.cu_seqlens, plan.cu_seqlens[1:])], default=0)
    return _run(plan, q, k, v, alibi_slopes, return_attn_probs, lambda qh, kh, vh, sl:
                flash_attn_varlen_func(qh, kh, vh, cu, cu, longest, longest, 0.0, softmax_scale,
                                       causal, window_size, softcap, sl,
                                       return_attn_probs=return_attn_probs))
