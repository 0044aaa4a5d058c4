"""flash_attn_det: deterministic, batch-invariant attention with the flash_attn API.

    from flash_attn_det import flash_attn_func, set_deterministic_mode
"""
from ._C import __version__, has_cuda
from .interface import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)
from .mode import (get_deterministic_mode, get_index_checks, get_split_size, set_deterministic_mode,
                   set_index_checks)
from . import ops  # noqa: F401  (registers torch.ops.flash_attn_det.* for torch.compile)

__all__ = [
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "flash_attn_with_kvcache",
    "set_deterministic_mode",
    "get_deterministic_mode",
    "get_split_size",
    "set_index_checks",
    "get_index_checks",
    "has_cuda",
    "__version__",
]
