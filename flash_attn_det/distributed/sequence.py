"""Sequence-parallel (context-parallel) attention whose every bit equals one device's.

Inputs are sharded along the sequence (layout.py). The forward all-gathers K/V and runs each
rank's own query rows against the keys they see, at their absolute positions; the backward
all-gathers Q, O, dO and the lse, and each rank computes dQ of its own rows and dK/dV of its
own keys with the library's ordinary backward. No floating-point value is ever reduced across
ranks, so the results do not depend on how many ranks there are (deterministic mode).

Why the bits are equal (docs/design.md, "split-plan"): a row's forward bits depend only on its q, the
keys it sees and their absolute positions. Every call below passes keys starting at a key tile
and split boundary of the full call (key 0), so the split plan and the key tiles are the full
call's. Which keys a row sees is set by the bottom-right aligned window
  row i' of a call with Sq rows, Sk keys sees keys j' in [i' + Sk - Sq - left, i' + Sk - Sq + right]
so a call on rows [qs, qe) and keys [ks, ke) of a sequence (positions in the sequence) sees
what the full call sees when its window is the full call's moved by delta = qe - ke:
left - delta, right + delta (-1, unbounded, stays -1); _call_window. ALiBi's distance uses the
same diagonal, so with ALiBi the calls keep delta = 0 instead (rows or keys are added; the
extra results are thrown away).
The backward's orders (docs/design.md, "backward-order"): dQ of a row is summed over key tiles aligned to key 0
(so calls for dQ pass keys from 0); dK/dV of a key over the group's query heads, then row tiles
aligned to row 0 (so calls for dK/dV pass rows from a multiple of _ROW_ALIGN; rows before the
first one that sees the key only add exact zeros, which the full call skips or adds alike).
The CPU backward sums one row at a time in row order, which any row start keeps.

Cost: the dQ call and the dK/dV call each ask the backward for their part only (_backward's
part: the dQ and dK/dV passes share only the row sums, so a part has the bits of the whole),
so a rank's backward does about 1/world of one device's work, plus the row sums of the rows
its dK/dV call reads.
"""
import torch

from .. import interface as _I
from .comm import gather_ints, gather_rows, group_info
from .layout import LAYOUTS, all_shard_ranges, pieces

# A multiple of every backward kernel's row tile (kStepM <= 64 rows, 16-row MMA k-steps; the
# CPU has none): where dK/dV calls start their rows.
_ROW_ALIGN = 128


class _Plan:
    """Who holds which rows, known alike on every rank: the process group, the stream's
    sequences, every rank's ranges (layout.py) and this rank's pieces."""

    def __init__(self, group, world, rank, layout, seqlen, cu_seqlens):
        self.group, self.world, self.rank = group, world, rank
        self.seqlen, self.cu_seqlens = seqlen, cu_seqlens
        self.packed = cu_seqlens is not None
        self.total = cu_seqlens[-1] if self.packed else seqlen
        self.all_ranges = all_shard_ranges(world, layout, seqlen, cu_seqlens)
        self.pieces = self.pieces_of(rank)
        self.seq_dim = 0 if self.packed else 1      # of q, k, v, out (packed: (T, H, D))
        self.lse_dim = 1 if self.packed else 2      # of softmax_lse (packed: (H, T))

    def pieces_of(self, rank):
        return pieces(self.all_ranges[rank], self.seqlen, self.cu_seqlens)

    def seq_len(self, b):
        return self.cu_seqlens[b + 1] - self.cu_seqlens[b] if self.packed else self.seqlen

    def local_rows(self, rank=None):
        return sum(e - s for s, e in self.all_ranges[self.rank if rank is None else rank])


def _call_window(qs, qe, ks, ke, left, right):
    """The window of a call on rows [qs, qe) and keys [ks, ke) that shows each row the keys
    the full call's window (left, right) shows it (module docstring)."""
    delta = qe - ke
    return (left - delta if left >= 0 else -1), (right + delta if right >= 0 else -1)


def _row_call(s, e, L, left, right, alibi):
    """Rows [s, e) of a sequence of L: (qe, ke) of the call that gives them their forward and
    dQ: keys [0, ke), ke the end of what row e-1 sees; rows [s, qe), qe = e unless ALiBi
    needs delta = 0."""
    ke = L if right < 0 else min(L, e + right)
    return (ke if alibi else e), ke


def _key_call(s, e, L, left, right, alibi):
    """Keys [s, e) of a sequence of L: (qs, qe, ke) of the call that gives them dK/dV: rows
    [qs, qe), every row that sees one of them, qs aligned down to _ROW_ALIGN; keys [s, ke),
    ke = e unless ALiBi needs delta = 0."""
    qs = 0 if right < 0 else max(0, s - right)
    qe = L if left < 0 else min(L, e + left)
    return qs // _ROW_ALIGN * _ROW_ALIGN, qe, (qe if alibi else e)


def _rows(x, piece, s, e, packed, dim):
    """Rows [s, e) (positions in piece's sequence) of a tensor holding the whole stream, as a
    padded batch (packed: a batch of one)."""
    _, b, start, _, _ = piece
    if packed:
        return x.narrow(dim, start + s, e - s).unsqueeze(0)
    return x.narrow(dim, s, e - s)


def _slopes(alibi_slopes, piece, packed):
    """ALiBi slopes of piece's sequence: (B, H) slopes of a packed batch are per sequence."""
    if alibi_slopes is None or not packed or alibi_slopes.dim() == 1:
        return alibi_slopes
    return alibi_slopes[piece[1]:piece[1] + 1]


def _scatter(dst, piece, n, part, packed, dim):
    """Writes a piece's result (a padded batch, n rows) into this rank's local tensor."""
    off = piece[0]
    if packed:
        part = part.squeeze(0)
    dst.narrow(dim, off, n).copy_(part.narrow(dim, 0, n))


def local_forward(plan, q, opts, attend, want_lse=True):
    """This rank's out (and lse): one forward call per piece (a range of one sequence) of its
    q rows. attend(qp, piece, ke, window, slopes, want_lse) -> (out, lse) runs rows qp of the
    piece against keys [0, ke) of its sequence under `window` (forward_over gives the one for
    gathered k/v). opts: (softmax_scale, left, right, softcap, alibi)."""
    _, left, right, _, alibi = opts
    packed, sd = plan.packed, plan.seq_dim
    out = torch.empty_like(q)
    lse = None
    if want_lse:
        shape = (q.shape[1], q.shape[0]) if packed else (q.shape[0], q.shape[2], q.shape[1])
        lse = torch.empty(shape, dtype=torch.float32, device=q.device)
    for piece in plan.pieces:
        off, b, start, s, e = piece
        qe, ke = _row_call(s, e, plan.seq_len(b), left, right, alibi is not None)
        qp = q.narrow(sd, off, e - s)
        qp = qp.unsqueeze(0) if packed else qp
        if qe > e:  # (ALiBi) rows the call needs for its alignment; their results are dropped
            shape = list(qp.shape)
            shape[1] = qe - e
            qp = torch.cat([qp, qp.new_zeros(shape)], 1)
        o, l = attend(qp, piece, ke, _call_window(s, qe, 0, ke, left, right),
                      _slopes(alibi, piece, packed), want_lse)
        _scatter(out, piece, e - s, o, packed, sd)
        if want_lse:
            _scatter(lse, piece, e - s, l, packed, plan.lse_dim)
    return out, lse


def forward_over(plan, k_full, v_full, opts):
    """local_forward's attend for the gathered k/v of the whole stream."""
    scale, _, _, softcap, _ = opts
    packed, sd = plan.packed, plan.seq_dim
    return lambda qp, piece, ke, window, slopes, want_lse: _I._fwd(
        qp, _rows(k_full, piece, 0, ke, packed, sd), _rows(v_full, piece, 0, ke, packed, sd),
        scale, False, window, softcap, slopes, want_lse=want_lse)


def local_backward(plan, full, opts):
    """This rank's dq, dk, dv from the gathered tensors full = (q, k, v, out, dout, lse) of
    the whole stream: per piece, one backward call for the dQ of its rows and one for the
    dK/dV of its keys (module docstring)."""
    scale, left, right, softcap, alibi = opts
    q, k, v, out, dout, lse = full
    packed, sd, ld = plan.packed, plan.seq_dim, plan.lse_dim
    n = plan.local_rows()

    def local(x):
        shape = list(x.shape)
        shape[sd] = n
        return x.new_zeros(shape)

    dq, dk, dv = local(q), local(k), local(v)

    def grads(piece, qs, qe, ks, ke, part):
        """_backward's part ("dq" or "dkdv") on rows [qs, qe) and keys [ks, ke) of piece's
        sequence."""
        rows = lambda x: _rows(x, piece, qs, qe, packed, sd)
        keys = lambda x: _rows(x, piece, ks, ke, packed, sd)
        return _I._backward(rows(dout), rows(q), keys(k), keys(v), rows(out),
                            _rows(lse, piece, qs, qe, packed, ld).contiguous(), scale, False,
                            _call_window(qs, qe, ks, ke, left, right), softcap,
                            _slopes(alibi, piece, packed), part=part)

    for piece in plan.pieces:
        _, b, _, s, e = piece
        L = plan.seq_len(b)
        qe, ke = _row_call(s, e, L, left, right, alibi is not None)
        _scatter(dq, piece, e - s, grads(piece, s, qe, 0, ke, "dq")[0], packed, sd)
        qs, qe, ke = _key_call(s, e, L, left, right, alibi is not None)
        _, gk, gv = grads(piece, qs, qe, s, ke, "dkdv")
        _scatter(dk, piece, e - s, gk, packed, sd)
        _scatter(dv, piece, e - s, gv, packed, sd)
    return dq, dk, dv


def _gather(plan, tensors, lse=None):
    """The whole stream of each tensor (all with one dtype, split after one all_gather along
    the head dim), and of lse if given."""
    heads = [t.shape[-2] for t in tensors]
    cat = torch.cat([t.contiguous() for t in tensors], -2) if len(tensors) > 1 else tensors[0]
    full = gather_rows(cat, plan.all_ranges, plan.total, plan.seq_dim, plan.group)
    parts = list(full.split(heads, -2)) if len(tensors) > 1 else [full]
    if lse is not None:
        parts.append(gather_rows(lse, plan.all_ranges, plan.total, plan.lse_dim, plan.group))
    return parts


class _SequenceParallelAttn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, plan, opts):
        k_full, v_full = _gather(plan, [k, v])
        out, lse = local_forward(plan, q, opts, forward_over(plan, k_full, v_full, opts))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan, ctx.opts = plan, opts
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        # K/V are gathered again rather than kept from the forward: memory over traffic
        full = _gather(ctx.plan, [q, k, v, out, dout.to(q.dtype)], lse)
        return (*local_backward(ctx.plan, full, ctx.opts), None, None)


def _make_plan(q, k, v, group, layout, cu_seqlens, dropout_p):
    """Checks the call (alike on every rank: shapes are compared across ranks before anything
    else) and returns its _Plan."""
    _I._no_dropout(dropout_p)
    packed = cu_seqlens is not None
    nd = 3 if packed else 4
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != nd:
            raise ValueError(f"{name}: expected {nd} dims, got {t.dim()}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    world, rank = group_info(group)
    sd = 0 if packed else 1
    dims = [list(t.shape) for t in (q, k, v)]
    shapes = gather_ints([x for d in dims for x in d], q.device, group)
    rows = [s[sd::nd][0] for s in shapes]  # each rank's q rows
    for r, s in enumerate(shapes):
        qs, ks, vs = s[:nd], s[nd:2 * nd], s[2 * nd:]
        if ks[sd] != qs[sd] or vs[sd] != qs[sd]:
            raise ValueError(f"k, v: rank {r} holds {ks[sd]} k and {vs[sd]} v rows for its "
                             f"{qs[sd]} q rows; context parallel shards them alike")
        drop = lambda x: x[:sd] + x[sd + 1:]
        if (drop(qs), drop(ks), drop(vs)) != (drop(shapes[0][:nd]), drop(shapes[0][nd:2 * nd]),
                                              drop(shapes[0][2 * nd:])):
            raise ValueError(f"q, k, v: rank {r}'s shapes {qs}, {ks}, {vs} differ from rank "
                             f"0's beyond the sequence dim")
    if packed:
        cu = [int(x) for x in (cu_seqlens.tolist() if isinstance(cu_seqlens, torch.Tensor)
                               else cu_seqlens)]
        if not cu or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
            raise ValueError(f"cu_seqlens: expected non-decreasing offsets from 0, got {cu}")
        plan = _Plan(group, world, rank, layout, None, cu)
    else:
        plan = _Plan(group, world, rank, layout, sum(rows), None)
    for r in range(world):
        if rows[r] != plan.local_rows(r):
            raise ValueError(f"q: rank {r} holds {rows[r]} rows; the {layout!r} layout of "
                             f"{plan.total} rows gives it {plan.local_rows(r)}")
    return plan


def _opts(q, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """(softmax_scale, left, right, softcap, alibi) with causal folded into right = 0, checked
    as the single-device entries check them (before anything is gathered or written)."""
    _, scale, softcap, left, right, _ = _I._options(q.shape[-1], softmax_scale, causal,
                                                    window_size, softcap, alibi_slopes)
    return scale, left, right, softcap, alibi_slopes


def _run(plan, q, k, v, opts, return_attn_probs):
    if _I._needs_grad(q, k, v):
        out, lse = _SequenceParallelAttn.apply(q, k, v, plan, opts)
    else:  # inference: lse only when asked for
        k_full, v_full = _gather(plan, [k, v])
        out, lse = local_forward(plan, q, opts, forward_over(plan, k_full, v_full, opts),
                                 want_lse=return_attn_probs)
    return (out, lse, None) if return_attn_probs else out


def context_parallel_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                               window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                               deterministic=False, return_attn_probs=False, *, group=None,
                               layout="contiguous"):
    """flash_attn_func over a sequence sharded across the ranks of `group`.

    q, k, v: this rank's rows of the sequence, (batch, rows, nheads[_k], headdim), the rows
    that layout.shard_ranges gives this rank ("contiguous" or "head_tail"; shard() cuts
    them from a full tensor). Returns this rank's rows of out (and (out, softmax_lse (batch,
    nheads, rows), None) when return_attn_probs), with autograd: in deterministic mode every
    bit of them and of dq, dk, dv equals what flash_attn_func gives on one device for those
    rows, for any number of ranks. Every rank must make the call (it is collective).
    """
    plan = _make_plan(q, k, v, group, layout, None, dropout_p)
    return _run(plan, q, k, v, _opts(q, softmax_scale, causal, window_size, softcap,
                                     alibi_slopes), return_attn_probs)


def context_parallel_attn_varlen_func(q, k, v, cu_seqlens, dropout_p=0.0, softmax_scale=None,
                                      causal=False, window_size=(-1, -1), softcap=0.0,
                                      alibi_slopes=None, deterministic=False,
                                      return_attn_probs=False, *, group=None,
                                      layout="contiguous"):
    """flash_attn_varlen_func (self-attention: cu_seqlens for q and k) over a packed batch
    sharded across the ranks of `group`.

    cu_seqlens: the whole packed batch's offsets (int32 tensor or list, batch + 1 entries),
    the same on every rank. q, k, v: this rank's rows of the packed stream, (rows, nheads[_k],
    headdim): "contiguous" cuts the stream into consecutive ranges (across sequences),
    "head_tail" cuts every sequence into 2 * world_size chunks (layout.py). Returns this
    rank's out rows (and softmax_lse (nheads, rows)); the bits of one device's
    flash_attn_varlen_func for those rows, gradients included.
    """
    plan = _make_plan(q, k, v, group, layout, cu_seqlens, dropout_p)
    return _run(plan, q, k, v, _opts(q, softmax_scale, causal, window_size, softcap,
                                     alibi_slopes), return_attn_probs)
