"""flash_attn_det.distributed: attention over a sequence split across the ranks of a
torch.distributed process group (NCCL for CUDA tensors, gloo for CPU tensors), with the bits
one device gives — forward and backward, for any number of ranks (deterministic mode).

- context_parallel_attn_func / context_parallel_attn_varlen_func: sequence parallel
  (sequence.py): K/V all-gathered, each rank computes its own rows and its own keys'
  gradients; no cross-rank floating-point reduction.
- ulysses_attn_func / ulysses_attn_varlen_func: head parallel (ulysses.py): all-to-all from
  sequence shards to head shards and back.
- context_parallel_prefill_with_kvcache: the KV-cache prefill of one prompt split over the
  ranks (prefill.py).
- shard / unshard / shard_ranges: the layouts ("contiguous", "head_tail"), layout.py.
"""
from .layout import LAYOUTS, shard, shard_ranges, unshard
from .prefill import context_parallel_prefill_with_kvcache
from .sequence import context_parallel_attn_func, context_parallel_attn_varlen_func
from .simulate import simulate_ranks
from .ulysses import ulysses_attn_func, ulysses_attn_varlen_func

__all__ = [
    "LAYOUTS",
    "context_parallel_attn_func",
    "context_parallel_attn_varlen_func",
    "context_parallel_prefill_with_kvcache",
    "shard",
    "shard_ranges",
    "simulate_ranks",
    "ulysses_attn_func",
    "ulysses_attn_varlen_func",
    "unshard",
]
