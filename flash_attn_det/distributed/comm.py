"""The collectives the parallel attention functions use, on any torch.distributed backend
(NCCL for CUDA tensors, gloo for CPU tensors). They only move bits: nothing here adds or
reduces a floating-point value, which is what keeps every result equal to one device's.
"""
import torch
import torch.distributed as dist

from .layout import place


def group_info(group):
    """(world_size, rank) of group (None: the default group)."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized (call "
                           "torch.distributed.init_process_group first)")
    return dist.get_world_size(group), dist.get_rank(group)


def gather_ints(values, device, group):
    """Every rank's list of ints (all the same length): [[rank 0's], [rank 1's], ...].
    Used to check shapes on every rank alike, so a bad call raises everywhere instead of
    leaving the other ranks waiting in a collective."""
    world, _ = group_info(group)
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    if world == 1:
        return [values]
    parts = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(parts, mine, group=group)
    return [p.tolist() for p in parts]


def gather_rows(x, all_ranges, total, dim, group):
    """The full tensor (total rows along dim) from every rank's local rows x, rank p holding
    the stream ranges all_ranges[p] (see layout.py). Shards may differ in length: each is
    padded to the longest (all_gather wants equal sizes on every backend) and the padding
    dropped again."""
    world = len(all_ranges)
    if world == 1:
        return place([x], all_ranges, total, dim)
    longest = max(sum(e - s for s, e in r) for r in all_ranges)
    x = x.contiguous()
    if x.shape[dim] < longest:
        shape = list(x.shape)
        shape[dim] = longest - x.shape[dim]
        x = torch.cat([x, x.new_zeros(shape)], dim)
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x, group=group)
    return place(parts, all_ranges, total, dim)


def all_to_all(x, send_sizes, recv_sizes, group):
    """all_to_all_single along dim 0: rank p gets this rank's rows [sum(send_sizes[:p]),
    +send_sizes[p]); the result holds the rows from rank 0, then rank 1, ... (recv_sizes)."""
    x = x.contiguous()
    out = x.new_empty((sum(recv_sizes),) + tuple(x.shape[1:]))
    if len(send_sizes) == 1:
        return out.copy_(x)
    dist.all_to_all_single(out, x, output_split_sizes=list(recv_sizes),
                           input_split_sizes=list(send_sizes), group=group)
    return out
