"""Which rows of a sequence each rank holds: the shard layouts, and the helpers that cut a
full tensor into shards and put shards back together.

Positions are indices into the token stream: for a padded batch (B, N, ...) the stream is
[0, N), one sequence shared by every batch row; for a packed (varlen) batch it is [0, total)
with sequence b at [cu_seqlens[b], cu_seqlens[b+1]). A rank's rows are a list of ranges of
that stream, in the order the rank holds them (its local tensor is their concatenation).

- "contiguous": the stream cut into world_size consecutive ranges, rank r the r-th
  ([r*T//P, (r+1)*T//P)), across sequence boundaries when packed.
- "head_tail": every sequence cut into 2P chunks (chunk c: [c*L//2P, (c+1)*L//2P)), rank r
  holding chunks r and 2P-1-r: with a causal mask each rank then has about the same work
  (the load-balanced layout of causal context-parallel training, a.k.a. zigzag).

Lengths need not be multiples of anything; ranks may hold different row counts, even none.
"""
import torch

LAYOUTS = ("contiguous", "head_tail")


def _bounds(cu_seqlens, seqlen):
    """The sequences' [start, end) in the stream, as Python ints."""
    if cu_seqlens is None:
        return [(0, int(seqlen))]
    cu = [int(x) for x in cu_seqlens.tolist()] if isinstance(cu_seqlens, torch.Tensor) \
        else [int(x) for x in cu_seqlens]
    return list(zip(cu[:-1], cu[1:]))


def shard_ranges(rank, world_size, layout="contiguous", seqlen=None, cu_seqlens=None):
    """Rank `rank`'s rows as a list of (start, end) ranges of the token stream, in local order.

    Give seqlen for a padded batch, or cu_seqlens (the global, unsharded one) for a packed one.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank}")
    seqs = _bounds(cu_seqlens, seqlen)
    if layout == "contiguous":
        total = seqs[-1][1] if seqs else 0
        ranges = [(rank * total // world_size, (rank + 1) * total // world_size)]
    else:
        chunks = 2 * world_size
        ranges = []
        for start, end in seqs:
            n = end - start
            for c in (rank, chunks - 1 - rank):
                ranges.append((start + c * n // chunks, start + (c + 1) * n // chunks))
    return [(s, e) for s, e in ranges if e > s]


def all_shard_ranges(world_size, layout, seqlen=None, cu_seqlens=None):
    """shard_ranges of every rank (one list per rank)."""
    return [shard_ranges(r, world_size, layout, seqlen, cu_seqlens) for r in range(world_size)]


def pieces(ranges, seqlen=None, cu_seqlens=None):
    """The ranges cut at sequence boundaries: (local_offset, b, seq_start, s, e) with rows
    [s, e) of sequence b (positions inside the sequence, which starts at stream position
    seq_start) held at local rows [local_offset, local_offset + e - s)."""
    seqs = _bounds(cu_seqlens, seqlen)
    out, local = [], 0
    for start, end in ranges:
        for b, (s0, s1) in enumerate(seqs):
            lo, hi = max(start, s0), min(end, s1)
            if lo < hi:
                out.append((local + lo - start, b, s0, lo - s0, hi - s0))
        local += end - start
    return out


def shard(x, rank, world_size, layout="contiguous", cu_seqlens=None, dim=None):
    """Rank `rank`'s rows of a full tensor x: the concatenation of its ranges along `dim`
    (default: 1 for a padded batch (B, N, ...), 0 for a packed one (total, ...))."""
    dim = (1 if cu_seqlens is None else 0) if dim is None else dim
    ranges = shard_ranges(rank, world_size, layout, x.shape[dim], cu_seqlens)
    if cu_seqlens is not None and ranges and ranges[-1][1] > x.shape[dim]:
        raise ValueError(f"cu_seqlens: ends at {ranges[-1][1]}, beyond x's {x.shape[dim]} rows")
    return torch.cat([x.narrow(dim, s, e - s) for s, e in ranges], dim) if ranges \
        else x.narrow(dim, 0, 0)


def place(parts, all_ranges, total, dim, out=None):
    """The full tensor whose rows all_ranges[p] (local order) are parts[p]'s rows along dim;
    parts[p] may be longer than its rows (padding is ignored). Written into out if given."""
    if out is None:
        ref = parts[0]
        shape = list(ref.shape)
        shape[dim] = total
        out = ref.new_empty(shape)
    for part, ranges in zip(parts, all_ranges):
        local = 0
        for s, e in ranges:
            out.narrow(dim, s, e - s).copy_(part.narrow(dim, local, e - s))
            local += e - s
    return out


def unshard(parts, layout="contiguous", cu_seqlens=None, dim=None):
    """The inverse of shard: the full tensor from every rank's shard (parts[r] from rank r)."""
    dim = (1 if cu_seqlens is None else 0) if dim is None else dim
    total = sum(p.shape[dim] for p in parts)
    ranges = all_shard_ranges(len(parts), layout, total, cu_seqlens)
    return place(parts, ranges, total, dim)
