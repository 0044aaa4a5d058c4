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

import numpy as np

import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import _C
from flash_attn_det.testing import force_schedule

from conftest import make_gen, randn, requires_cuda, workspace_bytes

BF = torch.bfloat16
INT32_MAX = 2 ** 31 - 1


def gpu(f):
    return pytest.mark.gpu(requires_cuda(f))


# the CPU path here, the kernels' on a GPU (marked gpu)
DEVICES = ["cpu", pytest.param("cuda", marks=[requires_cuda, pytest.mark.gpu])]


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
    """num_splits > 1 asks for a CTA per split: the longest cache the API takes (2**31 - 2**16
    keys: the key limit's own refusal comes first past it) in 512-key splits for 256 query heads
    is ~2**22 splits x 256 rows of fp32 partials (~280 GB), more than any device holds."""
    d = "cuda"
    n = 2 ** 31 - 2 ** 16
    q = randn(make_gen(10), (1, 1, 256, 64), BF, d)
    kc = _row(d, 1, n, 1, 64)
    with pytest.raises(ValueError, match="^workspace: .* more than the device's"):
        fad.flash_attn_with_kvcache(q, kc, kc, cache_seqlens=n, num_splits=2)


# --- long sequences, large grids (GPU) ----------------------------------------

def _one_row_kv(n, Hk, D, gen, device="cuda"):
    """k, v (1, n, Hk, D): one random row each, expand()ed along the keys (stride 0)."""
    k = randn(gen, (1, 1, Hk, D), BF, device)
    v = randn(gen, (1, 1, Hk, D), BF, device)
    return k, v, k.expand(1, n, Hk, D), v.expand(1, n, Hk, D)


def _check_one_row_answer(out, lse, q, k, v, n):
    """Every key scores q.k alike: each query row's out = v's row (2 bf16 steps of it, the
    suite's short-length tolerance), lse = log(n) + q.k / sqrt(D) (fp32 dots and logs: 1e-3)."""
    H, Hk, D = q.shape[2], k.shape[2], q.shape[3]
    G = H // Hk
    kk = k[0, 0].float().repeat_interleave(G, 0)  # (H, D): query head h reads kv head h // G
    vv = v[0, 0].float().repeat_interleave(G, 0)
    want_lse = math.log(n) + (q[0].float() * kk).sum(-1).double().T * D ** -0.5  # (H, Sq)
    err = (out[0].float() - vv).abs().max().item()
    assert err <= 2 * 2 ** -8 * vv.abs().max().item(), f"n={n}: out off by {err}"
    lse_err = (lse[0].double() - want_lse).abs().max().item()
    assert lse_err <= 1e-3, f"n={n}: lse off by {lse_err}"


# 2**25 keys in 512-key splits: 65536 splits, one past grid z's limit (the launch error at
# 2**25..2**27); 2**27: 2**18 splits.
LONG = [2 ** 25, 2 ** 26, 2 ** 27]


@gpu
@pytest.mark.parametrize("n", LONG)
@pytest.mark.parametrize("schedule", ["auto", "cta_per_split"])
def test_long_keys_flash_attn_func(n, schedule):
    gen = make_gen(20)
    q = randn(gen, (1, 1, 2, 64), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 2, 64, gen)
    with force_schedule(schedule):
        out, lse, _ = fad.flash_attn_func(q, kx, vx, return_attn_probs=True)
    _check_one_row_answer(out, lse, q, k, v, n)


@gpu
@pytest.mark.parametrize("n", LONG)
@pytest.mark.parametrize("num_splits", [0, 2])
def test_long_keys_kvcache(n, num_splits):
    """A decode row over an n-key cache (GQA 8:1), the cache an expand()ed row (read only)."""
    gen = make_gen(21)
    q = randn(gen, (1, 1, 8, 64), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 1, 64, gen)
    out, lse = fad.flash_attn_with_kvcache(q, kx, vx, cache_seqlens=n, num_splits=num_splits,
                                           return_softmax_lse=True)
    _check_one_row_answer(out, lse, q, k, v, n)


@gpu
@pytest.mark.parametrize("schedule", ["auto", "cta_per_split"])
def test_long_keys_prefill_kernels(schedule):
    """17 query rows (past the packed kernel's 16: the prefill kernels, mma.sync or the
    warp-specialized one) over 2**25 keys: 65536 splits of each row block on grid y and z."""
    gen = make_gen(28)
    n = 2 ** 25
    q = randn(gen, (1, 17, 2, 64), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 2, 64, gen)
    with force_schedule(schedule):
        out, lse, _ = fad.flash_attn_func(q, kx, vx, return_attn_probs=True)
    _check_one_row_answer(out, lse, q, k, v, n)


@gpu
def test_long_keys_num_splits_1_past_one_group():
    """num_splits=1 asks for one CTA a row block, and 2**25 keys are 2**16 splits, past one
    merge group (1024): the plan gives the call the prefill kernel's group walk (64 groups
    folded in two levels in one CTA, its X slots), and the answer is the exact one."""
    gen = make_gen(22)
    n = 2 ** 25
    q = randn(gen, (1, 1, 2, 64), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 2, 64, gen)
    out, lse = fad.flash_attn_with_kvcache(q, kx, vx, cache_seqlens=n, num_splits=1,
                                           return_softmax_lse=True)
    _check_one_row_answer(out, lse, q, k, v, n)


@gpu
@pytest.mark.parametrize("n", [2 ** 28, 2 ** 30, 2 ** 31 - 2 ** 16])
def test_long_keys_up_to_the_limit(n):
    """2**28 keys up to the last one the API takes, a CTA per split (4M CTAs on grid y and z
    at the limit; num_splits=2 asks for a CTA per split). Also the combine's
    error: out must stay within 2 bf16 steps of v's row whatever the number of splits."""
    gen = make_gen(23)
    q = randn(gen, (1, 1, 2, 64), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 1, 64, gen)
    out, lse = fad.flash_attn_with_kvcache(q, kx, vx, cache_seqlens=n, num_splits=2,
                                           return_softmax_lse=True)
    _check_one_row_answer(out, lse, q, k, v, n)


@gpu
@pytest.mark.parametrize("causal", [False, True])
def test_long_keys_backward(causal):
    """The backward over 2**25 keys (2**18 key blocks, one kv head, 3 query rows of GQA 2:1;
    causal: bottom-right, row i sees the first n - Sq + i + 1 keys). Every key scores alike,
    so P = 1/n and the exact gradients are dv_j = (sum of dout over the rows that see key j and their heads) / n, and
    dq = dk = 0 but for o's rounding: dq_i = scale * k * dout_i.(v - o_i), dk a 1/n part of
    that. dk and dv are leaves in k's full shape, so every key's gradient is checked."""
    gen = make_gen(29)
    n, Sq, H, D = 2 ** 25, 3, 2, 64
    q = randn(gen, (1, Sq, H, D), BF, "cuda").requires_grad_()
    k, v, kx, vx = _one_row_kv(n, 1, D, gen)
    kx, vx = kx.detach().requires_grad_(), vx.detach().requires_grad_()
    dout = randn(gen, (1, Sq, H, D), BF, "cuda")
    out = fad.flash_attn_func(q, kx, vx, causal=causal)
    out.backward(dout)
    torch.cuda.synchronize()
    scale = D ** -0.5
    vv, kk = v[0, 0, 0].double(), k[0, 0, 0].double()
    # row i sees keys 0 .. last[i] (bottom-right causal: n - Sq + i), each with weight 1/(last[i]+1)
    last = [n - Sq + i if causal else n - 1 for i in range(Sq)]
    d = dout[0].double().sum(1)  # (Sq, D): a row's dout summed over the heads of the kv group

    def dv_want(j):
        return sum(d[i] / (last[i] + 1) for i in range(Sq) if j <= last[i])

    # o's rounding bounds dq and dk: |dout_i.(v - o_i)| per (row, head)
    slack = (dout[0].double() * (vv - out[0].detach().double())).sum(-1).abs() + \
        2 ** -8 * dout[0].double().norm(dim=-1) * vv.norm()
    assert (q.grad[0].double().norm(dim=-1) <= 2 * scale * kk.norm() * slack + 1e-30).all()
    dk_bound = 2 * scale * (q[0].detach().double().norm(dim=-1) * slack).sum().item() / (n - Sq)
    step = 2 ** 22  # in chunks: an fp32 copy of a whole gradient is 8 GB
    for j in range(0, n, step):
        want = dv_want(j)  # the keys of a chunk that all rows see share it
        m = min(step, min(last) + 1 - j)
        dv = vx.grad[0, j:j + m, 0].double()
        assert ((dv - want).abs() <= 2 ** -7 * want.abs() + 1e-12).all(), j
        assert kx.grad[0, j:j + step, 0].double().abs().max().item() <= dk_bound + 1e-30, j
    for j in range(min(last) + 1, n):  # causal: the last keys, seen by fewer rows
        dv, want = vx.grad[0, j, 0].double(), dv_want(j)
        assert ((dv - want).abs() <= 2 ** -7 * want.abs() + 1e-12).all(), j


@pytest.mark.parametrize("device", DEVICES)
def test_keys_past_the_limit_refused(device):
    """The kernels walk a sequence's keys in int, a few tiles past its end: the last 2**16
    keys below 2**31 are headroom, refused by name."""
    gen = make_gen(24)
    q = randn(gen, (1, 1, 2, 64), BF, device)
    _, _, kx, vx = _one_row_kv(INT32_MAX, 1, 64, gen, device)
    with pytest.raises(ValueError, match="^k: seqlen: 2147483647 keys in a sequence, past"):
        fad.flash_attn_func(q, kx, vx)
    with pytest.raises(ValueError, match="^k_cache: seqlen: 2147483647 keys in a sequence"):
        fad.flash_attn_with_kvcache(q, kx, vx, cache_seqlens=INT32_MAX)


def _assert_reference(out, lse, q, k, v, label):
    """out (Sq, H, D), lse (H, Sq) of one sequence q (Sq, H, D), k, v (Sk, Hk, D) against
    float64 attention: a few bf16 steps of out, fp32 accuracy of lse."""
    G = q.shape[1] // k.shape[1]
    qf, kf, vf = (t.double() for t in (q, k, v))
    kf, vf = kf.repeat_interleave(G, 1), vf.repeat_interleave(G, 1)
    s = torch.einsum("ihd,jhd->hij", qf, kf) * q.shape[-1] ** -0.5
    ref = torch.einsum("hij,jhd->ihd", s.softmax(-1), vf)
    assert (out.double() - ref).abs().max().item() < 2 ** -7, label
    assert (lse.double() - s.logsumexp(-1)).abs().max().item() < 1e-4, label


@gpu
@pytest.mark.parametrize("schedule", ["auto", "cta_per_split"])
def test_batch_times_heads_past_65535(schedule):
    """B x H = 2**17 (grid x carries them: FlashAttention-2's grid y fails past 65535), 8
    splits a row: every sampled sequence has the bits it has alone and the float64 answer."""
    fad.set_deterministic_mode(True, split_size=128)
    gen = make_gen(25)
    B, H, Hk, Sk, D = 2 ** 12, 32, 1, 1024, 64
    q = randn(gen, (B, 1, H, D), BF, "cuda")
    k = randn(gen, (B, Sk, Hk, D), BF, "cuda")
    v = randn(gen, (B, Sk, Hk, D), BF, "cuda")
    with force_schedule(schedule):
        out, lse, _ = fad.flash_attn_func(q, k, v, return_attn_probs=True)
        for b in (0, 1, B // 2, B - 1):
            one, one_lse, _ = fad.flash_attn_func(q[b:b + 1], k[b:b + 1], v[b:b + 1],
                                                  return_attn_probs=True)
            assert torch.equal(out[b:b + 1], one) and torch.equal(lse[b:b + 1], one_lse), b
            _assert_reference(out[b], lse[b], q[b], k[b], v[b], b)
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


@gpu
def test_kvcache_batch_times_heads_past_65535():
    """Decode over a cache with B x H = 2**17 (GQA 4:1), mixed lengths."""
    fad.set_deterministic_mode(True, split_size=128)
    gen = make_gen(26)
    B, H, Hk, cap, D = 2 ** 13, 16, 4, 512, 64
    q = randn(gen, (B, 1, H, D), BF, "cuda")
    kc = randn(gen, (B, cap, Hk, D), BF, "cuda")
    vc = randn(gen, (B, cap, Hk, D), BF, "cuda")
    lens = torch.randint(1, cap + 1, (B,), generator=gen, dtype=torch.int32).cuda()
    out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, return_softmax_lse=True)
    for b in (0, 7, B // 3, B - 1):
        n = int(lens[b])
        _assert_reference(out[b], lse[b], q[b], kc[b, :n], vc[b, :n], b)


@gpu
@pytest.mark.parametrize("schedule", ["auto", "cta_per_split"])
def test_varlen_more_than_65535_sequences(schedule):
    """2**17 + 5 sequences in one varlen batch (one of them 4096 keys long, so its rows take
    32 splits), each with the bits it has alone and the float64 answer."""
    fad.set_deterministic_mode(True, split_size=128)
    gen = make_gen(27)
    nseq, H, Hk, D = 2 ** 17 + 5, 4, 2, 64
    lq = torch.randint(1, 4, (nseq,), generator=gen)
    lk = torch.randint(4, 48, (nseq,), generator=gen)  # (>= lq: every causal row sees a key)
    lq[nseq // 2], lk[nseq // 2] = 8, 4096
    cu_q = torch.cat([torch.zeros(1, dtype=torch.long), lq.cumsum(0)]).int().cuda()
    cu_k = torch.cat([torch.zeros(1, dtype=torch.long), lk.cumsum(0)]).int().cuda()
    q = randn(gen, (int(lq.sum()), H, D), BF, "cuda")
    k = randn(gen, (int(lk.sum()), Hk, D), BF, "cuda")
    v = randn(gen, (int(lk.sum()), Hk, D), BF, "cuda")
    with force_schedule(schedule):
        out, lse, _ = fad.flash_attn_varlen_func(q, k, v, cu_q, cu_k, int(lq.max()), int(lk.max()),
                                                 causal=True, return_attn_probs=True)
        for b in (0, 1, nseq // 2, 70000, nseq - 1):
            qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
            one, one_lse, _ = fad.flash_attn_func(q[qs][None], k[ks][None], v[ks][None],
                                                  causal=True, return_attn_probs=True)
            assert torch.equal(out[qs], one[0]) and torch.equal(lse[:, qs], one_lse[0]), b
    assert torch.isfinite(out).all() and torch.isfinite(lse).all()


# --- the combine's error, bounded whatever the number of splits ----------------

def _fold(m, l, o, first=0):
    """The CPU path's fold of one row's split states (fad_cpu_fold_splits): (m, l, o)."""
    out = torch.empty(o.shape[1] + 2)
    _C.fold_splits(m.contiguous(), l.contiguous(), o.contiguous(), out, first)
    return out[0].item(), out[1], out[2:]


def _fold_error(n, gen, D=8):
    """A row of n splits with random states (max within the merge's slack, so that the
    weights are powers of two apart from exp2's rounding): the fold's relative error in
    out and its absolute error in lse (log2 units), against float64."""
    v = torch.randn(D, generator=gen)
    m = torch.rand(n, generator=gen) * 4
    l = 256 + 256 * torch.rand(n, generator=gen)
    o = l[:, None] * (v + 0.01 * torch.randn(n, D, generator=gen))
    mr, lr, orow = _fold(m, l, o)
    w = torch.exp2(m.double())
    want = (w[:, None] * o.double()).sum(0) / (w * l.double()).sum()
    err = ((orow.double() / lr.double() - want).abs().max() / want.abs().max()).item()
    lse_err = abs(mr + math.log2(lr.item()) - torch.log2((w * l.double()).sum()).item())
    return err, lse_err


def test_fold_error_bounded_whatever_the_splits():
    """2**11 splits (2**20 keys in 512-key splits) and 2**21 (2**30 keys): the two-level
    fold keeps both within fp32's few roundings (one running sum over 2**21 splits loses
    about one rounding of the sum per split: 2**21 x 2**-24)."""
    gen = make_gen(30)
    errs = {n: _fold_error(n, gen) for n in (2 ** 11, 2 ** 21)}
    for n, (err, lse_err) in errs.items():
        assert err < 2 ** -18 and lse_err < 2 ** -18, (n, err, lse_err)


def test_fold_exact_where_one_chain_is_not():
    """Every split the same state (a row over keys that all score alike, as the GPU tests'
    expanded k/v): 2**21 splits of 512 keys fold to exactly v, as 2**11 do, where one
    running sum of the 2**21 o values is off by about 2% (numpy's accumulate: sequential)."""
    gen = make_gen(31)
    v = randn(gen, (16,), BF, "cpu").float()
    for n in (2 ** 11, 2 ** 21):
        m, l, o = torch.zeros(n), torch.full((n,), 512.0), (512 * v).expand(n, 16)
        mr, lr, orow = _fold(m, l, o)
        assert mr == 0 and lr.item() == 512.0 * n and torch.equal(orow / lr, v), n
    one_chain = np.add.accumulate(np.full(2 ** 21, np.float32(512 * 0.7734375)))[-1]
    assert abs(one_chain / np.float32(2 ** 30) - 0.7734375) > 1e-2


def test_fold_order_is_one_chain_within_a_group():
    """The order itself, with every max alike (weights exactly 1: each merge one fp32 add):
    up to 1024 splits from split 0 the one chain's bits; a row that crosses a group boundary
    (splits 1000 .. 1099) the chain of each group, then the groups' sum."""
    gen = make_gen(32)
    n, D = 1100, 8
    m, l = torch.zeros(n), 1 + torch.rand(n, generator=gen)
    o = torch.randn(n, D, generator=gen)
    chain = lambda x: torch.as_tensor(np.asarray(np.add.accumulate(x.numpy(), axis=0)[-1]))
    _, lr, orow = _fold(m[:1024], l[:1024], o[:1024])
    assert torch.equal(orow, chain(o[:1024])) and torch.equal(lr, chain(l[:1024]))
    _, lr, orow = _fold(m[:100], l[:100], o[:100], first=1000)
    want = chain(o[:24]) + chain(o[24:100])
    assert torch.equal(orow, want) and torch.equal(lr, chain(l[:24]) + chain(l[24:100]))


def test_fold_splits_refuses_bad_arguments():
    with pytest.raises(ValueError, match="^o: must be a 2-dim float32 CPU tensor"):
        _C.fold_splits(torch.zeros(2), torch.zeros(2), torch.zeros(2), torch.zeros(3), 0)
    with pytest.raises(ValueError, match="^m, l, o, out: shapes"):
        _C.fold_splits(torch.zeros(2), torch.zeros(3), torch.zeros(2, 4), torch.zeros(6), 0)
    with pytest.raises(ValueError, match="^first, n, D"):
        _C.fold_splits(torch.zeros(2), torch.zeros(2), torch.zeros(2, 4), torch.zeros(6), -1)


def _one_row_error(out, lse, q, k, v, n):
    """(max |out - v's row|, max |lse - exact|) of a call over n expand()ed keys."""
    H, Hk, D = q.shape[2], k.shape[2], q.shape[3]
    kk = k[0, 0].float().repeat_interleave(H // Hk, 0)
    vv = v[0, 0].float().repeat_interleave(H // Hk, 0)
    want_lse = math.log(n) + (q[0].float() * kk).sum(-1).double().T * D ** -0.5
    return ((out[0].float() - vv).abs().max().item(),
            (lse[0].double() - want_lse).abs().max().item())


# A CTA per split (the combine), asked for explicitly (at 2**30 keys a one-CTA plan would walk
# 2**24 tiles in one CTA); the one-CTA group walk's own test is
# test_one_cta_request_across_groups_error_bounded.
LONG_CALLS = {  # name: (call(q, kx, vx, n) -> (out, lse), query heads, kv heads)
    "func cta_per_split": (lambda q, kx, vx, n: _forced("cta_per_split", fad.flash_attn_func, q,
                                                         kx, vx, return_attn_probs=True)[:2], 2, 2),
    "kvcache num_splits=2": (lambda q, kx, vx, n: fad.flash_attn_with_kvcache(
        q, kx, vx, cache_seqlens=n, num_splits=2, return_softmax_lse=True), 8, 1),
}


def _forced(schedule, fn, *args, **kw):
    with force_schedule(schedule):
        return fn(*args, **kw)


@gpu
@pytest.mark.parametrize("name", sorted(LONG_CALLS))
def test_long_keys_error_no_larger_at_2_30_than_at_2_20(name):
    """The combine's error does not grow with the number of splits: 2**30 keys (2**21 splits
    of 512) give an out and lse no further from the exact answer than 2**20 keys (2**11)."""
    call, H, Hk = LONG_CALLS[name]
    gen = make_gen(33)
    q = randn(gen, (1, 1, H, 64), BF, "cuda")
    errs = {}
    for n in (2 ** 20, 2 ** 30):
        k, v, kx, vx = _one_row_kv(n, Hk, 64, gen)
        out, lse = call(q, kx, vx, n)
        errs[n] = _one_row_error(out, lse, q, k, v, n)
        _check_one_row_answer(out, lse, q, k, v, n)
    assert errs[2 ** 30][0] <= errs[2 ** 20][0], errs
    assert errs[2 ** 30][1] <= max(errs[2 ** 20][1], 1e-5), errs


@gpu
@pytest.mark.parametrize("entry", ["func", "kvcache"])
def test_one_cta_request_across_groups_error_bounded(entry):
    """A one-CTA request (forced schedule, num_splits=1) past 1024 splits runs the prefill
    kernel's group walk, which closes a group every 1024 splits: at 128-key splits 2**25 keys
    are 256 groups in one CTA, with the exact answer as at 2**20 (8 groups)."""
    fad.set_deterministic_mode(True, split_size=128)
    gen = make_gen(34)
    q = randn(gen, (1, 1, 2, 64), BF, "cuda")
    errs = {}
    for n in (2 ** 20, 2 ** 25):
        k, v, kx, vx = _one_row_kv(n, 1 if entry == "kvcache" else 2, 64, gen)
        if entry == "func":
            out, lse, _ = _forced("one_cta", fad.flash_attn_func, q, kx, vx, return_attn_probs=True)
        else:
            out, lse = fad.flash_attn_with_kvcache(q, kx, vx, cache_seqlens=n, num_splits=1,
                                                   return_softmax_lse=True)
        errs[n] = _one_row_error(out, lse, q, k, v, n)
        _check_one_row_answer(out, lse, q, k, v, n)
    assert errs[2 ** 25][0] <= errs[2 ** 20][0], errs


GROUP_CASES = {  # name: (D, Sq, H, Hk, kwargs): 128-key splits, keys spanning 3-4 groups
    "prefill D64 causal": (64, 100, 4, 2, dict(causal=True)),
    "prefill D128 window": (128, 300, 2, 1, dict(causal=True, window_size=(2 ** 17 + 5000, 0))),
    "prefill D256": (256, 70, 2, 2, {}),
    "decode D128 GQA": (128, 1, 8, 1, {}),
}


@gpu
@pytest.mark.parametrize("name", sorted(GROUP_CASES))
def test_group_order_same_bits_on_every_schedule(name):
    """Random k/v over 3 x 2**17 + 777 keys at 128-key splits: rows whose splits span 2-4
    groups (FAD_MERGE_GROUP), some starting or ending inside one (a window), on the one-CTA
    schedule (the prefill kernel's group walk and its X slots, decode shapes included), a CTA
    per split (the combine's two-level fold) and the automatic one: the same bits on each, and
    the float64 answer on sampled rows."""
    D, Sq, H, Hk, kw = GROUP_CASES[name]
    fad.set_deterministic_mode(True, split_size=128)
    gen = make_gen(35)
    n = 3 * 2 ** 17 + 777
    q = randn(gen, (1, Sq, H, D), BF, "cuda")
    k = randn(gen, (1, n, Hk, D), BF, "cuda")
    v = randn(gen, (1, n, Hk, D), BF, "cuda")
    res = {}
    for sched in ("one_cta", "cta_per_split", "auto"):
        res[sched] = _forced(sched, fad.flash_attn_func, q, k, v, return_attn_probs=True, **kw)[:2]
    for sched in ("cta_per_split", "auto"):
        assert torch.equal(res[sched][0], res["one_cta"][0]), sched
        assert torch.equal(res[sched][1], res["one_cta"][1]), sched
    out, lse = res["one_cta"]
    wl = kw.get("window_size", (-1, -1))[0]
    for i in sorted({0, Sq // 2, Sq - 1}):
        hi = n - Sq + i + 1 if kw.get("causal") else n
        lo = max(0, hi - 1 - wl) if wl >= 0 else 0
        sub = slice(lo, hi)
        _assert_reference(out[0, i:i + 1], lse[0, :, i:i + 1], q[0, i:i + 1], k[0, sub], v[0, sub],
                          f"{name} row {i}")


# --- past one merge group: which schedule, at what workspace (GPU) ----------------

def _x_pool_bytes():
    """The workspace of a one-CTA plan past 1024 splits: FAD_X_WARPS_PER_SM (64) X slots an SM
    of 32 lanes x FAD_X_LANE_FLOATS (136) fp32, and a taken flag a slot (fad_config.h)."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 64 * sms * (32 * 136 * 4 + 4)


@gpu
@pytest.mark.parametrize("D", [64, 128, 256])
def test_long_prefill_past_one_group_walks_in_one_cta(D):
    """4096 query rows x 2 heads over 2**20 keys (2048 splits of 512, two merge groups): a CTA
    per split would need 2048 x 8192 rows x (D + 2) fp32 of partials (4.4-17 GB, past the
    automatic schedule's 1 GiB), so the automatic plan takes the one-CTA group walk, whose
    workspace is the X slots' pool alone (as num_splits=1's), and the answer is the exact one
    (k/v one row expand()ed)."""
    gen = make_gen(40)
    n, Sq = 2 ** 20, 4096
    q = randn(gen, (1, Sq, 2, D), BF, "cuda")
    k, v, kx, vx = _one_row_kv(n, 2, D, gen)
    need = {}
    for sched in ("one_cta", "cta_per_split", "auto"):
        with force_schedule(sched):
            need[sched] = workspace_bytes(q, kx)
    assert need["cta_per_split"] >= 2048 * Sq * 2 * (D + 2) * 4 > 2 ** 30, need
    assert need["auto"] == need["one_cta"] == _x_pool_bytes(), need
    out, lse, _ = fad.flash_attn_func(q, kx, vx, return_attn_probs=True)
    _check_one_row_answer(out, lse, q, k, v, n)


GROUP_WALK_CASES = {  # name: (D, Sq, H, Hk, kwargs, float64 check): 512-key splits
    "D128": (128, 70, 2, 1, {}, True),
    "D64 causal": (64, 130, 2, 2, dict(causal=True), True),
    "D64 softcap": (64, 40, 4, 2, dict(softcap=30.0), False),
}


@gpu
@pytest.mark.parametrize("name", sorted(GROUP_WALK_CASES))
def test_group_walk_same_bits_as_cta_per_split(name):
    """2**19 + 512 keys at the default 512-key splits: 1025 splits, the last one a group of
    its own. The one-CTA group walk (forced schedule; its workspace the X slots' pool) and a
    CTA per split (the combine) give the same bits, and sampled rows the float64 answer
    (softcap: the mma.sync kernel's score-mod variant, bits only)."""
    D, Sq, H, Hk, kw, check = GROUP_WALK_CASES[name]
    gen = make_gen(41)
    n = 2 ** 19 + 512
    q = randn(gen, (1, Sq, H, D), BF, "cuda")
    k = randn(gen, (1, n, Hk, D), BF, "cuda")
    v = randn(gen, (1, n, Hk, D), BF, "cuda")
    with force_schedule("one_cta"):
        assert workspace_bytes(q, k) == _x_pool_bytes()
    res = {s: _forced(s, fad.flash_attn_func, q, k, v, return_attn_probs=True, **kw)[:2]
           for s in ("one_cta", "cta_per_split")}
    assert torch.equal(res["one_cta"][0], res["cta_per_split"][0])
    assert torch.equal(res["one_cta"][1], res["cta_per_split"][1])
    if not check:
        return
    out, lse = res["one_cta"]
    for i in sorted({0, Sq // 2, Sq - 1}):
        hi = n - Sq + i + 1 if kw.get("causal") else n
        _assert_reference(out[0, i:i + 1], lse[0, :, i:i + 1], q[0, i:i + 1], k[0, :hi], v[0, :hi],
                          f"{name} row {i}")


@gpu
def test_dropout_on_the_group_walk_refused():
    """The one-CTA group walk has no dropout build: dropout over more than 1024 splits on it
    (a forced one-CTA schedule) is a ValueError naming dropout_p and the key limit, while a CTA
    per split runs it."""
    gen = make_gen(42)
    n = 2 ** 19 + 512
    q = randn(gen, (1, 16, 2, 64), BF, "cuda")
    _, _, kx, vx = _one_row_kv(n, 2, 64, gen)
    with force_schedule("one_cta"), pytest.raises(
            ValueError, match=r"^dropout_p: dropout over more than 1024 splits \(seqlen_k 524800 > "
                              r"524288 keys at split_size 512\)"):
        fad.flash_attn_func(q, kx, vx, dropout_p=0.1)
    with force_schedule("cta_per_split"):
        out = fad.flash_attn_func(q, kx, vx, dropout_p=0.1)
    assert out.shape == q.shape and torch.isfinite(out).all()
