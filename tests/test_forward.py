"""Forward correctness against the float64 reference (flash_attn_det.testing.attention_ref), on
every device: the CPU path in CI, the tensor-core kernels on a GPU (larger shapes there, to reach
every kernel variant: head-dim classes, split schedules, the packed decode kernel). Also the
tensor layouts the entry points take, and the GPU's streams and graph capture."""
import pytest
import torch

from flash_attn_det import flash_attn_func, set_deterministic_mode
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import (DEVICES, DTYPES, both, make_alibi, make_gen, make_qkv, on_devices, randn,
                      requires_cuda, rising_scores, row_mask_count, run_and_check)


# --------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,D", on_devices(cpu=[8, 24, 64, 80, 128, 256],
                                                cuda=[8, 40, 64, 72, 128, 136, 192, 200, 256]))
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(device, dtype, D, causal):
    shape = (2, 37, 77, 3, 3) if device == "cpu" else (2, 100, 300, 4, 2)
    q, k, v = make_qkv(make_gen(1000 + D), *shape, D, dtype, device)
    run_and_check(q, k, v, causal=causal)


_SEQLENS_CPU = [(40, 1, 1), (40, 1, 200), (40, 200, 1), (40, 63, 65), (40, 65, 63), (40, 100, 37),
                (40, 37, 100), (40, 129, 129)]
_SEQLENS_GPU = [(D, Sq, Sk) for D in (64, 128) for Sq, Sk in
                [(1, 1), (1, 1000), (1, 3000), (63, 65), (65, 63), (1000, 1000), (3000, 3000),
                 (1000, 3000), (3000, 1000), (129, 5)]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(cpu=_SEQLENS_CPU, cuda=_SEQLENS_GPU))
@pytest.mark.parametrize("causal", [False, True])
def test_seqlens(device, dtype, case, causal):
    D, Sq, Sk = case
    H, Hk = (2, 2) if device == "cpu" else (4, 2)
    q, k, v = make_qkv(make_gen(Sq * 1000 + Sk), 2, Sq, Sk, H, Hk, D, dtype, device)
    _, lse, _, _ = run_and_check(q, k, v, causal=causal)
    assert int(torch.isneginf(lse[0, 0]).sum()) == row_mask_count(Sq, Sk, (-1, -1), causal)


_WINDOWS_CPU = [(w, s) for w in [(-1, 0), (5, -1), (3, 3), (0, 0), (0, -1), (17, 2), (200, -1),
                                 (-1, 7)] for s in [(50, 80), (80, 50)]]
_WINDOWS_GPU = [(w, s) for w in [(-1, 0), (5, -1), (3, 3), (0, 0), (100, 0), (256, 64), (-1, 200),
                                 (1000, -1)] for s in [(500, 1100), (1100, 500)]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(cpu=_WINDOWS_CPU, cuda=_WINDOWS_GPU))
def test_sliding_window(device, dtype, case):
    window, (Sq, Sk) = case
    H, Hk, D, h = (2, 1, 32, 0) if device == "cpu" else (4, 2, 128, 3)
    q, k, v = make_qkv(make_gen(7 + Sq), 2, Sq, Sk, H, Hk, D, dtype, device)
    _, lse, _, _ = run_and_check(q, k, v, window_size=window)
    assert int(torch.isneginf(lse[1, h]).sum()) == row_mask_count(Sq, Sk, window, False)


@pytest.mark.parametrize("device", DEVICES)
def test_window_actually_masks(device):
    """A window result must differ from the unmasked one (the option is not ignored)."""
    q, k, v = make_qkv(make_gen(3), 1, 40, 40, 2, 2, 32, torch.bfloat16, device)
    full = flash_attn_func(q, k, v)
    win = flash_attn_func(q, k, v, window_size=(3, 3))
    assert (full.double() - win.double()).abs().max() > 0.05


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (10, -1), (4, 0)])
def test_causal_is_window_right_zero(device, window):
    """causal=True is window_size=(left, 0), bit for bit, whatever right was passed."""
    q, k, v = make_qkv(make_gen(11), 2, 30, 45, 2, 2, 16, torch.float16, device)
    a = flash_attn_func(q, k, v, causal=True, window_size=window)
    b = flash_attn_func(q, k, v, causal=False, window_size=(window[0], 0))
    assert torch.equal(a, b)
    run_and_check(q, k, v, causal=True, window_size=window)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,heads", on_devices(cpu=[(8, 2), (4, 1), (6, 3)],
                                                    cuda=[(8, 2), (4, 1), (32, 8), (6, 6)]))
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(device, dtype, heads, causal):
    H, Hk = heads
    Sq, Sk, D = (33, 70, 32) if device == "cpu" else (200, 700, 128)
    q, k, v = make_qkv(make_gen(H * 10 + Hk), 2, Sq, Sk, H, Hk, D, dtype, device)
    out, lse, _, _ = run_and_check(q, k, v, causal=causal)
    # GQA reads the shared kv head: same bits as expanding K/V to H heads.
    ke, ve = k.repeat_interleave(H // Hk, dim=2), v.repeat_interleave(H // Hk, dim=2)
    out_e, lse_e = both(q, ke, ve, causal=causal)
    assert torch.equal(out, out_e) and torch.equal(lse, lse_e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap", [1.5, 30.0])
@pytest.mark.parametrize("device,D", on_devices(cpu=[64], cuda=[64, 128, 256]))
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(device, dtype, softcap, D, causal):
    shape = (2, 40, 90, 2, 2) if device == "cpu" else (2, 300, 900, 4, 4)
    # q scaled up so scores reach the nonlinear part of tanh for the small cap.
    q, k, v = make_qkv(make_gen(int(softcap * 10) + D), *shape, D, dtype, device, q_scale=3.0)
    _, _, ref, _ = run_and_check(q, k, v, causal=causal, softcap=softcap)
    if softcap < 10:
        plain, _ = attention_ref(q, k, v, causal=causal)
        assert (plain - ref).abs().max() > 0.05, "softcap had no effect on the reference"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope_shape", ["H", "BH"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("device,D", on_devices(cpu=[32], cuda=[64, 200]))
def test_alibi(device, dtype, slope_shape, causal, D):
    g = make_gen(5 if slope_shape == "H" else 6)
    B, H, Hk, Sq, Sk = (3, 4, 2, 45, 60) if device == "cpu" else (3, 8, 2, 257, 1000)
    q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, D, dtype, device)
    slopes = make_alibi(g, (H,) if slope_shape == "H" else (B, H), device)
    _, _, ref, _ = run_and_check(q, k, v, causal=causal, alibi_slopes=slopes)
    plain, _ = attention_ref(q, k, v, causal=causal)
    assert (plain - ref).abs().max() > 0.05, "alibi had no effect on the reference"


@pytest.mark.parametrize("device", DEVICES)
def test_alibi_strided_batch_slopes(device):
    """(B, H) slopes taken as a column slice (batch stride > H) are read correctly."""
    g = make_gen(8)
    B, H = 2, 4
    q, k, v = make_qkv(g, B, 20, 50, H, H, 16, torch.bfloat16, device)
    slopes = make_alibi(g, (B, 2 * H), device)[:, :H]
    assert slopes.stride(0) == 2 * H
    out, _, _, _ = run_and_check(q, k, v, alibi_slopes=slopes)
    assert torch.equal(out, flash_attn_func(q, k, v, alibi_slopes=slopes.contiguous()))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(
    cpu=[dict(B=2, Sq=30, Sk=75, H=4, D=64, window=(-1, -1), scale=None)],
    cuda=[dict(B=2, Sq=700, Sk=1500, H=8, D=136, window=(600, 0), scale=0.11)]))
def test_alibi_softcap_window_scale_together(device, dtype, case):
    c = case
    g = make_gen(9)
    q, k, v = make_qkv(g, c["B"], c["Sq"], c["Sk"], c["H"], 2, c["D"], dtype, device, q_scale=2.0)
    slopes = make_alibi(g, (c["B"], c["H"]), device)
    kw = dict(causal=True, window_size=c["window"], softcap=5.0 if device == "cpu" else 12.0,
              alibi_slopes=slopes)
    if c["scale"] is not None:
        kw["softmax_scale"] = c["scale"]
    run_and_check(q, k, v, **kw)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0])
def test_softmax_scale(device, scale):
    q, k, v = make_qkv(make_gen(12), 2, 25, 40, 2, 2, 64, torch.bfloat16, device)
    run_and_check(q, k, v, softmax_scale=scale)


@pytest.mark.parametrize("device", DEVICES)
def test_return_attn_probs_and_plain_return_agree(device):
    q, k, v = make_qkv(make_gen(13), 2, 21, 33, 2, 2, 64, torch.float16, device)
    out = flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor)
    res = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3 and res[2] is None
    assert torch.equal(out, res[0])
    # lse is natural-log logsumexp of the scaled scores: check one row by hand.
    s = (q[0, 5, 1].double() @ k[0, :5 + 33 - 21 + 1, 1].double().T) * 64 ** -0.5
    assert abs(float(res[1][0, 1, 5]) - float(torch.logsumexp(s, 0))) < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(cpu=[(10, 4, 2, 32)], cuda=[(300, 100, 4, 64)]))
def test_fully_masked_rows_causal(device, dtype, case):
    """Causal with Sq > Sk: the first Sq - Sk rows see no key -> out 0, lse -inf."""
    Sq, Sk, H, D = case
    q, k, v = make_qkv(make_gen(14), 2, Sq, Sk, H, 2, D, dtype, device)
    out, lse, _, _ = run_and_check(q, k, v, causal=True)
    assert (out[:, :Sq - Sk] == 0).all() and torch.isneginf(lse[:, :, :Sq - Sk]).all()
    assert (out[:, Sq - Sk:].abs().amax(dim=-1) > 0).all()
    assert torch.isfinite(lse[:, :, Sq - Sk:]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_fully_masked_rows_window(device):
    """A window that leaves some rows (in the middle of a sequence too) with no key."""
    Sq, Sk = 40, 12
    q, k, v = make_qkv(make_gen(15), 1, Sq, Sk, 2, 2, 16, torch.bfloat16, device)
    window = (2, 1)  # row i sees keys [i - 30, i - 27]: rows < 27 see nothing
    _, lse, _, _ = run_and_check(q, k, v, window_size=window)
    n = row_mask_count(Sq, Sk, window, False)
    assert n == 27 and int(torch.isneginf(lse[0, 0]).sum()) == n


@pytest.mark.parametrize("device,case", on_devices(cpu=[(5, 2, 16)], cuda=[(70, 4, 64)]))
def test_no_keys_at_all(device, case):
    """Sk == 0: every row is fully masked."""
    Sq, H, D = case
    q = randn(make_gen(16), (2, Sq, H, D), torch.float16, device)
    kv = torch.empty((2, 0, H, D), dtype=torch.float16, device=device)
    out, lse = both(q, kv, kv)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isneginf(lse).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(0, 5, 2, 16), (2, 0, 2, 16), (0, 70, 4, 64)])
def test_empty_query(device, shape):
    g = make_gen(17)
    q = randn(g, shape, torch.bfloat16, device)
    kv_shape = (shape[0], 7 if shape[3] == 16 else 30, shape[2], shape[3])
    k, v = randn(g, kv_shape, torch.bfloat16, device), randn(g, kv_shape, torch.bfloat16, device)
    out, lse = both(q, k, v)
    assert out.shape == shape and lse.shape == (shape[0], shape[2], shape[1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split_size", [128, 256, 512])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (300, 50)},
                                {"softcap": 4.0, "causal": True}])
def test_multiple_splits(device, split_size, kw):
    set_deterministic_mode(True, split_size=split_size)
    q, k, v = make_qkv(make_gen(18), 1, 20, 700, 2, 1, 32, torch.bfloat16, device, q_scale=2.0)
    run_and_check(q, k, v, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,D", on_devices(cpu=[64, 128], cuda=[64, 128, 256]))
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [True, False])
def test_rising_running_max(device, dtype, D, causal, det):
    """Scores whose max rises ~7.5 log2 units per tile: the stale-max and the rescale
    branches of the online softmax both run (on every kernel on a GPU), and the result
    still matches float64."""
    if device == "cpu":
        set_deterministic_mode(det, split_size=256)
        shape = (2, 200, 700, 2, 1)
    else:
        set_deterministic_mode(det)
        shape = (2, 700, 2100, 4, 2)
    q, k, v = make_qkv(make_gen(D + causal), *shape, D, dtype, device)
    q, k = rising_scores(q, k)
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(
    cpu=[((2, 30, 300, 2, 2, 64), True)],
    cuda=[((B, Sq, Sk, 8, 2, 128), c) for c in (False, True)
          for B, Sq, Sk in [(1, 1, 5000), (1, 128, 4000), (16, 500, 500)]]))
def test_fast_mode_correct(device, dtype, case):
    set_deterministic_mode(False)
    shape, causal = case
    q, k, v = make_qkv(make_gen(19), *shape, dtype, device)
    run_and_check(q, k, v, causal=causal)


@requires_cuda
@pytest.mark.parametrize("causal", [False, True])
def test_large_causal(causal):
    """B=2, L=4096, H=8, D=128 against the float64 reference (computed in row chunks)."""
    q, k, v = make_qkv(make_gen(8), 2, 4096, 4096, 8, 8, 128, torch.bfloat16, "cuda")
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("device,s_list", on_devices(cpu=[(128, 384, 512, 1024)],
                                                     cuda=[(128, 256, 512, 2048, 4096)]))
def test_split_size_each_correct(device, s_list):
    """Each split_size is correct, and the plan is fixed per split_size (a rerun is identical)."""
    shape = (1, 300, 4000, 4, 4, 128) if device == "cuda" else (2, 40, 700, 2, 2, 64)
    q, k, v = make_qkv(make_gen(107), *shape, torch.bfloat16, device)
    results = {}
    for s in s_list:
        set_deterministic_mode(True, split_size=s)
        results[s] = run_and_check(q, k, v, causal=device == "cuda")[0]
        assert torch.equal(results[s], flash_attn_func(q, k, v, causal=device == "cuda"))
    if device == "cpu":  # split_size >= Sk is one split: the fast-mode single-split plan
        set_deterministic_mode(False)
        assert torch.equal(results[1024], flash_attn_func(q, k, v))


# --------------------------------------------------------------------------
# layouts the entry points take (the wrapper copies only what the kernels cannot read)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("device,case", on_devices(cpu=[(2, 3, 50, 64, torch.bfloat16)],
                                                   cuda=[(2, 8, 333, 128, torch.float16)]))
def test_transposed_views(device, case):
    """q/k/v as x.transpose(1, 2) of (B, H, L, D) tensors: right and bit-equal to contiguous."""
    B, H, L, D, dtype = case
    g = make_gen(20)
    xq, xk, xv = (randn(g, (B, H, L, D), dtype, device) for _ in range(3))
    q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, lse, _, _ = run_and_check(q, k, v, causal=True)
    out_c, lse_c = both(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)


@pytest.mark.parametrize("device,case", on_devices(cpu=[(2, 45, 4, 32)], cuda=[(2, 333, 8, 128)]))
def test_packed_qkv_slices(device, case):
    """q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2] of a packed (B, L, 3, H, D) tensor."""
    B, L, H, D = case
    qkv = randn(make_gen(21), (B, L, 3, H, D), torch.float16, device)
    q, k, v = qkv.unbind(dim=2)
    assert q.stride(1) == 3 * H * D
    out, _, _, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
def test_head_dim_slice_and_noncontiguous_last_dim(device):
    g = make_gen(22)
    B, L, H, D = 1, 30, 2, 32
    q = randn(g, (B, L, H, 2 * D), torch.bfloat16, device)[..., :D]  # a wide tensor's strides
    k = randn(g, (B, L, H, D), torch.bfloat16, device)
    vt = randn(g, (B, L, H, D), torch.bfloat16, device).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert vt.stride(-1) != 1  # last dim not contiguous: the wrapper copies it
    out, _, _, _ = run_and_check(q, k, vt)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k, vt.contiguous()))


@pytest.mark.parametrize("device", DEVICES)
def test_expanded_kv_broadcast_batch(device):
    """k/v expanded over the batch (stride 0) give the same bits as real copies."""
    g = make_gen(23)
    q = randn(g, (3, 20, 2, 16), torch.bfloat16, device)
    k1, v1 = (randn(g, (1, 40, 2, 16), torch.bfloat16, device) for _ in range(2))
    k, v = k1.expand(3, -1, -1, -1), v1.expand(3, -1, -1, -1)
    out, _, _, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q, k.contiguous(), v.contiguous()))


@requires_cuda
def test_misaligned_data_pointer_is_handled():
    """A contiguous view whose data pointer breaks the 16-byte rule is copied by the wrapper."""
    g = make_gen(10)
    B, L, H, D = 2, 100, 4, 64
    n = B * L * H * D
    flat = randn(g, (n + 8,), torch.bfloat16, "cuda")
    q = flat[1:n + 1].view(B, L, H, D)  # data pointer 2 bytes off, otherwise contiguous
    assert q.data_ptr() % 16 and q.is_contiguous()
    k = randn(g, (B, L, H, D), torch.bfloat16, "cuda")
    v = randn(g, (B, L, H, D), torch.bfloat16, "cuda")
    out, _, _, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q.clone(), k, v))


@requires_cuda
def test_size1_dim_with_odd_stride_is_handled():
    """Decode-shaped q (seqlen 1) whose size-1 dim carries a stride that is not a multiple
    of 8: torch calls it contiguous, the kernels' stride rule does not."""
    g = make_gen(10)
    B, L, H, D = 2, 100, 4, 64
    k = randn(g, (B, L, H, D), torch.bfloat16, "cuda")
    v = randn(g, (B, L, H, D), torch.bfloat16, "cuda")
    q = randn(g, (B, 1, H, D), torch.bfloat16, "cuda")
    q1 = q.as_strided((B, 1, H, D), (H * D, 3, D, 1))
    assert q1.is_contiguous() and q1.stride(1) == 3
    out1, _, _, _ = run_and_check(q1, k, v)
    assert torch.equal(out1, flash_attn_func(q, k, v))


# --------------------------------------------------------------------------
# streams and graphs (GPU)
# --------------------------------------------------------------------------

@requires_cuda
def test_non_default_stream():
    q, k, v = make_qkv(make_gen(11), 2, 500, 2000, 8, 2, 128, torch.bfloat16, "cuda")
    base = flash_attn_func(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(out, base)


@requires_cuda
def test_cuda_graph_capture():
    g = make_gen(12)
    q, k, v = make_qkv(g, 1, 64, 3000, 8, 2, 128, torch.bfloat16, "cuda")  # auto -> split CTAs
    for name in ("auto", "cta_per_split", "one_cta"):
        with force_schedule(name):
            sq, sk, sv = q.clone(), k.clone(), v.clone()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                flash_attn_func(sq, sk, sv, causal=True)  # warm-up outside capture
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = flash_attn_func(sq, sk, sv, causal=True)
            q2, k2, v2 = make_qkv(g, 1, 64, 3000, 8, 2, 128, torch.bfloat16, "cuda")
            sq.copy_(q2), sk.copy_(k2), sv.copy_(v2)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, flash_attn_func(q2, k2, v2, causal=True)), name
