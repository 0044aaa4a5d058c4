"""Padding helpers with flash_attn.bert_padding's API: pack a padded batch into the
(total_tokens, ...) layout of the varlen functions and back.

    x_unpad, indices, cu_seqlens, max_seqlen, seqused = unpad_input(x, attention_mask)
    out = flash_attn_varlen_func(q_unpad, k_unpad, v_unpad, cu_seqlens, cu_seqlens,
                                 max_seqlen, max_seqlen)
    out_padded = pad_input(out, indices, batch, seqlen)

Pure torch (gather/scatter), differentiable.
"""
import torch
import torch.nn.functional as F

__all__ = ["unpad_input", "pad_input", "index_first_axis", "index_put_first_axis",
           "unpad_input_for_concatenated_sequences"]


def index_first_axis(x, indices):
    """x[indices] along the first axis, for x of shape (N, ...); indices int64 or int32."""
    return x.index_select(0, indices)


def index_put_first_axis(values, indices, first_axis_dim):
    """A zero tensor of shape (first_axis_dim, ...) with values at rows indices. indices may be
    int32, as flash_attn's accepts (transformers' glue passes int32 indices at every decode step
    of a padded batch); index_copy needs int64."""
    out = values.new_zeros((first_axis_dim, *values.shape[1:]))
    return out.index_copy(0, indices.long(), values)


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """Packs the tokens attention_mask marks (1/True) into (total_tokens, ...).

    hidden_states: (batch, seqlen, ...); attention_mask: (batch, seqlen) bool/int.
    unused_mask: optional (batch, seqlen) marking tokens that are packed but not
    attended (counted in the lengths, not in seqused), as flash_attn's.
    Returns (hidden_states (total, ...), indices (total,) into the flattened batch,
    cu_seqlens (batch + 1,) int32, max_seqlen_in_batch int, seqused (batch,) int32).
    """
    all_masks = attention_mask if unused_mask is None else (attention_mask + unused_mask)
    seqlens = all_masks.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(all_masks.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """Packs batches whose rows each hold several sequences one after the other.

    attention_mask_in_length: (batch, seqlen) int, row b = the lengths of its sequences, then
    zeros (e.g. [2, 3, 0, 0, 0, 0]: tokens 0-1 and 2-4 are two sequences, 5 is padding).
    Returns (hidden_states (total, ...), indices (total,) into the flattened batch, cu_seqlens
    (n_sequences + 1,) int32, max_seqlen int), as flash_attn's.
    """
    lengths = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.shape[-1]
    used = torch.arange(seqlen, device=lengths.device)[None, :] < lengths[:, None]
    indices = torch.nonzero(used.flatten(), as_tuple=False).flatten()
    flat_lengths = attention_mask_in_length.flatten()
    seqlens = flat_lengths[flat_lengths != 0].to(torch.int32)
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen


def pad_input(hidden_states, indices, batch, seqlen):
    """Inverse of unpad_input: (total, ...) -> (batch, seqlen, ...), zeros elsewhere."""
    out = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return out.reshape(batch, seqlen, *hidden_states.shape[1:])
