"""flash_attn.layers.rotary.apply_rotary_emb for the shim, on torch ops: flash_attn_det's own
rotary (the one flash_attn_with_kvcache applies on CPU tensors, interface._rotary), at
positions seqlen_offsets + i. flash_attn's version is a Triton kernel with the same math (fp32,
each product and sum rounded); its test file uses it only to build references."""
import torch

from flash_attn_det.interface import _rotary


def apply_rotary_emb(x, cos, sin, interleaved=False, inplace=False, seqlen_offsets=0,
                     cu_seqlens=None, max_seqlen=None):
    """x (batch, seqlen, nheads, headdim) rotated in its first 2 * cos.shape[1] dims at
    positions seqlen_offsets + i (an int, or a (batch,) tensor)."""
    if cu_seqlens is not None:
        raise NotImplementedError("apply_rotary_emb: cu_seqlens is not supported by the shim")
    B, S = x.shape[:2]
    offsets = torch.as_tensor(seqlen_offsets, device=x.device).long().reshape(-1, 1)
    pos = (offsets + torch.arange(S, device=x.device)).expand(B, S)
    out = _rotary(x, cos, sin, pos, interleaved)
    if inplace:
        x.copy_(out)
        return x
    return out
