"""flash_attn_with_kvcache's append + rotary kernel (csrc/cuda/append.cu) against the torch-op
version that the CPU path runs (interface._kvcache_append): the same bits for the rotated
queries and for every cache row, contiguous and paged, and no write outside the rows a
sequence owns. GPU only; the CPU path's own tests are in test_kvcache.py."""
import pytest
import torch

from flash_attn_det import interface as I

from conftest import HAS_CUDA, make_gen, randn

pytestmark = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")


def i32(xs, device):
    return torch.tensor(xs, dtype=torch.int32, device=device)


def run_both(q, kc, vc, k, v, cos, sin, seqlens, batch_idx, interleaved, per_row, table=None):
    """(q_rot, k_cache, v_cache, seqlens_out) from the CPU torch ops and from the kernel."""
    outs = []
    for dev in ("cpu", "cuda"):
        mv = (lambda t: None if t is None else t.to(dev))
        kc_d, vc_d = kc.clone().to(dev), vc.clone().to(dev)
        q_rot, new_lens = I._kvcache_append(mv(q), kc_d, vc_d, mv(k), mv(v), mv(cos), mv(sin),
                                            mv(seqlens), mv(batch_idx), interleaved,
                                            per_row, mv(table))
        torch.cuda.synchronize()
        outs.append([t.cpu() for t in (q_rot, kc_d, vc_d, new_lens)])
    return outs


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("rot_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("per_row", [True, False])
def test_append_kernel_equals_torch_ops(interleaved, rot_dtype, per_row):
    gen = make_gen(71)
    B, Sq, Snew, H, Hk, D, rd, cap = 3, 4, 4, 8, 2, 128, 64, 40
    q = randn(gen, (B, Sq, H, D), torch.bfloat16)
    k, v = (randn(gen, (B, Snew, Hk, D), torch.bfloat16) for _ in range(2))
    kc, vc = (randn(gen, (4, cap, Hk, D), torch.bfloat16) for _ in range(2))
    theta = torch.rand((64, rd // 2), generator=gen, dtype=torch.float64) * 6.28
    cos, sin = theta.cos().to(rot_dtype), theta.sin().to(rot_dtype)
    seqlens, batch_idx = i32([5, 0, 30], "cpu"), i32([3, 0, 1], "cpu")
    (cq, ck, cv, cl), (gq, gk, gv, gl) = run_both(q, kc, vc, k, v, cos, sin, seqlens, batch_idx,
                                                  interleaved, per_row)
    assert torch.equal(cl, gl) and torch.equal(gl, seqlens + Snew)
    assert torch.equal(cq, gq), "rotated q differs"
    assert torch.equal(ck, gk) and torch.equal(cv, gv), "cache contents differ"
    assert not torch.equal(ck, kc), "nothing was appended"


@pytest.mark.parametrize("page", [16, 48])
def test_paged_append_kernel_equals_torch_ops(page):
    gen = make_gen(72)
    B, Sq, Snew, H, Hk, D, rd, pages = 2, 1, 3, 4, 4, 64, 64, 9
    q = randn(gen, (B, Sq, H, D), torch.float16)
    k, v = (randn(gen, (B, Snew, Hk, D), torch.float16) for _ in range(2))
    kc, vc = (randn(gen, (pages, page, Hk, D), torch.float16) for _ in range(2))
    theta = torch.rand((200, rd // 2), generator=gen, dtype=torch.float64) * 6.28
    cos, sin = theta.cos().to(torch.float16), theta.sin().to(torch.float16)
    table = i32([[4, 0, 7, 2], [8, 1, 3, 5]], "cpu")
    seqlens = i32([page - 1, 2 * page + 5], "cpu")  # the first sequence's rows cross a page
    (cq, ck, cv, cl), (gq, gk, gv, gl) = run_both(q, kc, vc, k, v, cos, sin, seqlens, None,
                                                  True, True, table)
    assert torch.equal(cq, gq) and torch.equal(ck, gk) and torch.equal(cv, gv)
    assert torch.equal(cl, gl)


def test_append_past_the_cache_writes_nothing_outside_it():
    """A sequence whose new rows pass the capacity, or whose entry does not exist, writes no
    row of any entry (the torch ops clamp; the kernel skips, and the attention says NaN)."""
    gen = make_gen(73)
    B, Snew, Hk, D, cap = 3, 3, 2, 64, 10
    q = randn(gen, (B, 1, 2, D), torch.bfloat16, "cuda")
    k, v = (randn(gen, (B, Snew, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    kc, vc = (randn(gen, (3, cap, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    kc0, vc0 = kc.clone(), vc.clone()
    seqlens, batch_idx = i32([8, 1, 0], "cuda"), i32([0, 1, 7], "cuda")  # 8+3 > 10; entry 7 absent
    _, new_lens = I._kvcache_append(q, kc, vc, k, v, None, None, seqlens, batch_idx, True, False)
    torch.cuda.synchronize()
    assert torch.equal(new_lens, seqlens + Snew)
    assert torch.equal(kc[0, :8], kc0[0, :8]) and torch.equal(kc[0, 8:], k[0, :2])  # rows 8, 9 only
    assert torch.equal(kc[1, 1:4], k[1]) and torch.equal(vc[1, 1:4], v[1])
    assert torch.equal(kc[2], kc0[2]) and torch.equal(vc[2], vc0[2])  # nobody owns entry 2
