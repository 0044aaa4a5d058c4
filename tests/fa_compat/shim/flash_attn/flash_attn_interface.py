"""flash_attn.flash_attn_interface for the shim: flash_attn_det's entry points, and the one
private helper flash_attn's test file imports (to decode S_dmask)."""
from flash_attn_det import *  # noqa: F401,F403
from flash_attn_det.interface import _get_block_size_n  # noqa: F401
