"""flash_attn_det.distributed: attention over a sequence split across the ranks of a
torch.distributed process group (NCCL for CUDA tensors, gloo for CPU tensors), with the bits
one device gives — forward and backward, for any number of ranks (deterministic mode).

- context_parallel_attn_func / context_parallel_attn_varlen_func: sequence parallel
  (sequence.py): K/V all-gathered, each rank computes its own rows and its own keys'
  gradients; no cross-rank floating-point reduction.
- ulysses_attn_func / ulysses_attn_varlen_func: head parallel (ulysses.py): all-to-all from
  sequence shards to head shards and back.
- shard / unshard / shard_ranges: the layouts ("contiguous", "head_tail"), layout.py.
"""
from .layout import LAYOUTS, shard, shard_ranges, unshard
from .sequence import context_parallel_attn_func, context_parallel_attn_varlen_func
from .simulate import simulate_ranks

__all__ = [
    "LAYOUTS",
    "context_parallel_attn_func",
    "context_parallel_attn_varlen_func",
    "shard",
    "shard_ranges",
    "simulate_ranks",
    "unshard",
]
