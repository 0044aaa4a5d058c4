"""CPU tests: correctness against the float64 reference, the bit-invariance
contract, the mode switches and the argument checks. Runs without a GPU."""
import pytest
import torch

import flash_attn_det
from flash_attn_det import (_C, flash_attn_func, get_deterministic_mode, get_split_size, mode,
                            set_deterministic_mode)
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import (DTYPES, assert_close, assert_lse_close, make_alibi, make_gen, make_qkv,
                      randn, raw_fwd, requires_cuda, rising_scores, row_mask_count)

# The CPU path accumulates in fp32 and rounds once to fp16/bf16: its error is
# the output rounding (<= 1 unit roundoff relative) plus a few fp32 ulps.
ATOL = 2e-5
ULPS = 1.0


def run_and_check(q, k, v, **kw):
    """flash_attn_func vs attention_ref on out and lse; returns (out, lse, ref_out, ref_lse)."""
    out, lse, none = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert none is None
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    B, Sq, H, _ = q.shape
    assert lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    ref_kw = {n: kw[n] for n in ("softmax_scale", "causal", "window_size", "softcap",
                                 "alibi_slopes") if n in kw}
    ref_out, ref_lse = attention_ref(q, k, v, **ref_kw)
    masked = torch.isneginf(ref_lse).transpose(1, 2)  # (B, Sq, H)
    assert_close(out, ref_out, q.dtype, ATOL, ULPS, allow_zero_ref=bool(masked.all()))
    assert_lse_close(lse, ref_lse)
    # Rows that see no key: exactly zero output.
    if masked.any():
        assert (out[masked] == 0).all()
    return out, lse, ref_out, ref_lse


# --------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [8, 24, 64, 80, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(dtype, D, causal):
    g = make_gen(1000 + D)
    q, k, v = make_qkv(g, 2, 37, 77, 3, 3, D, dtype)
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 200), (200, 1), (63, 65), (65, 63), (100, 37),
                                   (37, 100), (129, 129)])
@pytest.mark.parametrize("causal", [False, True])
def test_seqlens(dtype, Sq, Sk, causal):
    g = make_gen(Sq * 1000 + Sk)
    q, k, v = make_qkv(g, 2, Sq, Sk, 2, 2, 40, dtype)
    _, lse, _, _ = run_and_check(q, k, v, causal=causal)
    n_masked = row_mask_count(Sq, Sk, (-1, -1), causal)
    assert int(torch.isneginf(lse[0, 0]).sum()) == n_masked


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [(-1, 0), (5, -1), (3, 3), (0, 0), (0, -1), (17, 2),
                                    (200, -1), (-1, 7)])
@pytest.mark.parametrize("Sq,Sk", [(50, 80), (80, 50)])
def test_sliding_window(dtype, window, Sq, Sk):
    g = make_gen(7 + Sq)
    q, k, v = make_qkv(g, 2, Sq, Sk, 2, 1, 32, dtype)
    out, lse, _, _ = run_and_check(q, k, v, window_size=window)
    assert int(torch.isneginf(lse[1, 0]).sum()) == row_mask_count(Sq, Sk, window, False)


def test_window_actually_masks():
    """A window result must differ from the unmasked one (the option is not ignored)."""
    g = make_gen(3)
    q, k, v = make_qkv(g, 1, 40, 40, 2, 2, 32, torch.bfloat16)
    full = flash_attn_func(q, k, v)
    win = flash_attn_func(q, k, v, window_size=(3, 3))
    assert (full.double() - win.double()).abs().max() > 0.05


@pytest.mark.parametrize("window", [(-1, -1), (-1, 0), (10, -1), (4, 0)])
def test_causal_is_window_right_zero(window):
    """causal=True is window_size=(left, 0), bit for bit, whatever right was passed."""
    g = make_gen(11)
    q, k, v = make_qkv(g, 2, 30, 45, 2, 2, 16, torch.float16)
    a = flash_attn_func(q, k, v, causal=True, window_size=window)
    b = flash_attn_func(q, k, v, causal=False, window_size=(window[0], 0))
    assert torch.equal(a, b)
    run_and_check(q, k, v, causal=True, window_size=window)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hk", [(8, 2), (4, 1), (6, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(dtype, H, Hk, causal):
    g = make_gen(H * 10 + Hk)
    q, k, v = make_qkv(g, 2, 33, 70, H, Hk, 32, dtype)
    out, lse, _, _ = run_and_check(q, k, v, causal=causal)
    # GQA reads the shared kv head: same bits as expanding K/V to H heads.
    ke, ve = k.repeat_interleave(H // Hk, dim=2), v.repeat_interleave(H // Hk, dim=2)
    out_e, lse_e, _ = flash_attn_func(q, ke, ve, causal=causal, return_attn_probs=True)
    assert torch.equal(out, out_e) and torch.equal(lse, lse_e)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap", [1.5, 30.0])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(dtype, softcap, causal):
    g = make_gen(int(softcap * 10))
    # q scaled up so scores reach the nonlinear part of tanh for the small cap.
    q, k, v = make_qkv(g, 2, 40, 90, 2, 2, 64, dtype, q_scale=3.0)
    out, _, ref, _ = run_and_check(q, k, v, causal=causal, softcap=softcap)
    if softcap < 10:
        plain, _ = attention_ref(q, k, v, causal=causal)
        assert (plain - ref).abs().max() > 0.05, "softcap had no effect on the reference"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope_shape", ["H", "BH"])
@pytest.mark.parametrize("causal", [False, True])
def test_alibi(dtype, slope_shape, causal):
    g = make_gen(5 if slope_shape == "H" else 6)
    B, H = 3, 4
    q, k, v = make_qkv(g, B, 45, 60, H, 2, 32, dtype)
    slopes = make_alibi(g, (H,) if slope_shape == "H" else (B, H))
    out, _, ref, _ = run_and_check(q, k, v, causal=causal, alibi_slopes=slopes)
    plain, _ = attention_ref(q, k, v, causal=causal)
    assert (plain - ref).abs().max() > 0.05, "alibi had no effect on the reference"


def test_alibi_strided_batch_slopes():
    """(B, H) slopes taken as a column slice (batch stride > H) are read correctly."""
    g = make_gen(8)
    B, H = 2, 4
    q, k, v = make_qkv(g, B, 20, 50, H, H, 16, torch.bfloat16)
    wide = make_alibi(g, (B, 2 * H))
    slopes = wide[:, :H]
    assert slopes.stride(0) == 2 * H
    out, _, _, _ = run_and_check(q, k, v, alibi_slopes=slopes)
    assert torch.equal(out, flash_attn_func(q, k, v, alibi_slopes=slopes.contiguous()))


def test_alibi_and_softcap_together():
    g = make_gen(9)
    q, k, v = make_qkv(g, 2, 30, 75, 4, 2, 64, torch.float16, q_scale=2.0)
    slopes = make_alibi(g, (2, 4))
    run_and_check(q, k, v, causal=True, softcap=5.0, alibi_slopes=slopes)


@pytest.mark.parametrize("scale", [0.05, 0.3, 1.0])
def test_softmax_scale(scale):
    g = make_gen(12)
    q, k, v = make_qkv(g, 2, 25, 40, 2, 2, 64, torch.bfloat16)
    run_and_check(q, k, v, softmax_scale=scale)


def test_return_attn_probs_and_plain_return_agree():
    g = make_gen(13)
    q, k, v = make_qkv(g, 2, 21, 33, 2, 2, 64, torch.float16)
    out = flash_attn_func(q, k, v, causal=True)
    assert isinstance(out, torch.Tensor)
    res = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert isinstance(res, tuple) and len(res) == 3 and res[2] is None
    assert torch.equal(out, res[0])
    # lse is natural-log logsumexp of the scaled scores: check one row by hand.
    s = (q[0, 5, 1].double() @ k[0, :5 + 33 - 21 + 1, 1].double().T) * 64 ** -0.5
    assert abs(float(res[1][0, 1, 5]) - float(torch.logsumexp(s, 0))) < 1e-4


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows_causal(dtype):
    """Causal with Sq > Sk: the first Sq - Sk rows see no key -> out 0, lse -inf."""
    g = make_gen(14)
    Sq, Sk = 10, 4
    q, k, v = make_qkv(g, 2, Sq, Sk, 2, 2, 32, dtype)
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert (out[:, :Sq - Sk] == 0).all()
    assert torch.isneginf(lse[:, :, :Sq - Sk]).all()
    assert (out[:, Sq - Sk:].abs().amax(dim=-1) > 0).all()
    assert torch.isfinite(lse[:, :, Sq - Sk:]).all()
    run_and_check(q, k, v, causal=True)


def test_fully_masked_rows_window():
    """A window that leaves some rows (in the middle of a sequence too) with no key."""
    g = make_gen(15)
    Sq, Sk = 40, 12
    q, k, v = make_qkv(g, 1, Sq, Sk, 2, 2, 16, torch.bfloat16)
    window = (2, 1)  # row i sees keys [i - 30, i - 27]: rows < 27 see nothing
    _, lse, _, _ = run_and_check(q, k, v, window_size=window)
    n = row_mask_count(Sq, Sk, window, False)
    assert n == 27 and int(torch.isneginf(lse[0, 0]).sum()) == n


def test_no_keys_at_all():
    """Sk == 0: every row is fully masked."""
    g = make_gen(16)
    q = randn(g, (2, 5, 2, 16), torch.float16)
    k = v = torch.empty((2, 0, 2, 16), dtype=torch.float16)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse).all()


@pytest.mark.parametrize("shape", [(0, 5, 2, 16), (2, 0, 2, 16)])
def test_empty_query(shape):
    g = make_gen(17)
    q = randn(g, shape, torch.bfloat16)
    k, v = randn(g, (shape[0], 7, 2, 16), torch.bfloat16), randn(g, (shape[0], 7, 2, 16),
                                                                  torch.bfloat16)
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.shape == shape and lse.shape == (shape[0], 2, shape[1])


@pytest.mark.parametrize("split_size", [128, 256, 512])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (300, 50)},
                                {"softcap": 4.0, "causal": True}])
def test_multiple_splits(split_size, kw):
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(18)
    q, k, v = make_qkv(g, 1, 20, 700, 2, 1, 32, torch.bfloat16, q_scale=2.0)
    run_and_check(q, k, v, **kw)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [True, False])
def test_rising_running_max(dtype, D, causal, det):
    """Scores whose max rises ~7.5 log2 units per tile: the stale-max and the rescale
    branches of the online softmax both run, and the result still matches float64."""
    set_deterministic_mode(det, split_size=256)
    g = make_gen(D + causal)
    q, k, v = make_qkv(g, 2, 200, 700, 2, 1, D, dtype)
    q, k = rising_scores(q, k)
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_mode_correct(dtype):
    set_deterministic_mode(False)
    g = make_gen(19)
    q, k, v = make_qkv(g, 2, 30, 300, 2, 2, 64, dtype)
    run_and_check(q, k, v, causal=True)


# --------------------------------------------------------------------------
# views and strides
# --------------------------------------------------------------------------

def test_transposed_views():
    """q/k/v as x.transpose(1, 2) of (B, H, L, D) tensors: right and bit-equal to contiguous."""
    g = make_gen(20)
    B, H, L, D = 2, 3, 50, 64
    xq, xk, xv = (randn(g, (B, H, L, D), torch.bfloat16) for _ in range(3))
    q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
    assert not q.is_contiguous() and q.stride(-1) == 1
    out, lse, _, _ = run_and_check(q, k, v, causal=True)
    out_c, lse_c, _ = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True,
                                      return_attn_probs=True)
    assert torch.equal(out, out_c) and torch.equal(lse, lse_c)


def test_packed_qkv_slices():
    """q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2] of a packed (B, L, 3, H, D) tensor."""
    g = make_gen(21)
    B, L, H, D = 2, 45, 4, 32
    qkv = randn(g, (B, L, 3, H, D), torch.float16)
    q, k, v = qkv.unbind(dim=2)
    assert q.stride(1) == 3 * H * D
    out, _, _, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous()))


def test_head_dim_slice_and_noncontiguous_last_dim():
    g = make_gen(22)
    B, L, H, D = 1, 30, 2, 32
    wide = randn(g, (B, L, H, 2 * D), torch.bfloat16)
    q = wide[..., :D]  # row/head strides of the wide tensor
    k = randn(g, (B, L, H, D), torch.bfloat16)
    vt = randn(g, (B, L, H, D), torch.bfloat16).transpose(-1, -2).contiguous().transpose(-1, -2)
    assert vt.stride(-1) != 1  # last dim not contiguous: the wrapper copies it
    out, _, _, _ = run_and_check(q, k, vt)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k, vt.contiguous()))


def test_expanded_kv_broadcast_batch():
    """k/v expanded over the batch (stride 0) give the same bits as real copies."""
    g = make_gen(23)
    q = randn(g, (3, 20, 2, 16), torch.bfloat16)
    k1, v1 = randn(g, (1, 40, 2, 16), torch.bfloat16), randn(g, (1, 40, 2, 16), torch.bfloat16)
    k, v = k1.expand(3, -1, -1, -1), v1.expand(3, -1, -1, -1)
    out, _, _, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q, k.contiguous(), v.contiguous()))


# --------------------------------------------------------------------------
# the invariance contract (bitwise)
# --------------------------------------------------------------------------

SPLITS = [128, 512]


def _both(q, k, v, **kw):
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    return out, lse


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_size", SPLITS)
@pytest.mark.parametrize("causal", [False, True])
def test_seed_batch8_vs_two_batches_of_4(dtype, split_size, causal):
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(100)
    q, k, v = make_qkv(g, 8, 300, 300, 2, 2, 64, dtype)
    out, lse = _both(q, k, v, causal=causal)
    out_a, lse_a = _both(q[:4], k[:4], v[:4], causal=causal)
    out_b, lse_b = _both(q[4:], k[4:], v[4:], causal=causal)
    assert torch.equal(out, torch.cat([out_a, out_b]))
    assert torch.equal(lse, torch.cat([lse_a, lse_b]))


@pytest.mark.parametrize("split_size", SPLITS)
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (100, 3)}])
def test_sequence_alone_vs_in_batch(split_size, kw):
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(101)
    q1, k1, v1 = make_qkv(g, 1, 200, 260, 4, 2, 64, torch.bfloat16)
    alone, lse_alone = _both(q1, k1, v1, **kw)
    for B, pos in [(2, 0), (3, 1), (5, 4)]:
        q, k, v = make_qkv(g, B, 200, 260, 4, 2, 64, torch.bfloat16)  # fresh neighbours
        q[pos], k[pos], v[pos] = q1[0], k1[0], v1[0]
        out, lse = _both(q, k, v, **kw)
        assert torch.equal(out[pos], alone[0]), f"B={B} pos={pos}"
        assert torch.equal(lse[pos], lse_alone[0]), f"B={B} pos={pos}"


def test_head_alone_vs_among_heads():
    """The bits of one head do not depend on how many other heads are in the call."""
    g = make_gen(102)
    q, k, v = make_qkv(g, 2, 90, 150, 6, 3, 32, torch.float16)
    out, lse = _both(q, k, v, causal=True)
    for h in (0, 3, 5):
        hk = h // 2
        o1, l1 = _both(q[:, :, h:h + 1], k[:, :, hk:hk + 1], v[:, :, hk:hk + 1], causal=True)
        assert torch.equal(o1[:, :, 0], out[:, :, h]) and torch.equal(l1[:, 0], lse[:, h])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("split_size", SPLITS)
@pytest.mark.parametrize("rising", [False, True])
def test_prefill_vs_decode(dtype, split_size, rising):
    """Causal Sq=Sk=N: row t of the full call == a call with q = row t alone, k/v = keys [0, t]."""
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(103)
    N = 300
    q, k, v = make_qkv(g, 2, N, N, 4, 2, 64, dtype)
    if rising:
        q, k = rising_scores(q, k)
    full, full_lse = _both(q, k, v, causal=True)
    for t in [0, 1, 63, 64, 127, 128, 129, 255, 256, 299]:
        o, l = _both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True)
        assert torch.equal(o[:, 0], full[:, t]), f"row {t}"
        assert torch.equal(l[:, :, 0], full_lse[:, :, t]), f"row {t}"


@pytest.mark.parametrize("split_size", SPLITS)
@pytest.mark.parametrize("window", [(-1, 0), (70, 0)])
def test_chunked_prefill(split_size, window):
    """Rows [a, b) with k/v prefix [0, b) == the same rows of the full causal call."""
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(104)
    N = 300
    q, k, v = make_qkv(g, 2, N, N, 2, 1, 64, torch.bfloat16)
    full, full_lse = _both(q, k, v, causal=True, window_size=window)
    bounds = [0, 1, 37, 128, 129, 250, 300]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, l = _both(q[:, a:b], k[:, :b], v[:, :b], causal=True, window_size=window)
        assert torch.equal(o, full[:, a:b]), f"chunk [{a}, {b})"
        outs.append(o)
        lses.append(l)
    assert torch.equal(torch.cat(outs, 1), full)
    assert torch.equal(torch.cat(lses, 2), full_lse)


def test_decode_with_longer_cache_and_window():
    """A decode row with a sliding window sees the same keys whatever lies outside the window."""
    g = make_gen(105)
    N, W = 400, 50
    q, k, v = make_qkv(g, 1, N, N, 2, 2, 32, torch.float16)
    full, _ = _both(q, k, v, causal=True, window_size=(W, 0))
    t = 350
    o, _ = _both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True, window_size=(W, 0))
    assert torch.equal(o[:, 0], full[:, t])


def test_run_to_run():
    g = make_gen(106)
    q, k, v = make_qkv(g, 3, 150, 400, 4, 2, 64, torch.bfloat16)
    slopes = make_alibi(g, (4,))
    first, first_lse = _both(q, k, v, causal=True, softcap=10.0, alibi_slopes=slopes)
    for _ in range(4):
        out, lse = _both(q, k, v, causal=True, softcap=10.0, alibi_slopes=slopes)
        assert torch.equal(out, first) and torch.equal(lse, first_lse)


def test_split_size_changes_bits_but_not_correctness():
    """Each split_size is correct; the plan is fixed per split_size (rerun is identical)."""
    g = make_gen(107)
    q, k, v = make_qkv(g, 2, 40, 700, 2, 2, 64, torch.bfloat16)
    results = {}
    for s in (128, 384, 512, 1024):
        set_deterministic_mode(True, split_size=s)
        results[s] = run_and_check(q, k, v)[0]
        assert torch.equal(results[s], flash_attn_func(q, k, v))
    # split_size >= Sk is a single split: 1024 equals the fast-mode single-split plan.
    set_deterministic_mode(False)
    assert torch.equal(results[1024], flash_attn_func(q, k, v))


def test_deterministic_kwarg_is_accepted_and_has_no_effect():
    g = make_gen(108)
    q, k, v = make_qkv(g, 2, 30, 60, 2, 2, 32, torch.float16)
    assert torch.equal(flash_attn_func(q, k, v, deterministic=True),
                       flash_attn_func(q, k, v, deterministic=False))


@pytest.mark.parametrize("name", ["auto", "one_cta", "cta_per_split"])
def test_cpu_ignores_schedule(name):
    g = make_gen(109)
    q, k, v = make_qkv(g, 2, 30, 300, 2, 2, 32, torch.bfloat16)
    set_deterministic_mode(True, split_size=128)
    base = flash_attn_func(q, k, v, causal=True)
    with force_schedule(name):
        assert torch.equal(flash_attn_func(q, k, v, causal=True), base)


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


@pytest.mark.parametrize("bad", [0, 100, -128, 1.5, 127, 129, True, "512", None, 2**24 + 128,
                                 2**31 - 128])
def test_split_size_rejected(bad):
    set_deterministic_mode(True, split_size=256)
    with pytest.raises(ValueError, match="^split_size:"):
        set_deterministic_mode(True, split_size=bad)
    # a rejected call changes nothing
    assert get_split_size() == 256 and get_deterministic_mode() is True


def test_force_schedule_sets_and_restores():
    assert mode._state["schedule"] == _C.SCHEDULE_AUTO
    with force_schedule("one_cta"):
        assert mode._state["schedule"] == _C.SCHEDULE_ONE_CTA
        with force_schedule("cta_per_split"):
            assert mode._state["schedule"] == _C.SCHEDULE_CTA_PER_SPLIT
        assert mode._state["schedule"] == _C.SCHEDULE_ONE_CTA
    assert mode._state["schedule"] == _C.SCHEDULE_AUTO
    with pytest.raises(RuntimeError):
        with force_schedule("cta_per_split"):
            raise RuntimeError("boom")
    assert mode._state["schedule"] == _C.SCHEDULE_AUTO
    with pytest.raises(ValueError):
        with force_schedule("fastest"):
            pass
    assert mode._state["schedule"] == _C.SCHEDULE_AUTO


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


@pytest.mark.parametrize("D", [12, 4, 264, 512])
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


@pytest.mark.parametrize("p", [0.1, 1e-6, 1.0])
def test_dropout_not_implemented(p):
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="^dropout_p:"):
        flash_attn_func(q, k, v, dropout_p=p)


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
    out = torch.empty((B, Sq, H, D), dtype=dtype or q.dtype).fill_(7)
    lse = torch.empty((B, H, Sq), dtype=torch.float32).fill_(7)
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
def test_raw_fwd_writes_nothing_on_error(case, exc, match):
    g = make_gen(300)
    H, Hk, D = 4, 2, 32
    if case == "heads":
        H, Hk = 6, 4
    if case == "head_dim":
        D = 12
    q, k, v = make_qkv(g, 2, 9, 20, H, Hk, D, torch.bfloat16)
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
        kw["alibi"] = torch.full((H + 1,), 0.1)
    elif case == "alibi_dtype":
        kw["alibi"] = torch.full((H,), 0.1, dtype=torch.float64)
    elif case == "lse_shape":
        lse = torch.full((2, H, 10), 7.0)
    elif case == "lse_dtype":
        lse = torch.full((2, H, 9), 7.0, dtype=torch.float64)
    elif case == "lse_noncontig":
        lse = torch.full((2, 9, H), 7.0).transpose(1, 2)
    elif case == "out_shape":
        out = torch.full((2, 9, H, D + 8), 7.0, dtype=torch.bfloat16)
    elif case == "k_dtype":
        k = k.to(torch.float16)
    elif case == "q_dtype":
        q = q.float()
    elif case == "q_rank":
        q = q[0]
    elif case == "v_len":
        v = v[:, :19]
    out0, lse0 = out.clone(), lse.clone()
    with pytest.raises(exc, match=match):
        raw_fwd(q, k, v, out, lse, **kw)
    assert torch.equal(out, out0), "out was written by a call that failed"
    assert torch.equal(lse, lse0), "softmax_lse was written by a call that failed"


def test_raw_fwd_writes_everything_on_success():
    """Counterpart of the poisoning tests: a good call overwrites every element."""
    g = make_gen(301)
    q, k, v = make_qkv(g, 2, 12, 20, 4, 2, 32, torch.float16)
    out = torch.full(q.shape, float("nan"), dtype=q.dtype)
    lse = torch.full((2, 4, 12), float("nan"))
    raw_fwd(q, k, v, out, lse, causal=True, window=(-1, 0))
    assert not out.isnan().any() and not lse.isnan().any()
    want, want_lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


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
