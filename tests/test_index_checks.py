"""The checked mode for index tensors (flash_attn_det.set_index_checks). On CUDA tensors the
kernels trust cu_seqlens, cache_seqlens, cache_batch_idx, cache_leftpad and block_table by
default (no sync, graph-safe; a bad sequence gets NaN rows); with checks on, a CUDA call copies
them to the host and raises the CPU path's error, naming the argument and the sequence, before
anything is written."""
import os
import subprocess
import sys

import pytest
import torch

import flash_attn_det as fad

from conftest import HAS_CUDA, make_gen, randn


def i32(values, device="cuda"):
    return torch.tensor(values, dtype=torch.int32, device=device)


def test_switch_and_its_argument():
    assert fad.get_index_checks() is False
    fad.set_index_checks(True)
    assert fad.get_index_checks() is True
    fad.set_index_checks(False)
    with pytest.raises(ValueError, match="^enabled: expected a bool"):
        fad.set_index_checks("yes")
    assert fad.get_index_checks() is False


def test_environment_variable_turns_it_on():
    env = dict(os.environ, FLASH_ATTN_DET_CHECK_INDICES="1")
    out = subprocess.run([sys.executable, "-c", "import flash_attn_det as f; print(f.get_index_checks())"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def _decode_case(gen):
    B, cap, H, Hk, D = 3, 256, 4, 2, 64
    q = randn(gen, (B, 1, H, D), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    kn, vn = (randn(gen, (B, 1, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    return q, kc, vc, kn, vn


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_kvcache_bad_lengths_raise_before_the_append_gpu():
    gen = make_gen(101)
    q, kc, vc, kn, vn = _decode_case(gen)
    bad = i32([10, 256, 7])  # sequence 1: the appended token would land past the 256 rows
    # default: trusted, the bad sequence comes back NaN
    out = fad.flash_attn_with_kvcache(q, kc.clone(), vc.clone(), cache_seqlens=i32([10, 300, 7]))
    torch.cuda.synchronize()
    assert out[1].isnan().all() and torch.isfinite(out[0]).all()
    fad.set_index_checks(True)
    k0, v0 = kc.clone(), vc.clone()
    with pytest.raises(ValueError, match="^cache_seqlens: sequence 1 ends at 257"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=kn, v=vn, cache_seqlens=bad)
    assert torch.equal(kc, k0) and torch.equal(vc, v0), "a refused call wrote into the cache"
    with pytest.raises(ValueError, match="^cache_batch_idx: sequence 2 names cache entry 5"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([10, 20, 7]),
                                    cache_batch_idx=i32([0, 1, 5]))
    with pytest.raises(ValueError, match="^cache_leftpad: sequence 0 starts at 11"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([10, 20, 7]),
                                    cache_leftpad=i32([11, 0, 0]))
    # valid calls give the unchecked bits
    good = dict(cache_seqlens=i32([10, 200, 7]), cache_leftpad=i32([3, 0, 1]))
    checked = fad.flash_attn_with_kvcache(q, kc, vc, **good)
    fad.set_index_checks(False)
    assert torch.equal(checked, fad.flash_attn_with_kvcache(q, kc, vc, **good))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_paged_bad_block_raises_gpu():
    gen = make_gen(102)
    q = randn(gen, (2, 1, 4, 64), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (6, 16, 2, 64), torch.bfloat16, "cuda") for _ in range(2))
    table = i32([[0, 1, 2], [3, 9, 4]])  # sequence 1's second page does not exist
    fad.set_index_checks(True)
    with pytest.raises(ValueError, match="^block_table: sequence 1 names block 9"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([40, 40]), block_table=table)
    out = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([40, 16]), block_table=table)
    assert torch.isfinite(out).all()  # only the pages a sequence reaches are checked


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_varlen_bad_cu_seqlens_raise_forward_and_backward_gpu():
    gen = make_gen(103)
    q, k, v = (randn(gen, (30, 2, 64), torch.bfloat16, "cuda") for _ in range(3))
    cu = i32([0, 10, 30])
    fad.set_index_checks(True)
    with pytest.raises(ValueError, match="^cu_seqlens_q: sequence 1 has rows \\[10, 40\\)"):
        fad.flash_attn_varlen_func(q, k, v, i32([0, 10, 40]), cu, 30, 20)
    with pytest.raises(ValueError, match="^cu_seqlens_k: sequence 1 has rows \\[25, 20\\)"):
        fad.flash_attn_varlen_func(q, k, v, cu, i32([0, 25, 20]), 20, 25)
    # the backward checks too: lengths that went bad between the forward and the backward
    qg, kg, vg = (x.clone().requires_grad_() for x in (q, k, v))
    cu_k = cu.clone()
    out = fad.flash_attn_varlen_func(qg, kg, vg, cu, cu_k, 20, 20, causal=True)
    cu_k[1] = 35
    with pytest.raises(ValueError, match="^cu_seqlens_k: sequence 0"):
        out.float().sum().backward()
