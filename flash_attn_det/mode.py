"""Process-wide switches: deterministic mode (the default) or fast mode, and the checked mode
for index tensors on the GPU."""
import os

from . import _C

_SPLIT_QUANTUM = _C.SPLIT_QUANTUM
_MAX_SPLIT_SIZE = _C.MAX_SPLIT_SIZE

# One dict, read on every call: deterministic flag, split_size, and the
# test-only schedule override (flash_attn_det.testing.force_schedule).
_state = {"enabled": True, "split_size": 512, "schedule": _C.SCHEDULE_AUTO,
          "index_checks": os.environ.get("FLASH_ATTN_DET_CHECK_INDICES", "0") not in ("", "0")}


def set_deterministic_mode(enabled=True, split_size=512):
    """Turn deterministic mode on (the default) or off.

    enabled: True -> every output bit of a query row depends only on that row's
        inputs, the keys/values it sees, the options and ``split_size`` -- never
        on batch size, batch composition, chunking or the GPU's occupancy.
        False -> fast mode: the split plan adapts to the batch and the GPU.
    split_size: keys per split of the fixed plan, a positive multiple of 128.
        Changing it changes the bits (but never the invariances).
    """
    if isinstance(split_size, bool) or not isinstance(split_size, int):
        raise ValueError(f"split_size: expected an int, got {type(split_size).__name__}")
    if split_size <= 0 or split_size % _SPLIT_QUANTUM or split_size > _MAX_SPLIT_SIZE:
        raise ValueError(f"split_size: must be a positive multiple of {_SPLIT_QUANTUM}, at most "
                         f"{_MAX_SPLIT_SIZE}, got {split_size}")
    # _C first: if it refuses, the Python state is left as it was
    _C.set_mode(int(bool(enabled)), split_size, _state["schedule"])
    _state["enabled"] = bool(enabled)
    _state["split_size"] = split_size


def _sync():
    """Hands _state to _C, whose inference entries (infer, infer_varlen, infer_kvcache) read
    the mode there, and every entry the index checks."""
    _C.set_mode(int(_state["enabled"]), _state["split_size"], _state["schedule"])
    _C.set_index_checks(bool(_state.get("index_checks")))


def set_index_checks(enabled=True):
    """Checked mode for the index tensors of CUDA calls (off by default; also on when the
    environment variable FLASH_ATTN_DET_CHECK_INDICES=1 is set at import).

    On CPU tensors every call checks cu_seqlens_q/k, seqused_k, cache_seqlens,
    cache_batch_idx, cache_leftpad and block_table and raises a ValueError naming the
    argument and the sequence. On CUDA tensors those checks would need the values on the
    host, a sync that CUDA graphs cannot capture, so by default the kernels trust them and a
    sequence whose indices are out of range gets NaN rows. With checks on, every CUDA call
    copies its index tensors to the host first and raises the CPU path's errors, before
    anything (output, KV cache) is written. For debugging and tests: it costs a sync per call,
    and a CUDA-graph capture fails under it.
    """
    if not isinstance(enabled, (bool, int)):
        raise ValueError(f"enabled: expected a bool, got {type(enabled).__name__}")
    _C.set_index_checks(bool(enabled))
    _state["index_checks"] = bool(enabled)


def get_index_checks():
    """True when CUDA calls check their index tensors on the host first (set_index_checks)."""
    return _state["index_checks"]


def get_deterministic_mode():
    """True when deterministic mode is on."""
    return _state["enabled"]


def get_split_size():
    """The split_size of deterministic mode."""
    return _state["split_size"]


if _state["index_checks"]:  # FLASH_ATTN_DET_CHECK_INDICES=1 at import
    _C.set_index_checks(True)
