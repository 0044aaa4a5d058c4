"""Process-wide switches: deterministic mode (the default) or fast mode, and the checked mode
for index tensors on the GPU.

The C module's state is the one copy of the mode (every entry, Python or C, reads it there):
this file only validates and forwards. The default split_size is _C.DEFAULT_SPLIT_SIZE,
written once in csrc/fad.h."""
import os

from . import _C

_SPLIT_QUANTUM = _C.SPLIT_QUANTUM
_MAX_SPLIT_SIZE = _C.MAX_SPLIT_SIZE

# (deterministic, split_size, schedule): the mode every call runs in. The schedule is the
# test-only override of flash_attn_det.testing.force_schedule.
current = _C.get_mode


def set_deterministic_mode(enabled=True, split_size=_C.DEFAULT_SPLIT_SIZE):
    """Turn deterministic mode on (the default) or off.

    enabled: True -> every output bit of a query row depends only on that row's
        inputs, the keys/values it sees, the options and ``split_size`` -- never
        on batch size, batch composition, chunking or the GPU's occupancy.
        False -> fast mode: the split plan adapts to the batch and the GPU.
    split_size: keys per split of the fixed plan, a positive multiple of 128
        (default 512). Changing it changes the bits (but never the invariances).
    """
    if isinstance(split_size, bool) or not isinstance(split_size, int):
        raise ValueError(f"split_size: expected an int, got {type(split_size).__name__}")
    if split_size <= 0 or split_size % _SPLIT_QUANTUM or split_size > _MAX_SPLIT_SIZE:
        # (checked here too, before an int too large for C reaches _C.set_mode)
        raise ValueError(f"split_size: must be a positive multiple of {_SPLIT_QUANTUM}, at most "
                         f"{_MAX_SPLIT_SIZE}, got {split_size}")
    _C.set_mode(int(bool(enabled)), split_size, current()[2])


def state():
    """(deterministic, split_size, schedule, index_checks): everything set in this file."""
    return (*current(), _C.get_index_checks())


def restore(saved):
    """Sets what state() returned (tests start from, and go back to, a known mode)."""
    det, split_size, schedule, index_checks = saved
    _C.set_mode(int(det), split_size, schedule)
    _C.set_index_checks(bool(index_checks))


def set_schedule(schedule):
    """Sets the CUDA split schedule (one of _C.SCHEDULE_*) and returns the previous one."""
    det, split_size, saved = current()
    _C.set_mode(int(det), split_size, schedule)
    return saved


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


def get_index_checks():
    """True when CUDA calls check their index tensors on the host first (set_index_checks)."""
    return _C.get_index_checks()


def get_deterministic_mode():
    """True when deterministic mode is on."""
    return current()[0]


def get_split_size():
    """The split_size of deterministic mode."""
    return current()[1]


if os.environ.get("FLASH_ATTN_DET_CHECK_INDICES", "0") not in ("", "0"):
    _C.set_index_checks(True)
