"""Bad arguments raise an exception that names the argument, on every path (the C inference
entries and the general Python path), and leave the mode as it was."""
import math

import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import get_deterministic_mode, get_split_size, set_deterministic_mode

from conftest import make_gen, randn


def _qkv():
    gen = make_gen(5)
    return [randn(gen, (1, 6, 2, 64), torch.bfloat16) for _ in range(3)]


@pytest.mark.parametrize("extra", [{}, {"softcap": 3.0}], ids=["inference entry", "general path"])
@pytest.mark.parametrize("scale", [1e-46, 2.0 ** -151, 1e39, math.inf, math.nan, 0.0, -1.0])
def test_softmax_scale_that_is_no_fp32_scale_raises(extra, scale):
    # (the C API reads a 0.0f scale as "the default": 1e-46 used to give 1/sqrt(D) silently)
    with pytest.raises(ValueError, match="^softmax_scale:"):
        fad.flash_attn_func(*_qkv(), softmax_scale=scale, **extra)


@pytest.mark.parametrize("kw,name", [
    (dict(softmax_scale="x"), "softmax_scale"), (dict(softmax_scale=[1.0]), "softmax_scale"),
    (dict(softcap="x"), "softcap"), (dict(window_size=(math.inf, 0)), "window_size")])
def test_non_numbers_name_the_argument(kw, name):
    with pytest.raises((TypeError, ValueError), match=f"^{name}:"):
        fad.flash_attn_func(*_qkv(), **kw)


@pytest.mark.parametrize("bad", [2 ** 24 + 128, 2 ** 31 - 128])
def test_split_size_bounded_and_rejection_leaves_the_mode(bad):
    set_deterministic_mode(True, split_size=384)
    q, k, v = _qkv()
    before = fad.flash_attn_func(q, k, v)
    with pytest.raises(ValueError, match="^split_size:"):
        set_deterministic_mode(False, split_size=bad)
    assert get_split_size() == 384 and get_deterministic_mode() is True
    assert torch.equal(fad.flash_attn_func(q, k, v), before)  # the C side's mode too


def test_varlen_backward_zeroes_dq_rows_of_no_sequence():
    gen = make_gen(6)
    total = 20  # rows 14..19 belong to no sequence
    q, k, v = (randn(gen, (total, 2, 32), torch.float16).requires_grad_() for _ in range(3))
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    out = fad.flash_attn_varlen_func(q, k, v, cu, cu, 9, 9, causal=True)
    assert torch.equal(out[14:], torch.zeros_like(out[14:]))
    out.float().square().sum().backward()
    assert torch.equal(q.grad[14:], torch.zeros_like(q.grad[14:]))
    assert q.grad[:14].abs().sum() > 0


@pytest.mark.parametrize("extra", [{}, {"softcap": 3.0}], ids=["inference entry", "general path"])
@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_tensor_dlpack_refuses_is_named(extra, which):
    """A meta tensor (no data) cannot cross DLPack: torch's error comes back as a ValueError
    naming the argument, on every entry, before anything is written."""
    q, k, v = _qkv()
    args = [q, k, v]
    args[which] = args[which].to("meta")
    name = "qkv"[which]
    with pytest.raises(ValueError, match=f"^{name}: cannot be passed to the kernels through DLPack"):
        fad.flash_attn_func(*args, **extra)
    cu = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match=f"^{name}: cannot be passed"):
        fad.flash_attn_varlen_func(*(a[0] for a in args), cu, cu, 6, 6, **extra)
    if which == 0:  # the caches as k, v: nothing appended, nothing written
        kc, vc = k.clone(), v.clone()
        with pytest.raises(ValueError, match="^q: cannot be passed"):
            fad.flash_attn_with_kvcache(args[0], kc, vc, cache_seqlens=6, **extra)
        assert torch.equal(kc, k) and torch.equal(vc, v)
