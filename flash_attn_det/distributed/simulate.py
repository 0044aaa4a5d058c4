"""Every rank's share of sequence-parallel attention computed in one process, with no process
group: the gathered tensors are the full ones. What the per-rank calls compute is then checked
on a single device (the GPU's key-range and row-offset paths) without several devices."""
from .layout import shard, unshard
from .sequence import _Plan, _opts, forward_over, local_backward, local_forward


def simulate_ranks(q, k, v, dout, world_size, layout="contiguous", cu_seqlens=None,
                   softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                   alibi_slopes=None):
    """(out, lse, dq, dk, dv) of the whole stream, each assembled from what the world_size
    ranks of `layout` compute for their own rows (context_parallel_attn[_varlen]_func's
    per-rank forward and backward, fed the tensors their collectives would gather).
    Padded q/k/v (B, N, H, D), or packed (T, H, D) with cu_seqlens (a list)."""
    cu = None if cu_seqlens is None else [int(x) for x in cu_seqlens]
    opts = _opts(q, softmax_scale, causal, window_size, softcap, alibi_slopes)
    seqlen = None if cu is not None else q.shape[1]
    plans = [_Plan(None, world_size, r, layout, seqlen, cu) for r in range(world_size)]
    sd, ld = plans[0].seq_dim, plans[0].lse_dim
    cut = lambda x, r, dim: shard(x, r, world_size, layout, cu, dim)
    fwd = [local_forward(p, cut(q, p.rank, sd), opts, forward_over(p, k, v, opts)) for p in plans]
    out = unshard([o for o, _ in fwd], layout, cu, sd)
    lse = unshard([l for _, l in fwd], layout, cu, ld)
    grads = [local_backward(p, (q, k, v, out, dout, lse), opts) for p in plans]
    dq, dk, dv = (unshard([g[i] for g in grads], layout, cu, sd) for i in range(3))
    return out, lse, dq, dk, dv
