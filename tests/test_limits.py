"""The API's limits: every shape within them gives the right answer, every shape past them a
named refusal before anything is allocated or written.

- Write targets whose elements overlap in memory (k_cache/v_cache of an append, out, dq/dk/dv)
  are refused by name on every device, nothing written (glue.c, check_no_overlap).
- Sizes past int32 (a dim, q's rows, a total token count) and a workspace larger than the
  device are a ValueError naming the argument and the limit, before torch allocates.
- Long key sequences (up to 2**31 - 1 keys), batch x heads and split counts past 65535 and
  varlen batches of more than 65535 sequences run on the GPU with the exact answer: k/v are
  one row expand()ed (stride 0), so every key scores q.k and output = v's row,
  lse = log(n) + q.k * scale.
GPU tests are marked gpu (and skip without CUDA); each keeps to a few GB and seconds.
"""
import math

import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import _C

from conftest import DEVICES, make_gen, randn, requires_cuda

BF = torch.bfloat16
INT32_MAX = 2 ** 31 - 1


def gpu(f):
    return pytest.mark.gpu(requires_cuda(f))


def _overlapping(shape, dtype, device, dim, stride):
    """A view of a fresh buffer with `shape`, row-major strides except dim's, set to `stride`
    (shorter than the dims inside it: elements share memory)."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    strides[dim] = stride
    size = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    gen = make_gen(3)
    return randn(gen, (size,), dtype, device).as_strided(shape, strides)


# --- write targets that overlap themselves ------------------------------------

B, CAP, HK, H, D, NEW = 2, 32, 2, 4, 16, 3

OVERLAPS = {  # name: (make the bad tensor from the good one's shape, message)
    "half-row heads": (lambda shape, dev: _overlapping(shape, BF, dev, 2, D // 2),
                       "its elements overlap in memory"),
    "rows share heads": (lambda shape, dev: _overlapping(shape, BF, dev, 1, D),
                         "its elements overlap in memory"),
    "stride 0": (lambda shape, dev: randn(make_gen(4), (1,) + shape[1:], BF, dev).expand(shape),
                 "dim 0 has stride 0"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("target", ["k_cache", "v_cache"])
@pytest.mark.parametrize("kind", sorted(OVERLAPS))
def test_overlapping_cache_refused_before_any_write(device, target, kind):
    make, text = OVERLAPS[kind]
    gen = make_gen(5)
    kw = dict(q=randn(gen, (B, 1, H, D), BF, device),
              k_cache=randn(gen, (B, CAP, HK, D), BF, device),
              v_cache=randn(gen, (B, CAP, HK, D), BF, device),
              k=randn(gen, (B, NEW, HK, D), BF, device), v=randn(gen, (B, NEW, HK, D), BF, device),
              cache_seqlens=torch.tensor([5, 9], dtype=torch.int32, device=device), causal=True)
    kw[target] = make((B, CAP, HK, D), device)
    before = {n: t.clone() for n, t in kw.items() if isinstance(t, torch.Tensor)}
    with pytest.raises(ValueError, match=f"^{target}: {text}"):
        fad.flash_attn_with_kvcache(**kw)
    for n, t in before.items():
        assert torch.equal(kw[n], t), f"{n} changed by a call that raised"


@pytest.mark.parametrize("device", DEVICES)
def test_overlapping_cache_with_odd_head_dim_refused(device):
    """The padded path (head dim not a multiple of 8) refuses before its padded copies hide
    the overlap."""
    gen = make_gen(6)
    Dp = 12
    kc = _overlapping((B, CAP, HK, Dp), BF, device, 1, Dp)
    vc = randn(gen, (B, CAP, HK, Dp), BF, device)
    before = kc.clone()
    with pytest.raises(ValueError, match="^k_cache: its elements overlap"):
        fad.flash_attn_with_kvcache(randn(gen, (B, 1, H, Dp), BF, device), kc, vc,
                                    randn(gen, (B, 1, HK, Dp), BF, device),
                                    randn(gen, (B, 1, HK, Dp), BF, device), cache_seqlens=2)
    assert torch.equal(kc, before)


def test_overlap_check_accepts_views_that_do_not_overlap():
    """What check_no_overlap accepts: every strided view that does not overlap, as torch and a
    KV cache lay them out (row-major, transposed, sliced, permuted, a padded last dim)."""
    t = torch.zeros(3, 8, 4, 16, dtype=BF)
    for view in (t, t.transpose(1, 2), t[:, ::3], t[1:, 2:5], t.permute(2, 0, 1, 3),
                 torch.zeros(3, 8, 4, 24, dtype=BF)[..., :16], t[:, :1], t[:0]):
        _C.check_writable(view, "x")


def test_overlap_check_refuses_what_overlaps():
    t = torch.zeros(64, dtype=BF)
    for view in (t.as_strided((4, 8), (4, 1)), t.as_strided((2, 3, 8), (8, 0, 1)),
                 t.as_strided((4, 2, 8), (8, 8, 1))):
        with pytest.raises(ValueError, match="^x: "):
            _C.check_writable(view, "x")
    # conservative: an interleaving without overlap (offsets 0, 2, 4, 3, 5, 7) is refused too
    with pytest.raises(ValueError, match="^x: its elements overlap"):
        _C.check_writable(t.as_strided((3, 2), (2, 3)), "x")


def _fwd_args(q, k, v, out):
    """_C.fwd's arguments for a plain call (no lse, default options; the workspace the CUDA
    entry asks for is not given: these calls are refused before that)."""
    return (q, k, v, out, None, None, None, q.shape[-1] ** -0.5, 0.0, -1, -1, 0, 1, 512,
            _C.SCHEDULE_AUTO, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_overlapping_out_refused(device):
    gen = make_gen(7)
    q = randn(gen, (1, 4, 2, D), BF, device)
    k = randn(gen, (1, 8, 2, D), BF, device)
    out = _overlapping(q.shape, BF, device, 2, 8)
    before = out.clone()
    with pytest.raises(ValueError, match="^out: its elements overlap"):
        _C.fwd(*_fwd_args(q, k, k, out))
    assert torch.equal(out, before)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", ["dq", "dk", "dv"])
def test_overlapping_gradient_refused(device, grad):
    """dq/dk/dv take the strides of q/k/v: a stride-0 (expand()ed) k is read fine by the
    forward, but its gradient written with those strides would overlap."""
    gen = make_gen(8)
    shape = (2, 8, 2, D)
    t = {n: randn(gen, shape, BF, device) for n in ("q", "k", "v", "dout")}
    src = {"dq": "q", "dk": "k", "dv": "v"}[grad]
    t[src] = t[src][:1].expand(shape)  # a stride-0 operand, read only
    out, lse, _ = fad.flash_attn_func(t["q"], t["k"], t["v"], return_attn_probs=True)
    g = {n: torch.zeros(shape, dtype=BF, device=device) for n in ("dq", "dk", "dv")}
    g[grad] = g[grad][:1].expand(shape)
    ws = (torch.empty(lse.numel() * 4, dtype=torch.uint8, device=device)
          if device == "cuda" else None)
    stream = torch.cuda.current_stream().cuda_stream if device == "cuda" else 0
    with pytest.raises(ValueError, match=f"^{grad}: dim 0 has stride 0"):
        _C.bwd(t["dout"], g["dq"], g["dk"], g["dv"], t["q"], t["k"], t["v"], out, lse, None, ws,
               D ** -0.5, 0.0, -1, -1, 0, 1, 512, _C.SCHEDULE_AUTO, stream)
    assert all(not x.any() for x in g.values())


# --- sizes past the limits ----------------------------------------------------

def _row(device, *shape):
    """A tensor of `shape` that is one random row expand()ed: no memory behind its length."""
    return randn(make_gen(9), (1,) * (len(shape) - 1) + shape[-1:], BF, device).expand(*shape)


def _cu(device, *lens):
    return torch.tensor([0] + list(lens), dtype=torch.int32, device=device).cumsum(0).int()


N = 2 ** 31
OVERSIZED = {  # name: (call(device), the message's start)
    "q seqlen": (lambda d: fad.flash_attn_func(_row(d, 1, N, 2, 64), _row(d, 1, 16, 2, 64),
                                               _row(d, 1, 16, 2, 64)), "q: dim 1 is 2147483648"),
    "q seqlen, odd head dim": (lambda d: fad.flash_attn_func(
        _row(d, 1, N, 2, 60), _row(d, 1, 16, 2, 60), _row(d, 1, 16, 2, 60)),
        "q: dim 1 is 2147483648"),
    "q seqlen, autograd": (lambda d: fad.flash_attn_func(
        _row(d, 1, N, 2, 64).detach().requires_grad_(), _row(d, 1, 16, 2, 64),
        _row(d, 1, 16, 2, 64)), "q: dim 1 is 2147483648"),
    "q batch": (lambda d: fad.flash_attn_func(_row(d, N, 1, 2, 64), _row(d, N, 1, 2, 64),
                                              _row(d, N, 1, 2, 64)), "q: dim 0 is 2147483648"),
    "q heads": (lambda d: fad.flash_attn_func(_row(d, 1, 1, N, 64), _row(d, 1, 1, 1, 64),
                                              _row(d, 1, 1, 1, 64)), "q: dim 2 is 2147483648"),
    "q rows": (lambda d: fad.flash_attn_func(_row(d, 2 ** 16, 2 ** 12, 2 ** 4, 64),
                                             _row(d, 2 ** 16, 16, 2, 64),
                                             _row(d, 2 ** 16, 16, 2, 64)),
               "q: 4294967296 rows"),
    "k seqlen": (lambda d: fad.flash_attn_func(_row(d, 1, 1, 2, 64), _row(d, 1, N, 2, 64),
                                               _row(d, 1, N, 2, 64)), "k: dim 1 is 2147483648"),
    "varlen total_q": (lambda d: fad.flash_attn_varlen_func(
        _row(d, N, 2, 64), _row(d, 16, 2, 64), _row(d, 16, 2, 64), _cu(d, 16), _cu(d, 16), 16, 16),
        "q: dim 0 is 2147483648"),
    "varlen total_q x heads": (lambda d: fad.flash_attn_varlen_func(
        _row(d, 2 ** 28, 16, 64), _row(d, 16, 2, 64), _row(d, 16, 2, 64), _cu(d, 16), _cu(d, 16),
        16, 16), "q: 4294967296 rows"),
    "varlen total_k": (lambda d: fad.flash_attn_varlen_func(
        _row(d, 16, 2, 64), _row(d, N, 2, 64), _row(d, N, 2, 64), _cu(d, 16), _cu(d, 16), 16, 16),
        "k: dim 0 is 2147483648"),
    "kvcache q seqlen": (lambda d: fad.flash_attn_with_kvcache(
        _row(d, 1, N, 2, 64), torch.zeros(1, 16, 2, 64, dtype=BF, device=d),
        torch.zeros(1, 16, 2, 64, dtype=BF, device=d), cache_seqlens=4), "q: dim 1 is 2147483648"),
    "kvcache capacity": (lambda d: fad.flash_attn_with_kvcache(
        _row(d, 1, 1, 2, 64), _row(d, 1, N, 2, 64), _row(d, 1, N, 2, 64), cache_seqlens=4),
        "k_cache: dim 1 is 2147483648"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(OVERSIZED))
def test_oversized_refused_before_allocation(device, name):
    """Each call's tensors are expand()ed views (a few KB): the refusal must come before out or
    a copy is allocated (else torch raises its out-of-memory error, not this ValueError)."""
    call, text = OVERSIZED[name]
    with pytest.raises(ValueError, match="^" + text + ".*2\\*\\*31 - 1"):
        call(device)


@gpu
def test_workspace_larger_than_device_refused():
    """num_splits > 1 asks for a CTA per split: 2**31 - 1 keys in 512-key splits for 256 query
    heads is ~2**22 splits x 256 rows of fp32 partials, more than any device holds."""
    d = "cuda"
    q = randn(make_gen(10), (1, 1, 256, 64), BF, d)
    kc = _row(d, 1, INT32_MAX, 1, 64)
    with pytest.raises(ValueError, match="^workspace: .* more than the device's"):
        fad.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=INT32_MAX, num_splits=2)
