"""The pytest plugin of flash_attn_det (entry point `pytest11`, on when the package is installed):
the `invariance` fixture hands a test the helpers of flash_attn_det.invariance --
assert_batch_invariant, assert_run_to_run, pad_batch and find_divergence -- for checking that a
user's function or model gives each sequence the same bits alone and in a batch, and for naming
the first op that breaks it when it does not."""
import pytest


@pytest.fixture
def invariance():
    """flash_attn_det.invariance (see its docstring)."""
    from flash_attn_det import invariance as inv
    return inv
