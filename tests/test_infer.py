"""The inference entries _C.infer / infer_varlen / infer_kvcache: flash_attn_func,
flash_attn_varlen_func and flash_attn_with_kvcache calls with no autograd or rarer options
run their whole
per-call path in C (output from torch's allocator, torch's current stream, the mode
the module holds). They must give the general path's bits, run in the mode Python
set, and leave to the general path (NotImplemented, nothing written) every call they
do not take as it is, so that copies, autograd and error messages stay the general
path's. On the CPU path (CI) and the GPU."""
import re

import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import _C, interface
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import DEVICES, HAS_CUDA, make_gen, make_qkv, randn


pytestmark = pytest.mark.skipif(interface._infer is None,
                                reason="torch has no DLPack exchange API with an allocator")


def general_fwd(q, k, v, softmax_scale=None, causal=False):
    """The general path's output for the same call (Python checks, torch.empty_like, _C.fwd)."""
    return interface._fwd(q, k, v, softmax_scale, causal, (-1, -1), 0.0, None, want_lse=False)[0]


def general_kvcache(q, kc, vc, lens, softmax_scale=None, causal=False, **kw):
    args = (q, kc, vc, None, None, None, None, lens, kw.get("cache_batch_idx"),
            kw.get("cache_leftpad"), kw.get("block_table"))
    return interface._fwd_kvcache(*args, softmax_scale, causal, (-1, -1), 0.0, True, None,
                                  want_lse=False)[0]


def infer(q, k, v, softmax_scale=None, causal=False, want_lse=False):
    return interface._infer(q, k, v, softmax_scale, causal, want_lse)


def infer_kvcache(q, kc, vc, lens, k=None, v=None, rotary_cos=None, rotary_sin=None,
                  cache_batch_idx=None, cache_leftpad=None, block_table=None, softmax_scale=None,
                  causal=False, rotary_interleaved=True, want_lse=False):
    """_C.infer_kvcache with flash_attn_with_kvcache's keywords."""
    return interface._infer_kvcache(q, kc, vc, k, v, rotary_cos, rotary_sin, lens,
                                    cache_batch_idx, cache_leftpad, block_table, softmax_scale,
                                    causal, rotary_interleaved, want_lse)


@pytest.fixture
def no_general_path(monkeypatch):
    """Within the test, the general forward paths raise: a call that succeeds took _C.infer*."""
    def refuse(*args, **kwargs):
        raise AssertionError("the call took the general path")
    monkeypatch.setattr(interface, "_fwd", refuse)
    monkeypatch.setattr(interface, "_fwd_varlen", refuse)
    monkeypatch.setattr(interface, "_fwd_kvcache", refuse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", [64, 80, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_infer_same_bits_as_general_path(device, D, causal):
    """The default scale is computed as Python computes D ** -0.5 (D = 80: 1/sqrt(80) is
    not exact in fp32 and the float32 rounding of the double differs from 1/sqrtf)."""
    g = make_gen(41)
    q, k, v = make_qkv(g, 2, 130, 700, 4, 2, D, torch.bfloat16, device)
    want = general_fwd(q, k, v, causal=causal)
    got = infer(q, k, v, None, causal)
    assert got is not NotImplemented
    assert got.shape == q.shape and got.dtype == q.dtype and got.device == q.device
    assert got.is_contiguous()
    assert torch.equal(got, want)
    assert torch.equal(infer(q, k, v, 0.3, causal), general_fwd(q, k, v, 0.3, causal))
    out, lse = infer(q, k, v, None, causal, want_lse=True)
    want_out, want_lse = interface._fwd(q, k, v, None, causal, (-1, -1), 0.0, None)
    assert lse.shape == (2, 4, 130) and lse.dtype == torch.float32 and lse.is_contiguous()
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_func_takes_infer(device, no_general_path):
    g = make_gen(42)
    q, k, v = make_qkv(g, 1, 33, 300, 2, 1, 64, torch.float16, device)
    out = fad.flash_attn_func(q, k, v, causal=True, softmax_scale=0.2)
    ref, ref_lse = attention_ref(q, k, v, softmax_scale=0.2, causal=True)
    assert out.shape == q.shape and out.dtype == q.dtype
    torch.testing.assert_close(out.double(), ref.double(), atol=2e-3, rtol=0)
    out2, lse, probs = fad.flash_attn_func(q, k, v, causal=True, softmax_scale=0.2,
                                           return_attn_probs=True)
    assert probs is None and torch.equal(out2, out)
    torch.testing.assert_close(lse.double(), ref_lse.double(), atol=1e-4, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_infer_runs_in_the_mode_python_set(device):
    """split_size changes the bits of a long row; the inference entry must follow
    set_deterministic_mode (and force_schedule on the GPU, which never changes bits)."""
    g = make_gen(43)
    q, k, v = make_qkv(g, 1, 64, 4000, 4, 4, 64, torch.float16, device)
    base = infer(q, k, v, None, False)
    fad.set_deterministic_mode(True, split_size=256)
    try:
        small = infer(q, k, v, None, False)
        assert torch.equal(small, general_fwd(q, k, v))
        assert not torch.equal(small, base)  # 16 splits against 8: other roundings
    finally:
        fad.set_deterministic_mode(True, split_size=512)
    assert torch.equal(infer(q, k, v, None, False), base)
    for schedule in ("one_cta", "cta_per_split"):
        with force_schedule(schedule):
            assert torch.equal(infer(q, k, v, None, False), base)


@pytest.mark.parametrize("device", DEVICES)
def test_infer_leaves_what_the_general_path_handles(device):
    g = make_gen(44)
    q, k, v = make_qkv(g, 1, 16, 64, 2, 2, 64, torch.bfloat16, device)
    leave = NotImplemented
    # an operand the general path copies first: not contiguous, or misaligned data
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)
    assert infer(qt, k, v, None, False) is leave
    assert torch.equal(fad.flash_attn_func(qt, k, v), fad.flash_attn_func(q, k, v))
    flat = torch.cat([torch.zeros(1, dtype=q.dtype, device=device), q.flatten()])
    q_odd = flat[1:].view(q.shape)  # data 2 bytes past an aligned start
    assert infer(q_odd, k, v, None, False) is leave
    assert torch.equal(fad.flash_attn_func(q_odd, k, v), fad.flash_attn_func(q, k, v))
    # autograd: the general path records the call
    qg = q.clone().requires_grad_()
    assert infer(qg, k, v, None, False) is leave
    assert fad.flash_attn_func(qg, k, v).grad_fn is not None
    with torch.no_grad():
        assert infer(qg, k, v, None, False) is not leave
    # a tensor subclass (it may override torch functions)
    class Sub(torch.Tensor):
        pass
    assert infer(q.as_subclass(Sub), k, v) is leave
    # not a tensor, bad scale: the general path raises, in its words
    assert infer(q.tolist(), k, v) is leave
    for scale in (0.0, -1.0, float("inf"), float("nan"), "x"):
        assert infer(q, k, v, scale, False) is leave
    with pytest.raises(ValueError, match="softmax_scale"):
        fad.flash_attn_func(q, k, v, softmax_scale=0.0)


@pytest.mark.parametrize("device", DEVICES)
def test_infer_bad_input_raises_the_general_message(device):
    g = make_gen(45)
    q, k, v = make_qkv(g, 1, 16, 64, 2, 2, 64, torch.bfloat16, device)
    cases = [
        ((q[0], k, v), ValueError, r"q: expected 4 dims \(batch"),
        ((q.float(), k, v), TypeError, "q: expected dtype float16 or bfloat16"),
        ((q, k.half(), v), TypeError, "k: expected dtype bfloat16"),
        ((q, k, v[:, :32]), ValueError, "v: dim 1 must be 64"),
        ((q, k[..., :32].contiguous(), v), ValueError, "k: dim 3 must be 64"),
        (make_qkv(g, 1, 16, 64, 2, 2, 264, torch.bfloat16, device), ValueError, "head"),
    ]
    for args, exc, msg in cases:
        try:  # left to the general path, or (a check of the C core's, which both paths
            # reach with the same parameters) the same error
            assert infer(*args, None, False) is NotImplemented
        except exc as e:
            assert re.search(msg, str(e)), (msg, str(e))
        with pytest.raises(exc, match=msg):
            fad.flash_attn_func(*args)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("opts", ["plain", "batch_idx", "leftpad"])
def test_infer_kvcache_same_bits_as_general_path(device, opts):
    g = make_gen(46)
    B, cap, Hk, G, D = 3, 1500, 2, 4, 128
    q = randn(g, (B, 1, Hk * G, D), torch.bfloat16, device)
    kc, vc = (randn(g, (B + 1, cap, Hk, D), torch.bfloat16, device) for _ in range(2))
    lens = torch.tensor([1400, 37, 1], dtype=torch.int32, device=device)
    kw = {}
    if opts == "batch_idx":
        kw["cache_batch_idx"] = torch.tensor([3, 0, 1], dtype=torch.int32, device=device)
    if opts == "leftpad":
        kw["cache_leftpad"] = torch.tensor([5, 0, 1], dtype=torch.int32, device=device)
    for causal in (False, True):
        got = infer_kvcache(q, kc, vc, lens, causal=causal, **kw)
        assert got is not NotImplemented
        assert torch.equal(got, general_kvcache(q, kc, vc, lens, causal=causal, **kw))
    out, lse = infer_kvcache(q, kc, vc, lens, causal=True, want_lse=True, **kw)
    args = (q, kc, vc, None, None, None, None, lens, kw.get("cache_batch_idx"),
            kw.get("cache_leftpad"), None)
    want_out, want_lse = interface._fwd_kvcache(*args, None, True, (-1, -1), 0.0, True, None)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.skipif(not HAS_CUDA, reason="paged caches take infer_kvcache on CUDA only")
def test_infer_kvcache_paged_same_bits():
    g = make_gen(47)
    B, page, n_pages, Hk, D = 2, 16, 40, 1, 64
    q = randn(g, (B, 1, 8, D), torch.float16, "cuda")
    kc, vc = (randn(g, (n_pages, page, Hk, D), torch.float16, "cuda") for _ in range(2))
    table = torch.randperm(n_pages, generator=g)[:B * 20].view(B, 20).int().cuda()
    lens = torch.tensor([300, 17], dtype=torch.int32, device="cuda")
    got = infer_kvcache(q, kc, vc, lens, causal=True, block_table=table)
    assert got is not NotImplemented
    assert torch.equal(got, general_kvcache(q, kc, vc, lens, causal=True, block_table=table))


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_with_kvcache_takes_infer(device, no_general_path):
    g = make_gen(48)
    q = randn(g, (2, 1, 4, 64), torch.bfloat16, device)
    kc, vc = (randn(g, (2, 256, 2, 64), torch.bfloat16, device) for _ in range(2))
    lens = torch.tensor([100, 256], dtype=torch.int32, device=device)
    out = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("device", DEVICES)
def test_infer_kvcache_leaves_what_the_general_path_handles(device):
    g = make_gen(49)
    q = randn(g, (2, 1, 4, 64), torch.bfloat16, device)
    kc, vc = (randn(g, (2, 256, 2, 64), torch.bfloat16, device) for _ in range(2))
    lens = torch.tensor([100, 256], dtype=torch.int32, device=device)
    table = torch.zeros(2, 16, dtype=torch.int32, device=device)
    idx = torch.tensor([1, 0], dtype=torch.int32, device=device)
    leave = NotImplemented
    assert infer_kvcache(q, kc, vc, 100) is leave
    assert infer_kvcache(q, kc, vc, lens.long()) is leave
    assert infer_kvcache(q, kc, vc, lens, cache_batch_idx=idx, block_table=table) is leave
    with pytest.raises(ValueError, match="block_table: cannot be combined"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=idx,
                                    block_table=table)
    with pytest.raises(TypeError, match="cache_seqlens: expected an int or an int32 tensor"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens.float())
    assert torch.equal(fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens.long()),
                       fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens))  # converted
    # an int cache_seqlens goes the general way and gives the same bits
    full = torch.full((2,), 100, dtype=torch.int32, device=device)
    assert torch.equal(fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=100),
                       fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=full))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_infer_on_the_current_stream_and_in_a_graph():
    """The output is written on torch's current stream (a side stream here), and a
    captured call replays with the eager bits after new inputs are copied in."""
    g = make_gen(50)
    q, k, v = make_qkv(g, 2, 64, 3000, 4, 2, 128, torch.bfloat16, "cuda")
    want = general_fwd(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = fad.flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(got, want)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fad.flash_attn_func(q, k, v, causal=True)
    q2, k2, v2 = make_qkv(g, 2, 64, 3000, 4, 2, 128, torch.bfloat16, "cuda")
    q.copy_(q2), k.copy_(k2), v.copy_(v2)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured, general_fwd(q2, k2, v2, causal=True))


@pytest.fixture
def general_only(monkeypatch):
    """Calls made through the returned function take the general path."""
    def call(fn, *args, **kwargs):
        with monkeypatch.context() as m:
            for name in ("_infer", "_infer_varlen", "_infer_kvcache"):
                m.setattr(interface, name, None)
            return fn(*args, **kwargs)
    return call


@pytest.mark.skipif(not HAS_CUDA, reason="the append step runs in C on CUDA only")
@pytest.mark.parametrize("rotary", [None, "interleaved", "halves", "fp32"])
@pytest.mark.parametrize("layout", ["contiguous", "paged", "leftpad"])
@pytest.mark.parametrize("n_new", [1, 3])
@pytest.mark.parametrize("causal", [False, True])
def test_infer_kvcache_append_same_bits(general_only, rotary, layout, n_new, causal):
    """Rotary + append + attention in one C call: the output and both caches have the
    general path's bits (which the kvcache tests tie to the CPU reference)."""
    g = make_gen(51)
    dev, dt, B, Hk, G, D, cap = "cuda", torch.bfloat16, 3, 2, 4, 128, 512
    q = randn(g, (B, n_new, Hk * G, D), dt, dev)
    k, v = (randn(g, (B, n_new, Hk, D), dt, dev) for _ in range(2))
    kw = {"causal": causal}
    if rotary:
        cos = torch.rand(1024, 32, generator=g).to(dev)
        sin = torch.rand(1024, 32, generator=g).to(dev)
        kw.update(rotary_cos=cos if rotary == "fp32" else cos.to(dt),
                  rotary_sin=sin if rotary == "fp32" else sin.to(dt),
                  rotary_interleaved=rotary != "halves")
    lens = torch.tensor([300, 0, 77], dtype=torch.int32, device=dev)
    if layout == "paged":
        page, n_pages = 16, 3 * cap // 16
        kc, vc = (randn(g, (n_pages, page, Hk, D), dt, dev) for _ in range(2))
        kw["block_table"] = torch.randperm(n_pages, generator=g).view(B, -1).int().to(dev)
    else:
        kc, vc = (randn(g, (B, cap, Hk, D), dt, dev) for _ in range(2))
        if layout == "leftpad":
            kw["cache_leftpad"] = torch.tensor([10, 0, 5], dtype=torch.int32, device=dev)
    kc2, vc2 = kc.clone(), vc.clone()
    got = infer_kvcache(q, kc, vc, lens, k=k, v=v, **kw)
    assert got is not NotImplemented
    want = general_only(fad.flash_attn_with_kvcache, q, kc2, vc2, k=k, v=v, cache_seqlens=lens,
                        **kw)
    assert torch.equal(got, want)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


@pytest.mark.skipif(not HAS_CUDA, reason="the append step runs in C on CUDA only")
def test_flash_attn_with_kvcache_append_takes_infer(no_general_path):
    g = make_gen(52)
    q = randn(g, (1, 1, 4, 64), torch.float16, "cuda")
    k, v = (randn(g, (1, 1, 1, 64), torch.float16, "cuda") for _ in range(2))
    kc, vc = (torch.zeros(1, 64, 1, 64, dtype=torch.float16, device="cuda") for _ in range(2))
    cos, sin = (torch.rand(64, 16, generator=g).cuda() for _ in range(2))
    lens = torch.tensor([5], dtype=torch.int32, device="cuda")
    out = fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=lens, causal=True)
    assert torch.isfinite(out).all()
    assert torch.equal(vc[0, 5], v[0, 0]) and not torch.equal(kc[0, 5], k[0, 0])  # k rotated
    assert torch.equal(lens, torch.tensor([5], dtype=torch.int32, device="cuda"))  # not written


@pytest.mark.parametrize("device", DEVICES)
def test_infer_kvcache_append_leaves_what_the_general_path_handles(device):
    g = make_gen(53)
    q = randn(g, (2, 1, 4, 64), torch.bfloat16, device)
    k, v = (randn(g, (2, 1, 2, 64), torch.bfloat16, device) for _ in range(2))
    kc, vc = (randn(g, (2, 64, 2, 64), torch.bfloat16, device) for _ in range(2))
    lens = torch.tensor([5, 9], dtype=torch.int32, device=device)
    cos, sin = (torch.rand(64, 16, generator=g).to(device) for _ in range(2))
    before = kc.clone()
    leave = NotImplemented
    if device == "cpu":  # the CPU path appends with torch ops, in Python
        assert infer_kvcache(q, kc, vc, lens, k=k, v=v) is leave
    assert infer_kvcache(q, kc, vc, lens, k=k) is leave  # v missing: the general path raises
    assert infer_kvcache(q, kc, vc, lens, rotary_cos=cos) is leave
    assert infer_kvcache(q, kc, vc, lens, k=k, v=v, rotary_cos=cos.double(),
                         rotary_sin=sin.double()) is leave  # converted there
    assert infer_kvcache(q, kc, vc, lens, k=k, v=v, rotary_cos=torch.rand(64, 40).to(device),
                         rotary_sin=torch.rand(64, 40).to(device)) is leave  # rotary_dim > D
    assert infer_kvcache(q, kc, vc, lens, k=k[:, :, :1], v=v[:, :, :1]) is leave
    # a cache the attention would refuse (head stride 68: not a multiple of 8) is left
    # before anything is appended to it
    kc_odd = randn(g, (2, 64, 2, 68), torch.bfloat16, device)[..., :64]
    assert infer_kvcache(q, kc_odd, vc, lens, k=k, v=v) is leave
    assert torch.equal(kc, before)
    with pytest.raises(ValueError, match="k, v: give both or neither"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, cache_seqlens=lens)
    with pytest.raises(ValueError, match="rotary_cos, rotary_sin"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, rotary_cos=torch.rand(64, 40).to(device),
                                    rotary_sin=torch.rand(64, 40).to(device), cache_seqlens=lens)
    assert torch.equal(kc, before)


def infer_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k=None, block_table=None,
                 softmax_scale=None, causal=False, want_lse=False):
    return interface._infer_varlen(q, k, v, cu_q, cu_k, max_q, max_k, seqused_k, block_table,
                                   softmax_scale, causal, want_lse)


def same_or_both_nan(a, b):
    """Bit equality where finite; NaN exactly where the other is NaN."""
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["plain", "seqused", "gap", "paged"])
def test_infer_varlen_same_bits_as_general_path(device, kind, general_only):
    """out and lse equal the general path's, including the rows no sequence covers (a gap
    after the last sequence: 0 on the CPU, NaN on the GPU, as the general path fills them)."""
    g = make_gen(54)
    lens = [70, 600, 1]
    total = sum(lens) + (9 if kind == "gap" else 0)
    cu = torch.tensor([0, 70, 670, 671], dtype=torch.int32, device=device)
    q = randn(g, (total, 4, 64), torch.bfloat16, device)
    k, v = (randn(g, (total, 2, 64), torch.bfloat16, device) for _ in range(2))
    kw = {}
    if kind == "seqused":
        kw["seqused_k"] = torch.tensor([50, 600, 0], dtype=torch.int32, device=device)
    cu_k, max_k = cu, max(lens)
    if kind == "paged":
        page, n_pages = 16, 3 * 40
        k, v = (randn(g, (n_pages, page, 2, 64), torch.bfloat16, device) for _ in range(2))
        kw["block_table"] = torch.randperm(n_pages, generator=g).view(3, 40).int().to(device)
        max_k = 40 * page
    for causal in (False, True):
        out, lse = infer_varlen(q, k, v, cu, cu_k, max(lens), max_k, causal=causal,
                                want_lse=True, **kw)
        want_out, want_lse, _ = general_only(fad.flash_attn_varlen_func, q, k, v, cu, cu_k,
                                             max(lens), max_k, causal=causal,
                                             return_attn_probs=True, **kw)
        assert lse.shape == (4, total)
        assert same_or_both_nan(out, want_out) and same_or_both_nan(lse, want_lse)
        alone = infer_varlen(q, k, v, cu, cu_k, max(lens), max_k, causal=causal, **kw)
        assert same_or_both_nan(alone, out)
    if kind == "gap":
        tail = out[671:]
        assert bool(tail.isnan().all()) if device == "cuda" else bool((tail == 0).all())


@pytest.mark.parametrize("device", DEVICES)
def test_flash_attn_varlen_func_takes_infer(device, no_general_path):
    g = make_gen(55)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    q, k, v = (randn(g, (12, 2, 64), torch.float16, device) for _ in range(3))
    out, lse, probs = fad.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7, causal=True,
                                                 return_attn_probs=True)
    assert probs is None and out.shape == q.shape and lse.shape == (2, 12)
    ref = attention_ref(q[None, 5:], k[None, 5:], v[None, 5:], causal=True)[0][0]
    torch.testing.assert_close(out[5:].double(), ref.double(), atol=2e-3, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_infer_varlen_leaves_what_the_general_path_handles(device):
    g = make_gen(56)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32, device=device)
    q, k, v = (randn(g, (12, 2, 64), torch.float16, device) for _ in range(3))
    leave = NotImplemented
    assert infer_varlen(q, k, v, cu, cu, torch.tensor(7), 7) is leave  # int() there
    assert infer_varlen(q, k, v, cu, cu, -1, 7) is leave
    assert infer_varlen(q, k, v, cu.long(), cu, 7, 7) is leave
    assert infer_varlen(q[:, :, :32].contiguous(), k, v, cu, cu, 7, 7) is leave
    assert infer_varlen(q.clone().requires_grad_(), k, v, cu, cu, 7, 7) is leave
    with pytest.raises(ValueError, match="max_seqlen_q, max_seqlen_k: must be >= 0"):
        fad.flash_attn_varlen_func(q, k, v, cu, cu, -1, 7)
    with pytest.raises(TypeError, match="cu_seqlens_q: expected dtype int32"):
        fad.flash_attn_varlen_func(q, k, v, cu.float(), cu, 7, 7)
    assert torch.equal(fad.flash_attn_varlen_func(q, k, v, cu.long(), cu, 7, 7),
                       fad.flash_attn_varlen_func(q, k, v, cu, cu, 7, 7))  # int64: converted
    table = torch.arange(8, dtype=torch.int32, device=device).view(2, 4)
    kp, vp = (randn(g, (8, 16, 2, 64), torch.float16, device) for _ in range(2))
    # paged KV with an input that requires grad: the forward runs (flash_attn runs it too, with
    # the bits of the inference call); reaching the backward raises
    out = fad.flash_attn_varlen_func(q.clone().requires_grad_(), kp, vp, cu, cu, 7, 64,
                                     block_table=table)
    assert out.requires_grad
    assert torch.equal(out.detach(), fad.flash_attn_varlen_func(q, kp, vp, cu, cu, 7, 64,
                                                                block_table=table))
    with pytest.raises(NotImplementedError, match="block_table: paged KV has no backward"):
        out.float().sum().backward()


def test_infer_entries_check_their_argument_count():
    for entry, want in ((_C.infer, 6), (_C.infer_varlen, 12), (_C.infer_kvcache, 15)):
        with pytest.raises(TypeError, match=f"expected {want} arguments, got 1"):
            entry(1)
