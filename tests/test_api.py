"""The API around the kernels: the mode switches, argument checks (a refused call names the
argument and writes nothing), the raw _C entry (outputs fully written on success, untouched on
failure; workspace sizing), devices, and the testing helpers. The checks that do not depend on
the device run on every device."""
import pytest
import torch

import flash_attn_det
from flash_attn_det import (_C, flash_attn_func, get_deterministic_mode, get_split_size, mode,
                            set_deterministic_mode)
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import (DEVICES, assert_close, assert_lse_close, make_alibi, make_gen,
                      make_qkv, on_devices, randn, raw_fwd, requires_cuda, tolerance,
                      workspace_bytes)


# --------------------------------------------------------------------------
# mode API and force_schedule
# --------------------------------------------------------------------------

def test_mode_defaults_and_roundtrip():
    assert get_deterministic_mode() is True
    assert get_split_size() == 512
    set_deterministic_mode(False)
    assert get_deterministic_mode() is False
    set_deterministic_mode(True, split_size=256)
    assert get_deterministic_mode() is True and get_split_size() == 256
    set_deterministic_mode()
    assert get_split_size() == 512


def test_mode_has_one_copy_in_the_c_module():
    # the Python getters read the C module's state, which the C inference entries read too:
    # a mode set through _C directly is what the Python API reports
    assert _C.DEFAULT_SPLIT_SIZE == 512 and _C.get_mode() == (True, 512, _C.SCHEDULE_AUTO)
    _C.set_mode(0, 1024, _C.SCHEDULE_AUTO)
    try:
        assert get_deterministic_mode() is False and get_split_size() == 1024
    finally:
        set_deterministic_mode()
    assert _C.get_mode() == (True, 512, _C.SCHEDULE_AUTO)


@pytest.mark.parametrize("bad", [0, 100, -128, 1.5, 127, 129, True, "512", None, 2**24 + 128,
                                 2**31 - 128])
def test_split_size_rejected(bad):
    set_deterministic_mode(True, split_size=256)
    with pytest.raises(ValueError, match="^split_size:"):
        set_deterministic_mode(True, split_size=bad)
    # a rejected call changes nothing
    assert get_split_size() == 256 and get_deterministic_mode() is True


def test_force_schedule_sets_and_restores():
    assert mode.current()[2] == _C.SCHEDULE_AUTO
    with force_schedule("one_cta"):
        assert mode.current()[2] == _C.SCHEDULE_ONE_CTA
        with force_schedule("cta_per_split"):
            assert mode.current()[2] == _C.SCHEDULE_CTA_PER_SPLIT
        assert mode.current()[2] == _C.SCHEDULE_ONE_CTA
    assert mode.current()[2] == _C.SCHEDULE_AUTO
    with pytest.raises(RuntimeError):
        with force_schedule("cta_per_split"):
            raise RuntimeError("boom")
    assert mode.current()[2] == _C.SCHEDULE_AUTO
    with pytest.raises(ValueError):
        with force_schedule("fastest"):
            pass
    assert mode.current()[2] == _C.SCHEDULE_AUTO


def test_module_constants():
    assert _C.SPLIT_QUANTUM == 128 and _C.MAX_HEAD_DIM == 256
    assert (_C.SCHEDULE_AUTO, _C.SCHEDULE_ONE_CTA, _C.SCHEDULE_CTA_PER_SPLIT) == (0, 1, 2)
    assert isinstance(flash_attn_det.has_cuda(), bool)
    assert flash_attn_det.__version__ == "0.1.0"


def test_reference_matches_naive_softmax():
    """Sanity check of attention_ref itself against a direct formula (one small case)."""
    g = make_gen(110)
    q, k, v = make_qkv(g, 1, 4, 6, 2, 1, 8, torch.float32)
    out, lse = attention_ref(q, k, v, causal=True)
    for h in range(2):
        for i in range(4):
            pos = i + 2
            s = torch.tensor([float(q[0, i, h].double() @ k[0, j, 0].double()) * 8 ** -0.5
                              for j in range(pos + 1)], dtype=torch.float64)
            p = torch.softmax(s, 0)
            want = p @ v[0, :pos + 1, 0].double()
            assert torch.allclose(out[0, i, h], want, atol=1e-12)
            assert abs(float(lse[0, h, i]) - float(torch.logsumexp(s, 0))) < 1e-12


# --------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------

def _qkv(B=2, Sq=10, Sk=12, H=4, Hk=2, D=32, dtype=torch.float16, seed=200):
    return make_qkv(make_gen(seed), B, Sq, Sk, H, Hk, D, dtype)


def test_bad_dtype_q():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^q:"):
        flash_attn_func(q.float(), k, v)


@pytest.mark.parametrize("which", ["k", "v"])
def test_bad_dtype_kv_differs_from_q(which):
    q, k, v = _qkv()
    args = {"k": k, "v": v}
    args[which] = args[which].to(torch.bfloat16)
    with pytest.raises(TypeError, match=f"^{which}:"):
        flash_attn_func(q, args["k"], args["v"])


def test_bad_rank():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^q:"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match="^k:"):
        flash_attn_func(q, k[0], v)


@pytest.mark.parametrize("case,name", [
    ("kv_len", "v"), ("kv_heads", "v"), ("batch_k", "k"), ("batch_v", "v"), ("dim_k", "k"),
    ("dim_v", "v")])
def test_shape_mismatch(case, name):
    q, k, v = _qkv()
    g = make_gen(201)
    if case == "kv_len":
        v = randn(g, (2, 13, 2, 32), torch.float16)
    elif case == "kv_heads":
        v = randn(g, (2, 12, 4, 32), torch.float16)
    elif case == "batch_k":
        k = randn(g, (3, 12, 2, 32), torch.float16)
    elif case == "batch_v":
        v = randn(g, (3, 12, 2, 32), torch.float16)
    elif case == "dim_k":
        k = randn(g, (2, 12, 2, 40), torch.float16)
    elif case == "dim_v":
        v = randn(g, (2, 12, 2, 40), torch.float16)
    with pytest.raises(ValueError, match=f"^{name}:"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("D", [264, 260, 512])  # (below 256, not a multiple of 8: padded, tests/test_head_dim_pad.py)
def test_bad_head_dim(D):
    q, k, v = _qkv(D=D)
    with pytest.raises(ValueError, match="^head_dim:"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("H,Hk", [(6, 4), (4, 3), (2, 4)])
def test_heads_not_divisible(H, Hk):
    q, k, v = _qkv(H=H, Hk=Hk)
    with pytest.raises(ValueError, match="^num_heads_k:"):
        flash_attn_func(q, k, v)


@pytest.mark.parametrize("window", [(-2, 0), (0, -5), (1, 2, 3), (1,), 5, "ab", None,
                                    ("a", 1)])
def test_bad_window(window):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^window_size:"):
        flash_attn_func(q, k, v, window_size=window)


@pytest.mark.parametrize("shape,exc", [((3,), ValueError), ((4, 1), ValueError),
                                       ((3, 4), ValueError), ((2, 4, 1), ValueError),
                                       ((2, 5), ValueError)])
def test_bad_alibi_shape(shape, exc):
    q, k, v = _qkv()
    with pytest.raises(exc, match="^alibi_slopes:"):
        flash_attn_func(q, k, v, alibi_slopes=torch.full(shape, 0.1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.bfloat16])
def test_bad_alibi_dtype(dtype):
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^alibi_slopes:"):
        flash_attn_func(q, k, v, alibi_slopes=torch.full((4,), 0.1, dtype=dtype))


def test_bad_alibi_not_a_tensor():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="^alibi_slopes:"):
        flash_attn_func(q, k, v, alibi_slopes=[0.1] * 4)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_softmax_scale(scale):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^softmax_scale:"):
        flash_attn_func(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("cap", [-1.0, float("inf"), float("nan")])
def test_bad_softcap(cap):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^softcap:"):
        flash_attn_func(q, k, v, softcap=cap)


@pytest.mark.parametrize("p", [1.0, -1e-6, float("nan"), float("inf")])
def test_bad_dropout_p(p):
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="^dropout_p:"):
        flash_attn_func(q, k, v, dropout_p=p)
    with pytest.raises(TypeError, match="^dropout_p:"):
        flash_attn_func(q, k, v, dropout_p="0.1")


@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_non_tensor_input(which):
    q, k, v = _qkv()
    args = {"q": q, "k": k, "v": v}
    args[which] = args[which].tolist()
    with pytest.raises(TypeError, match=f"^{which}:"):
        flash_attn_func(args["q"], args["k"], args["v"])


def test_requires_grad_records_and_keeps_forward_bits():
    """On the CPU path autograd records the call; the forward bits do not change."""
    q, k, v = _qkv()
    qg = q.clone().requires_grad_(True)
    out = flash_attn_func(qg, k, v)
    assert out.requires_grad and out.grad_fn is not None
    assert torch.equal(out.detach(), flash_attn_func(q, k, v))
    with torch.no_grad():
        assert torch.equal(flash_attn_func(qg, k, v), flash_attn_func(q, k, v))
    with torch.inference_mode():
        assert torch.equal(flash_attn_func(q, k, v.clone().requires_grad_(True)),
                           flash_attn_func(q, k, v))


# --- raw entry: checks happen before anything is written -------------------

def _poisoned(q, dtype=None):
    B, Sq, H, D = q.shape
    out = torch.empty((B, Sq, H, D), dtype=dtype or q.dtype, device=q.device).fill_(7)
    lse = torch.empty((B, H, Sq), dtype=torch.float32, device=q.device).fill_(7)
    return out, lse


@pytest.mark.parametrize("case,exc,match", [
    ("heads", ValueError, "^num_heads_k:"),
    ("split_size_100", ValueError, "^split_size:"),
    ("split_size_0", ValueError, "^split_size:"),
    ("head_dim", ValueError, "^head_dim:"),
    ("window", ValueError, "^window_size:"),
    ("causal_right", ValueError, "^causal:"),
    ("schedule", ValueError, "^schedule:"),
    ("scale", ValueError, "^softmax_scale:"),
    ("softcap", ValueError, "^softcap:"),
    ("alibi_shape", ValueError, "^alibi_slopes:"),
    ("alibi_dtype", TypeError, "^alibi_slopes:"),
    ("lse_shape", ValueError, "^softmax_lse:"),
    ("lse_dtype", TypeError, "^softmax_lse:"),
    ("lse_noncontig", ValueError, "^softmax_lse:"),
    ("out_shape", ValueError, "^out:"),
    ("k_dtype", TypeError, "^k:"),
    ("q_dtype", TypeError, "^q:"),
    ("q_rank", ValueError, "^q:"),
    ("v_len", ValueError, "^v:"),
])
@pytest.mark.parametrize("device", DEVICES)
def test_raw_fwd_writes_nothing_on_error(device, case, exc, match):
    g = make_gen(300)
    H, Hk, D = 4, 2, 32
    if case == "heads":
        H, Hk = 6, 4
    if case == "head_dim":
        D = 12
    q, k, v = make_qkv(g, 2, 9, 20, H, Hk, D, torch.bfloat16, device)
    out, lse = _poisoned(q)
    kw = {}
    if case == "split_size_100":
        kw["split_size"] = 100
    elif case == "split_size_0":
        kw["split_size"] = 0
    elif case == "window":
        kw["window"] = (-2, 0)
    elif case == "causal_right":
        kw.update(causal=True, window=(-1, -1))
    elif case == "schedule":
        kw["schedule"] = 7
    elif case == "scale":
        kw["softmax_scale"] = -0.5
    elif case == "softcap":
        kw["softcap"] = -2.0
    elif case == "alibi_shape":
        kw["alibi"] = torch.full((H + 1,), 0.1, device=device)
    elif case == "alibi_dtype":
        kw["alibi"] = torch.full((H,), 0.1, dtype=torch.float64, device=device)
    elif case == "lse_shape":
        lse = torch.full((2, H, 10), 7.0, device=device)
    elif case == "lse_dtype":
        lse = torch.full((2, H, 9), 7.0, dtype=torch.float64, device=device)
    elif case == "lse_noncontig":
        lse = torch.full((2, 9, H), 7.0, device=device).transpose(1, 2)
    elif case == "out_shape":
        out = torch.full((2, 9, H, D + 8), 7.0, dtype=torch.bfloat16, device=device)
    elif case == "k_dtype":
        k = k.to(torch.float16)
    elif case == "q_dtype":
        q = q.float()
    elif case == "q_rank":
        q = q[0]
        kw["workspace"] = None  # (raw_fwd's workspace sizing reads a 4-D shape)
    elif case == "v_len":
        v = v[:, :19]
    out0, lse0 = out.clone(), lse.clone()
    with pytest.raises(exc, match=match):
        raw_fwd(q, k, v, out, lse, **kw)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(out, out0), "out was written by a call that failed"
    assert torch.equal(lse, lse0), "softmax_lse was written by a call that failed"


@pytest.mark.parametrize("device,case", on_devices(
    cpu=[dict(Sq=12, Sk=20, D=32, dtype=torch.float16, schedule=_C.SCHEDULE_AUTO)],
    cuda=[dict(Sq=300, Sk=170, D=D, dtype=torch.bfloat16, schedule=s)  # 130 fully masked rows
          for s in (_C.SCHEDULE_AUTO, _C.SCHEDULE_ONE_CTA, _C.SCHEDULE_CTA_PER_SPLIT)
          for D in (40, 64, 128, 200, 256)]))
def test_raw_fwd_writes_everything_on_success(device, case):
    """Counterpart of the refusal tests: a good call overwrites every element of outputs
    poisoned with NaN, in every schedule, with the right values (causal, Sq > Sk on a GPU:
    the rows that see no key are written too)."""
    c = case
    q, k, v = make_qkv(make_gen(301), 2, c["Sq"], c["Sk"], 4, 2, c["D"], c["dtype"], device)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((2, 4, c["Sq"]), float("nan"), device=device)
    raw_fwd(q, k, v, out, lse, causal=True, window=(-1, 0), split_size=128,
            schedule=c["schedule"])
    if device == "cuda":
        torch.cuda.synchronize()
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements never written"
    assert not lse.isnan().any(), f"{int(lse.isnan().sum())} lse elements never written"
    set_deterministic_mode(True, split_size=128)
    want, want_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    ref, ref_lse = attention_ref(q, k, v, causal=True)
    assert (out[:, :max(c["Sq"] - c["Sk"], 0)] == 0).all()
    assert_close(out, ref, c["dtype"], *tolerance(device, c["dtype"]))
    assert_lse_close(lse, ref_lse)


def test_raw_fwd_bad_arguments():
    g = make_gen(302)
    q, k, v = make_qkv(g, 1, 4, 4, 2, 2, 16, torch.float16)
    out, lse = _poisoned(q)
    with pytest.raises(TypeError, match="^fwd: expected 16 arguments"):
        _C.fwd(1, 2, 3)
    from torch.utils.dlpack import to_dlpack
    caps = [to_dlpack(t) for t in (q, k, v, out, lse)]
    with pytest.raises(TypeError, match="^q: expected a torch.Tensor or a DLPack capsule, got list"):
        _C.fwd([q], *caps[1:], None, None, 0.25, 0.0, -1, -1, 0, 1, 512, 0, 0)
    caps = [to_dlpack(t) for t in (q, k, v, out, lse)]
    with pytest.raises(TypeError, match="^split_size: expected an int"):
        _C.fwd(*caps, None, None, 0.25, 0.0, -1, -1, 0, 1, "512", 0, 0)
    caps = [to_dlpack(t) for t in (q, k, v, out, lse)]
    with pytest.raises(ValueError, match="^window_left:"):
        _C.fwd(*caps, None, None, 0.25, 0.0, 1 << 40, -1, 0, 1, 512, 0, 0)
    assert (out == 7).all() and (lse == 7).all()


@pytest.mark.skipif(not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
                    reason="torch without the DLPack C exchange API (< 2.11)")
def test_raw_fwd_takes_tensors_and_capsules_alike():
    """With torch's exchange API registered, _C takes tensor objects (no capsule) and
    capsules, mixed, with the same result."""
    from torch.utils.dlpack import to_dlpack
    g = make_gen(303)
    q, k, v = make_qkv(g, 2, 5, 7, 2, 1, 32, torch.bfloat16)
    outs = []
    for wrap in ((lambda t: t), to_dlpack, (lambda t: t if t is q or t is v else to_dlpack(t))):
        out, lse = _poisoned(q)
        assert _C.fwd(*(wrap(t) for t in (q, k, v, out, lse)), None, None, 0.25, 0.0, -1, 0,
                      1, 1, 512, 0, 0) is None
        outs.append((out, lse))
    for out, lse in outs[1:]:
        assert torch.equal(out, outs[0][0]) and torch.equal(lse, outs[0][1])
    want, want_lse, _ = flash_attn_func(q, k, v, softmax_scale=0.25, causal=True,
                                        return_attn_probs=True)
    assert torch.equal(outs[0][0], want) and torch.equal(outs[0][1], want_lse)


def test_workspace_size_without_cuda_raises_or_answers():
    if flash_attn_det.has_cuda() and torch.cuda.is_available():
        assert _C.fwd_workspace_size(1, 1, 1, 1, 1, 64, 1, 512, 0, 0) >= 0
    else:
        with pytest.raises(RuntimeError, match="CUDA"):
            _C.fwd_workspace_size(1, 1, 1, 1, 1, 64, 1, 512, 0, 0)


# --- devices ---------------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("which", ["k", "v", "alibi"])
def test_device_mix(which):
    g = make_gen(400)
    q, k, v = make_qkv(g, 1, 8, 8, 2, 2, 32, torch.float16, device="cuda")
    slopes = make_alibi(g, (2,), device="cuda")
    if which == "k":
        k = k.cpu()
    elif which == "v":
        v = v.cpu()
    else:
        slopes = slopes.cpu()
    name = "alibi_slopes" if which == "alibi" else which
    with pytest.raises(ValueError, match=f"^{name}: must be on the same device as q"):
        flash_attn_func(q, k, v, alibi_slopes=slopes)
    with pytest.raises(ValueError, match="^k: must be on the same device as q"):
        flash_attn_func(q.cpu(), k.cuda(), v.cpu())


def test_reference_chunking_is_exact(monkeypatch):
    """attention_ref's row chunking (used for long inputs) changes nothing beyond float64
    roundoff (BLAS may block a float64 matmul differently for a different row count)."""
    from flash_attn_det import testing
    g = make_gen(111)
    q, k, v = make_qkv(g, 2, 50, 70, 4, 2, 16, torch.bfloat16)
    slopes = make_alibi(g, (2, 4))
    kw = dict(causal=True, window_size=(30, 0), softcap=3.0, alibi_slopes=slopes)
    whole = attention_ref(q, k, v, **kw)
    monkeypatch.setattr(testing, "_MAX_SCORE_ELEMS", 2 * 4 * 70 * 7)  # 7 rows per chunk
    chunked = attention_ref(q, k, v, **kw)
    torch.testing.assert_close(chunked[0], whole[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked[1], whole[1], rtol=1e-12, atol=1e-12)


def test_assert_batch_invariant_helper():
    from flash_attn_det.testing import assert_batch_invariant
    gen = torch.Generator().manual_seed(61)
    q, k, v = (torch.randn(4, 50, 2, 32, generator=gen).to(torch.bfloat16) for _ in range(3))
    assert_batch_invariant(lambda q, k, v: flash_attn_func(q, k, v, causal=True), q, k, v)
    assert_batch_invariant(lambda q, k, v: flash_attn_func(q, k, v, return_attn_probs=True)[:2],
                           q, k, v, splits=[3, 1])
    # A batch-dependent function is caught.
    with pytest.raises(AssertionError, match="differ"):
        assert_batch_invariant(lambda q: q - q.float().mean().to(q.dtype), q)



@requires_cuda
@pytest.mark.parametrize("case,exc,match", [  # (the device-independent refusals: above)
    ("misaligned_q", ValueError, "^q: data pointer must be 16-byte aligned"),
    ("odd_stride_k", ValueError, "^k: strides must be multiples of 8"),
    ("heads", ValueError, "^num_heads_k:"),
    ("split_size", ValueError, "^split_size:"),
    ("schedule", ValueError, "^schedule:"),
    ("lse_on_cpu", ValueError, "^softmax_lse: must be on the same device"),
])
def test_raw_refused_call_writes_nothing_gpu_rules(case, exc, match):
    """The kernels' own rules (16-byte rows, one device) at a size that splits over CTAs."""
    g = make_gen(14)
    B, Sq, Sk, H, Hk, D = 1, 64, 3000, 4, 2, 64
    if case == "heads":
        H, Hk = 6, 4
    q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, D, torch.float16, "cuda")
    out = torch.full_like(q, 7.0)
    lse = torch.full((B, H, Sq), 7.0, device="cuda")
    kw = {}
    if case == "misaligned_q":
        flat = randn(g, (q.numel() + 8,), torch.float16, "cuda")
        q = flat[4:4 + q.numel()].view(q.shape)
    elif case == "odd_stride_k":
        wide = randn(g, (B, Sk, Hk, D + 4), torch.float16, "cuda")
        k = wide[..., :D]
    elif case == "split_size":
        kw.update(split_size=96)
    elif case == "schedule":
        kw.update(schedule=3)
    elif case == "lse_on_cpu":
        lse = torch.full((B, H, Sq), 7.0)
    out0, lse0 = out.clone(), lse.clone()
    with pytest.raises(exc, match=match):
        raw_fwd(q, k, v, out, lse, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, out0) and torch.equal(lse, lse0)


@requires_cuda
@pytest.mark.parametrize("workspace", ["small", "missing"])
def test_raw_short_workspace_answers_its_size_and_writes_nothing(workspace):
    """A call whose workspace is short does not run: it returns the bytes it needs."""
    g = make_gen(15)
    q, k, v = make_qkv(g, 1, 64, 3000, 4, 2, 64, torch.float16, "cuda")
    out, lse = torch.full_like(q, 7.0), torch.full((1, 4, 64), 7.0, device="cuda")
    with force_schedule("cta_per_split"):
        need = workspace_bytes(q, k)
    ws = torch.empty(16, dtype=torch.uint8, device="cuda") if workspace == "small" else None
    got = raw_fwd(q, k, v, out, lse, schedule=_C.SCHEDULE_CTA_PER_SPLIT, workspace=ws)
    torch.cuda.synchronize()
    assert need > 16 and got == need
    assert (out == 7.0).all() and (lse == 7.0).all()
    assert raw_fwd(q, k, v, out, lse, schedule=_C.SCHEDULE_CTA_PER_SPLIT,
                   workspace=torch.empty(need, dtype=torch.uint8, device="cuda")) is None


@requires_cuda
def test_workspace_size_is_zero_for_one_cta_and_positive_for_split():
    g = make_gen(15)
    q, k, _ = make_qkv(g, 1, 64, 5000, 4, 4, 64, torch.bfloat16, "cuda")
    with force_schedule("one_cta"):
        assert workspace_bytes(q, k) == 0
    with force_schedule("cta_per_split"):
        assert workspace_bytes(q, k) > 0
    with force_schedule("auto"):
        assert workspace_bytes(q, k) > 0  # tiny grid: auto spreads splits over CTAs


@requires_cuda
def test_plan_past_one_merge_group():
    """More than 1024 splits of a sequence are folded in two levels, by the combine or by the
    prefill kernel's group walk: past that a forced one-CTA schedule takes the walk, whose
    workspace is its pool of X slots (64 an SM of 32 x 136 fp32 and a flag: fad_config.h),
    whatever the rows, while the automatic one takes a CTA per split where its partials are
    small (these shapes); at 1024 splits the one-CTA schedule needs no workspace. Prefill
    (64 query rows) and decode (1 row, GQA 4:1: the walk runs it on the prefill kernel)
    shapes; the keys are expand()ed."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    x_pool = 64 * sms * (32 * 136 * 4 + 4)
    for sq, h in ((64, 4), (1, 8)):
        q = torch.zeros(1, sq, h, 64, dtype=torch.bfloat16, device="cuda")
        for splits in (1024, 1025):
            n = (splits - 1) * 512 + 1  # the last split holds one key
            k = torch.zeros(1, 1, 2, 64, dtype=torch.bfloat16, device="cuda").expand(1, n, 2, 64)
            need = {}
            for sched in ("one_cta", "cta_per_split", "auto"):
                with force_schedule(sched):
                    need[sched] = workspace_bytes(q, k)
            assert need["cta_per_split"] > 0, (sq, splits, need)
            if splits == 1024:
                assert need["one_cta"] == 0, (sq, splits, need)
            else:
                assert need["one_cta"] == x_pool, (sq, splits, need)
                assert need["auto"] == need["cta_per_split"] < 2 ** 30, (sq, splits, need)


@requires_cuda
def test_decode_plan_one_cta_where_the_shapes_give_the_lengths():
    """From 0.8 to 1 CTA an SM (B x Hkv CTAs of the packed kernel), a deterministic call whose
    every sequence has seqlen_k keys (no cache_seqlens, cu_seqlens_k or seqused_k) runs one CTA
    per (sequence, kv head): no workspace (fad_core.c). A kv-cache call of the same shapes, whose
    lengths the plan cannot see, and num_splits=1 give the same bits."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B = sms // 8
    assert 5 * B * 8 >= 4 * sms
    g = make_gen(17)
    q, k, v = make_qkv(g, B, 1, 4096, 32, 8, 128, torch.bfloat16, "cuda")
    assert workspace_bytes(q, k) == 0
    with force_schedule("cta_per_split"):
        assert workspace_bytes(q, k) > 0
    o = flash_attn_func(q, k, v, causal=True)
    seqlens = torch.full((B,), 4096, dtype=torch.int32, device="cuda")
    o_cache = flash_attn_det.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True)
    o_one = flash_attn_det.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True,
                                                   num_splits=1)
    assert torch.equal(o, o_cache) and torch.equal(o, o_one)
    # below 0.8 an SM the CTA per split stays
    q2, k2, _ = make_qkv(g, max(1, (sms * 6 // 10) // 8), 1, 4096, 32, 8, 128, torch.bfloat16, "cuda")
    assert workspace_bytes(q2, k2) > 0


@requires_cuda
def test_decode_plan_spreads_splits_below_two_ctas_an_sm():
    """The automatic schedule of the packed (decode) kernel, deterministic mode: a CTA per
    split (a workspace for the partials) while the B x Hkv CTAs number below 1.9 an SM, one CTA
    per (sequence, kv head) from there (no workspace): fad_core.c's rule, from the measured
    probe (and from 0.8 to 1 an SM where the shapes give the lengths: the test above). GQA
    32/8, one query token, a 4k cache."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    g = make_gen(16)
    for ctas, split in ((sms // 2, True), (sms + 8, True), (sms * 19 // 10 - 8, True),
                        (sms * 19 // 10 + 8, False), (sms * 3, False)):
        B = -(-ctas // 8)
        q, k, _ = make_qkv(g, B, 1, 4096, 32, 8, 128, torch.bfloat16, "cuda")
        assert (workspace_bytes(q, k) > 0) == split, f"B {B} ({B * 8} CTAs on {sms} SMs)"
