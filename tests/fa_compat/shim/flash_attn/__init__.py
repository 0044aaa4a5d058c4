"""`import flash_attn` resolving to flash_attn_det, for running flash_attn's own test file
unmodified (tests/fa_compat/run.sh). A user swaps the import instead; this package exists so that a
third-party file that imports `flash_attn` by name runs on flash_attn_det."""
from flash_attn_det import *  # noqa: F401,F403
from flash_attn_det import __version__  # noqa: F401
