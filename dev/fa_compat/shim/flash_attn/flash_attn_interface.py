"""flash_attn.flash_attn_interface for the shim: flash_attn_det's entry points, and the one
private helper flash_attn's test file imports."""
from flash_attn_det import *  # noqa: F401,F403


def _get_block_size_n(device, head_dim, is_dropout, is_causal):
    """flash_attn's test file uses this only to decode S_dmask, the dropout mask flash_attn
    returns in its kernel's tile layout; flash_attn_det returns no S_dmask."""
    raise NotImplementedError("_get_block_size_n: flash_attn_det returns no S_dmask "
                              "(return_attn_probs gives softmax_lse and None)")
