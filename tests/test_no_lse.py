"""softmax_lse is optional in the forward: an inference call that does not ask for it
(no return_attn_probs / return_softmax_lse, no autograd) neither allocates nor writes it,
and its output has the bits of the call that does; the backward refuses to run without
it. On the CPU path (CI) and the GPU, every forward entry and, on the GPU, every kernel
that stores lse: the prefill kernel (one CTA per row block), the split CTAs' combine, the
packed decode kernel and the rows of a KV-cache sequence that does not exist."""
import pytest
import torch
from torch.utils.dlpack import to_dlpack

import flash_attn_det as fad
from flash_attn_det import _C
from flash_attn_det.testing import force_schedule

from conftest import DEVICES, make_gen, make_qkv, randn, raw_fwd

SCHEDULES = ["one_cta", "cta_per_split"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("schedule", SCHEDULES)
@pytest.mark.parametrize("D", [64, 128])
def test_func_without_lse_same_bits(device, schedule, D):
    g = make_gen(31)
    q, k, v = make_qkv(g, 2, 150, 1300, 4, 2, D, torch.bfloat16, device)
    with torch.no_grad(), force_schedule(schedule):
        out, lse, _ = fad.flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
        alone = fad.flash_attn_func(q, k, v, causal=True)
    assert lse.shape == (2, 4, 150)
    assert torch.equal(alone, out)


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_without_lse_same_bits(device):
    g = make_gen(32)
    lens = [70, 600, 1]
    cu = torch.tensor([0, 70, 670, 671], dtype=torch.int32, device=device)
    q = randn(g, (671, 4, 64), torch.float16, device)
    k, v = randn(g, (671, 2, 64), torch.float16, device), randn(g, (671, 2, 64), torch.float16, device)
    with torch.no_grad():
        out, lse, _ = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                 causal=True, return_attn_probs=True)
        alone = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    assert lse.shape == (4, 671)
    assert torch.equal(alone, out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_without_lse_same_bits(device, paged):
    """Decode (the packed kernel on the GPU, split CTAs and the combine for the long
    sequence) and a sequence whose cache rows do not exist (NaN rows)."""
    g = make_gen(33)
    B, cap, Hk, G, D = 3, 2048, 2, 4, 128
    q = randn(g, (B, 1, Hk * G, D), torch.bfloat16, device)
    kc, vc = (randn(g, (B, cap, Hk, D), torch.bfloat16, device) for _ in range(2))
    lens = torch.tensor([2000, 37, 1], dtype=torch.int32, device=device)
    kw = {}
    if paged:  # 16-row pages in a shuffled order
        page = 16
        perm = torch.randperm(B * cap // page, generator=torch.Generator().manual_seed(0))
        kc = kc.reshape(B * cap // page, page, Hk, D)[perm.argsort()].contiguous()
        vc = vc.reshape(B * cap // page, page, Hk, D)[perm.argsort()].contiguous()
        kw["block_table"] = perm.reshape(B, cap // page).to(torch.int32).to(device)
    out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                           return_softmax_lse=True, **kw)
    alone = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True, **kw)
    assert torch.equal(alone, out)
    if device == "cuda" and not paged:  # a cache entry that does not exist: NaN rows, no lse
        bad = torch.tensor([0, 5, 1], dtype=torch.int32, device=device)
        nan_out = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                              cache_batch_idx=bad)
        assert nan_out[1].isnan().all() and not nan_out[0].isnan().any()


@pytest.mark.parametrize("device", DEVICES)
def test_raw_fwd_with_none_lse_writes_out(device):
    g = make_gen(34)
    q, k, v = make_qkv(g, 2, 300, 170, 4, 2, 64, torch.bfloat16, device)
    out = torch.full_like(q, float("nan"))
    ref = torch.empty_like(q)
    lse = torch.empty((2, 4, 300), device=device)
    assert raw_fwd(q, k, v, ref, lse, causal=True, window=(-1, 0), split_size=128) is None
    assert raw_fwd(q, k, v, out, None, causal=True, window=(-1, 0), split_size=128) is None
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(out, ref)


def test_backward_refuses_none_lse():
    g = make_gen(35)
    q, k, v = make_qkv(g, 1, 64, 64, 2, 2, 64, torch.float16)
    out = torch.empty_like(q)
    dq, dk, dv = torch.empty_like(q), torch.zeros_like(k), torch.zeros_like(v)
    tensors = [to_dlpack(t) for t in (out, dq, dk, dv, q, k, v, out)]
    with pytest.raises(ValueError, match="^softmax_lse: NULL pointer"):
        _C.bwd(*tensors, None, None, None, 0.125, 0.0, -1, -1, 0, 1, 512, _C.SCHEDULE_AUTO, 0)
