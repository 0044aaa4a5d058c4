"""Head dims that are not a multiple of 8: flash_attn accepts any head dim up
to 256 and pads it with zero columns (in Python; for the KV cache in C++, cache copy included).
flash_attn_det does the same in every entry point, so flash_attn's tests at d=59 and d=111 run
unmodified. Checked here: forward and gradients against float64, the default scale of the
unpadded head dim, a sequence's bits alone and in a batch (padded and varlen), the KV cache's
append and attention against the same keys in one call, and a failing cache call that writes
nothing. The CPU cases run in CI; the GPU ones on the device."""
import pytest
import torch

import flash_attn_det as fad

from conftest import DEVICES, make_gen, make_qkv, randn, run_and_check
from test_backward import assert_rel, grads, ref_grads

ODD_DIMS = [3, 59, 111, 250]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", ODD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_forward_matches_float64(device, D, causal):
    q, k, v = make_qkv(make_gen(500 + D), 2, 37, 70, 4, 2, D, torch.bfloat16, device)
    out, lse, _, _ = run_and_check(q, k, v, causal=causal)
    assert out.shape[-1] == D


@pytest.mark.parametrize("device", DEVICES)
def test_default_scale_is_the_unpadded_head_dims(device):
    q, k, v = make_qkv(make_gen(510), 1, 20, 30, 2, 2, 59, torch.float16, device)
    assert torch.equal(fad.flash_attn_func(q, k, v),
                       fad.flash_attn_func(q, k, v, softmax_scale=59 ** -0.5))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", [59, 111])
def test_grads_match_float64(device, D):
    gen = make_gen(520 + D)
    q, k, v = make_qkv(gen, 2, 33, 45, 4, 2, D, torch.bfloat16, device)
    dout = randn(gen, q.shape, torch.bfloat16, device)
    _, dq, dk, dv = grads(fad.flash_attn_func, q, k, v, dout, causal=True)
    rq, rk, rv = ref_grads(q.cpu(), k.cpu(), v.cpu(), dout.cpu(), causal=True)
    for what, got, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert got.shape == ref.shape
        assert_rel(got.cpu(), ref, torch.bfloat16, what)


@pytest.mark.parametrize("device", DEVICES)
def test_sequence_alone_and_in_batch_padded_and_varlen(device):
    D, lens = 59, [17, 40, 3]
    gen = make_gen(530)
    qs = [randn(gen, (1, n, 4, D), torch.float16, device) for n in lens]
    ks = [randn(gen, (1, n, 2, D), torch.float16, device) for n in lens]
    vs = [randn(gen, (1, n, 2, D), torch.float16, device) for n in lens]
    alone = [fad.flash_attn_func(q, k, v, causal=True) for q, k, v in zip(qs, ks, vs)]
    cu = torch.tensor([0, 17, 57, 60], dtype=torch.int32, device=device)
    packed = fad.flash_attn_varlen_func(torch.cat(qs, 1)[0], torch.cat(ks, 1)[0],
                                        torch.cat(vs, 1)[0], cu, cu, 40, 40, causal=True)
    for b, n in enumerate(lens):
        assert torch.equal(packed[cu[b]:cu[b] + n], alone[b][0]), f"varlen sequence {b}"
    # the same sequence twice in a padded batch of 2 (equal lengths: no padding rows)
    q2, k2, v2 = (torch.cat([t, t]) for t in (qs[1], ks[1], vs[1]))
    two = fad.flash_attn_func(q2, k2, v2, causal=True)
    assert torch.equal(two[0], alone[1][0]) and torch.equal(two[1], alone[1][0])


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_append_and_attend(device):
    D, cap, new = 59, 48, 5
    gen = make_gen(540)
    q = randn(gen, (2, new, 4, D), torch.bfloat16, device)
    k_new = randn(gen, (2, new, 2, D), torch.bfloat16, device)
    v_new = randn(gen, (2, new, 2, D), torch.bfloat16, device)
    k_cache = randn(gen, (2, cap, 2, D), torch.bfloat16, device)
    v_cache = randn(gen, (2, cap, 2, D), torch.bfloat16, device)
    seqlens = torch.tensor([10, 21], dtype=torch.int32, device=device)
    k0, v0 = k_cache.clone(), v_cache.clone()
    out = fad.flash_attn_with_kvcache(q, k_cache, v_cache, k_new, v_new, cache_seqlens=seqlens,
                                      causal=True)
    assert out.shape == q.shape
    for b, n in enumerate((10, 21)):
        # the new rows appended in place, every other row untouched
        assert torch.equal(k_cache[b, n:n + new], k_new[b])
        assert torch.equal(v_cache[b, n:n + new], v_new[b])
        assert torch.equal(k_cache[b, :n], k0[b, :n]) and torch.equal(k_cache[b, n + new:],
                                                                      k0[b, n + new:])
        # the attention: the same keys in one flash_attn_func call
        ref = fad.flash_attn_func(q[b:b + 1], k_cache[b:b + 1, :n + new],
                                  v_cache[b:b + 1, :n + new], causal=True)
        assert torch.equal(out[b:b + 1], ref), f"sequence {b}"


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_refusal_writes_nothing(device):
    D = 59
    gen = make_gen(550)
    q = randn(gen, (2, 1, 4, D), torch.bfloat16, device)
    k_cache = randn(gen, (2, 16, 2, D), torch.bfloat16, device)
    v_cache = randn(gen, (2, 16, 2, D), torch.bfloat16, device)
    k0, v0 = k_cache.clone(), v_cache.clone()
    with pytest.raises(ValueError, match="^softcap:"):
        fad.flash_attn_with_kvcache(q, k_cache, v_cache, k0[:, :1].clone(), v0[:, :1].clone(),
                                    cache_seqlens=4, softcap=-1.0)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


def test_head_dims_past_256_and_mismatched_still_refused():
    q, k, v = make_qkv(make_gen(560), 1, 4, 4, 2, 2, 260, torch.float16)
    with pytest.raises(ValueError, match="^head_dim:"):
        fad.flash_attn_func(q, k, v)
    q, k, v = make_qkv(make_gen(561), 1, 4, 4, 2, 2, 59, torch.float16)
    with pytest.raises(ValueError):
        fad.flash_attn_func(q, k[..., :58], v[..., :58])
