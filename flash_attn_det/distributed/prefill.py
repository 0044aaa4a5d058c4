"""The KV-cache prefill of one long prompt split over the ranks of a process group, with the
bits of one device's flash_attn_with_kvcache.

Every rank holds a replica of the cache (the same prior rows, e.g. a shared system prompt) and
its rows of the new prompt (layout.py, along the prompt). The new k/v are all-gathered and
appended to every replica in place, as one device's call appends them; then each rank attends
its own rows over the cache, each piece of rows as a chunked prefill that ends where its keys
end (sequence.py's window shift and ALiBi rule, counted from the cache's rows). Afterwards every
rank holds the whole updated cache, ready for decoding on any of them.
"""
import torch

from .. import interface as _I
from .sequence import _gather, _make_plan, _opts, local_forward


def context_parallel_prefill_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens=None,
                                          cache_batch_idx=None, cache_leftpad=None,
                                          block_table=None, softmax_scale=None, causal=False,
                                          window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                                          return_softmax_lse=False, *, group=None,
                                          layout="contiguous"):
    """flash_attn_with_kvcache(q, k_cache, v_cache, k, v, cache_seqlens, ...) for a prompt
    sharded across the ranks of `group` (inference: no autograd; collective).

    q, k, v: this rank's rows of the new prompt (batch, rows, nheads[_k], headdim) in
    `layout`; k_cache, v_cache, cache_seqlens (int or int32 (batch,)), cache_batch_idx,
    cache_leftpad, block_table: this rank's replica of the cache and its arguments, alike on
    every rank. The whole prompt's k/v are appended to every replica; returns this rank's out
    rows (and softmax_lse (batch, nheads, rows)): in deterministic mode the bits one device's
    call on the whole prompt gives them. Rotary is not applied here: rotate q and k at their
    positions before the call.
    """
    if not isinstance(k_cache, torch.Tensor) or not isinstance(v_cache, torch.Tensor):
        raise TypeError("k_cache, v_cache: expected torch.Tensors")
    if cache_seqlens is None:
        cache_seqlens = 0
    if isinstance(cache_seqlens, int):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32,
                                   device=q.device)
    if not isinstance(cache_seqlens, torch.Tensor) or cache_seqlens.dtype != torch.int32:
        raise TypeError("cache_seqlens: expected an int or an int32 tensor")
    plan = _make_plan(q, k, v, group, layout, None, 0.0)
    opts = _opts(q, softmax_scale, causal, window_size, softcap, alibi_slopes)
    k_full, v_full = _gather(plan, [k, v])
    # the append (and its checks: capacity, block table) of one device's call, in place
    _I._kvcache_append(q, k_cache, v_cache, k_full, v_full, None, None, cache_seqlens,
                       cache_batch_idx, False, False, block_table)
    scale, _, _, softcap_, _ = opts

    def attend(qp, piece, ke, window, slopes, want_lse):
        # keys [0, ke) of the prompt are cache rows up to cache_seqlens + ke: a chunked prefill
        return _I._fwd_kvcache(qp, k_cache, v_cache, None, None, None, None, cache_seqlens + ke,
                               cache_batch_idx, cache_leftpad, block_table, scale, False, window,
                               softcap_, False, slopes, want_lse=want_lse)

    out, lse = local_forward(plan, q, opts, attend, want_lse=return_softmax_lse)
    return (out, lse) if return_softmax_lse else out
