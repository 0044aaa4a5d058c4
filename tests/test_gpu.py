"""CUDA tests: correctness of the tensor-core kernels against the float64
reference, every clause of the invariance contract bit for bit, schedules,
streams, graph capture and the raw entry's checks. Skipped without a GPU."""
import pytest
import torch

from flash_attn_det import _C, flash_attn_func, set_deterministic_mode
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import (DTYPES, HAS_CUDA, assert_close, assert_lse_close, make_alibi, make_gen,
                      make_qkv, randn, raw_fwd, rising_scores, row_mask_count)

pytestmark = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA GPU and a flash_attn_det build with the CUDA path")

DEV = "cuda"

# The kernels round P to fp16/bf16 before the P.V tensor-core product (as
# flash_attn does), so besides the output rounding there is an error of about
# one unit roundoff of the output dtype times |v| (~1 here); measured on an
# H200: at most 0.84 u beyond 2 u * |ref|. Allowed: 2 u + 2 u * |ref|.
ATOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}
ULPS = 2.0


def run_and_check(q, k, v, **kw):
    out, lse, none = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert none is None and out.shape == q.shape and out.dtype == q.dtype and out.is_cuda
    ref_kw = {n: kw[n] for n in ("softmax_scale", "causal", "window_size", "softcap",
                                 "alibi_slopes") if n in kw}
    ref, ref_lse = attention_ref(q, k, v, **ref_kw)
    masked = torch.isneginf(ref_lse).transpose(1, 2)
    assert_close(out, ref, q.dtype, ATOL[q.dtype], ULPS, allow_zero_ref=bool(masked.all()))
    assert_lse_close(lse, ref_lse)
    if masked.any():
        assert (out[masked] == 0).all()
    return out, lse


def both(q, k, v, **kw):
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    return out, lse


def workspace_bytes(q, k):
    from flash_attn_det import mode
    B, Sq, H, D = q.shape
    return _C.fwd_workspace_size(B, Sq, k.shape[1], H, k.shape[2], D, int(mode._state["enabled"]),
                                 mode._state["split_size"], mode._state["schedule"],
                                 q.device.index or 0)


HEAD_DIMS = [8, 40, 64, 72, 128, 136, 192, 200, 256]


# --------------------------------------------------------------------------
# correctness
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", HEAD_DIMS)
@pytest.mark.parametrize("causal", [False, True])
def test_head_dims(dtype, D, causal):
    g = make_gen(D)
    q, k, v = make_qkv(g, 2, 100, 300, 4, 2, D, dtype, DEV)
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (1, 1000), (1, 3000), (63, 65), (65, 63), (1000, 1000),
                                   (3000, 3000), (1000, 3000), (3000, 1000), (129, 5)])
@pytest.mark.parametrize("causal", [False, True])
def test_seqlens(dtype, D, Sq, Sk, causal):
    g = make_gen(Sq + 7 * Sk)
    q, k, v = make_qkv(g, 2, Sq, Sk, 4, 2, D, dtype, DEV)
    _, lse = run_and_check(q, k, v, causal=causal)
    assert int(torch.isneginf(lse[0, 0]).sum()) == row_mask_count(Sq, Sk, (-1, -1), causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("window", [(-1, 0), (5, -1), (3, 3), (0, 0), (100, 0), (256, 64),
                                    (-1, 200), (1000, -1)])
@pytest.mark.parametrize("Sq,Sk", [(500, 1100), (1100, 500)])
def test_sliding_window(dtype, window, Sq, Sk):
    g = make_gen(Sq)
    q, k, v = make_qkv(g, 2, Sq, Sk, 4, 2, 128, dtype, DEV)
    _, lse = run_and_check(q, k, v, window_size=window)
    assert int(torch.isneginf(lse[1, 3]).sum()) == row_mask_count(Sq, Sk, window, False)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("H,Hk", [(8, 2), (4, 1), (32, 8), (6, 6)])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_mqa(dtype, H, Hk, causal):
    g = make_gen(H + Hk)
    q, k, v = make_qkv(g, 2, 200, 700, H, Hk, 128, dtype, DEV)
    out, lse = run_and_check(q, k, v, causal=causal)
    ke, ve = k.repeat_interleave(H // Hk, dim=2), v.repeat_interleave(H // Hk, dim=2)
    oe, le = both(q, ke, ve, causal=causal)
    assert torch.equal(out, oe) and torch.equal(lse, le)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("softcap", [1.5, 30.0])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap(dtype, softcap, D, causal):
    g = make_gen(D)
    q, k, v = make_qkv(g, 2, 300, 900, 4, 4, D, dtype, DEV, q_scale=3.0)
    run_and_check(q, k, v, causal=causal, softcap=softcap)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("slope_shape", ["H", "BH"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 200])
def test_alibi(dtype, slope_shape, causal, D):
    g = make_gen(3)
    B, H = 3, 8
    q, k, v = make_qkv(g, B, 257, 1000, H, 2, D, dtype, DEV)
    slopes = make_alibi(g, (H,) if slope_shape == "H" else (B, H), DEV)
    run_and_check(q, k, v, causal=causal, alibi_slopes=slopes)


@pytest.mark.parametrize("dtype", DTYPES)
def test_everything_at_once(dtype):
    g = make_gen(4)
    B, H = 2, 8
    q, k, v = make_qkv(g, B, 700, 1500, H, 2, 136, dtype, DEV, q_scale=2.0)
    slopes = make_alibi(g, (B, H), DEV)
    run_and_check(q, k, v, causal=True, window_size=(600, 0), softcap=12.0, alibi_slopes=slopes,
                  softmax_scale=0.11)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fully_masked_rows(dtype):
    g = make_gen(5)
    Sq, Sk = 300, 100
    q, k, v = make_qkv(g, 2, Sq, Sk, 4, 2, 64, dtype, DEV)
    out, lse = run_and_check(q, k, v, causal=True)
    assert (out[:, :Sq - Sk] == 0).all() and torch.isneginf(lse[:, :, :Sq - Sk]).all()
    assert torch.isfinite(lse[:, :, Sq - Sk:]).all()


def test_no_keys_and_empty():
    g = make_gen(6)
    q = randn(g, (2, 70, 4, 64), torch.bfloat16, DEV)
    kv = torch.empty((2, 0, 4, 64), dtype=torch.bfloat16, device=DEV)
    out, lse = both(q, kv, kv)
    assert (out == 0).all() and torch.isneginf(lse).all()
    q0 = randn(g, (0, 70, 4, 64), torch.bfloat16, DEV)
    k0 = randn(g, (0, 30, 4, 64), torch.bfloat16, DEV)
    assert flash_attn_func(q0, k0, k0).shape == q0.shape


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("det", [True, False])
def test_rising_running_max(dtype, D, causal, det):
    """Scores whose max rises ~7.5 log2 units per tile: the stale-max and the rescale
    branches of the online softmax both run on every kernel, and match float64."""
    set_deterministic_mode(det)
    g = make_gen(D + causal)
    q, k, v = make_qkv(g, 2, 700, 2100, 4, 2, D, dtype, DEV)
    q, k = rising_scores(q, k)
    run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_fast_mode_correct(dtype, causal):
    set_deterministic_mode(False)
    g = make_gen(7)
    for B, Sq, Sk in [(1, 1, 5000), (1, 128, 4000), (16, 500, 500)]:
        q, k, v = make_qkv(g, B, Sq, Sk, 8, 2, 128, dtype, DEV)
        run_and_check(q, k, v, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
def test_large_causal(causal):
    """B=2, L=4096, H=8, D=128 against the float64 reference (computed in row chunks)."""
    g = make_gen(8)
    q, k, v = make_qkv(g, 2, 4096, 4096, 8, 8, 128, torch.bfloat16, DEV)
    run_and_check(q, k, v, causal=causal)


# --------------------------------------------------------------------------
# layouts
# --------------------------------------------------------------------------

def test_transposed_and_packed_views():
    g = make_gen(9)
    B, H, L, D = 2, 8, 333, 128
    xq, xk, xv = (randn(g, (B, H, L, D), torch.float16, DEV) for _ in range(3))
    q, k, v = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
    out, lse = run_and_check(q, k, v, causal=True)
    oc, lc = both(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert torch.equal(out, oc) and torch.equal(lse, lc)
    qkv = randn(g, (B, L, 3, H, D), torch.float16, DEV)
    q, k, v = qkv.unbind(2)
    out, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous()))


def test_misaligned_data_pointer_is_handled():
    """A contiguous view whose data pointer breaks the 16-byte rule is copied by the wrapper."""
    g = make_gen(10)
    B, L, H, D = 2, 100, 4, 64
    n = B * L * H * D
    flat = randn(g, (n + 8,), torch.bfloat16, DEV)
    q = flat[1:n + 1].view(B, L, H, D)  # data pointer 2 bytes off, otherwise contiguous
    assert q.data_ptr() % 16 and q.is_contiguous()
    k = randn(g, (B, L, H, D), torch.bfloat16, DEV)
    v = randn(g, (B, L, H, D), torch.bfloat16, DEV)
    out, _ = run_and_check(q, k, v)
    assert torch.equal(out, flash_attn_func(q.clone(), k, v))


def test_size1_dim_with_odd_stride_is_handled():
    """Decode-shaped q (seqlen 1) whose size-1 dim carries a stride that is not a multiple
    of 8: torch calls it contiguous, the kernels' stride rule does not."""
    g = make_gen(10)
    B, L, H, D = 2, 100, 4, 64
    k = randn(g, (B, L, H, D), torch.bfloat16, DEV)
    v = randn(g, (B, L, H, D), torch.bfloat16, DEV)
    q = randn(g, (B, 1, H, D), torch.bfloat16, DEV)
    q1 = q.as_strided((B, 1, H, D), (H * D, 3, D, 1))
    assert q1.is_contiguous() and q1.stride(1) == 3
    out1, _ = run_and_check(q1, k, v)
    assert torch.equal(out1, flash_attn_func(q, k, v))


def test_non_default_stream():
    g = make_gen(11)
    q, k, v = make_qkv(g, 2, 500, 2000, 8, 2, 128, torch.bfloat16, DEV)
    base = flash_attn_func(q, k, v, causal=True)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out = flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert torch.equal(out, base)


def test_cuda_graph_capture():
    g = make_gen(12)
    q, k, v = make_qkv(g, 1, 64, 3000, 8, 2, 128, torch.bfloat16, DEV)  # auto -> split CTAs
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
            q2, k2, v2 = make_qkv(g, 1, 64, 3000, 8, 2, 128, torch.bfloat16, DEV)
            sq.copy_(q2), sk.copy_(k2), sv.copy_(v2)
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(static_out, flash_attn_func(q2, k2, v2, causal=True)), name


# --------------------------------------------------------------------------
# raw entry: outputs fully written on success, untouched on failure
# --------------------------------------------------------------------------

@pytest.mark.parametrize("schedule", [_C.SCHEDULE_AUTO, _C.SCHEDULE_ONE_CTA,
                                      _C.SCHEDULE_CTA_PER_SPLIT])
@pytest.mark.parametrize("D", [40, 64, 128, 200, 256])
def test_raw_poisoned_outputs_are_fully_written(schedule, D):
    g = make_gen(13)
    B, Sq, Sk, H, Hk = 2, 300, 170, 4, 2  # causal with Sq > Sk: 130 fully masked rows
    q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, D, torch.bfloat16, DEV)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, Sq), float("nan"), device=DEV)
    raw_fwd(q, k, v, out, lse, causal=True, window=(-1, 0), split_size=128, schedule=schedule)
    torch.cuda.synchronize()
    ref, ref_lse = attention_ref(q, k, v, causal=True)
    assert not out.isnan().any(), f"{int(out.isnan().sum())} output elements never written"
    assert not lse.isnan().any(), f"{int(lse.isnan().sum())} lse elements never written"
    assert (out[:, :Sq - Sk] == 0).all()
    assert_close(out, ref, torch.bfloat16, ATOL[torch.bfloat16], ULPS)
    assert_lse_close(lse, ref_lse)


@pytest.mark.parametrize("case,exc,match", [
    ("misaligned_q", ValueError, "^q: data pointer must be 16-byte aligned"),
    ("odd_stride_k", ValueError, "^k: strides must be multiples of 8"),
    ("heads", ValueError, "^num_heads_k:"),
    ("split_size", ValueError, "^split_size:"),
    ("schedule", ValueError, "^schedule:"),
    ("lse_on_cpu", ValueError, "^softmax_lse: must be on the same device"),
])
def test_raw_refused_call_writes_nothing(case, exc, match):
    g = make_gen(14)
    B, Sq, Sk, H, Hk, D = 1, 64, 3000, 4, 2, 64
    if case == "heads":
        H, Hk = 6, 4
    q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, D, torch.float16, DEV)
    out = torch.full_like(q, 7.0)
    lse = torch.full((B, H, Sq), 7.0, device=DEV)
    kw = {}
    if case == "misaligned_q":
        flat = randn(g, (q.numel() + 8,), torch.float16, DEV)
        q = flat[4:4 + q.numel()].view(q.shape)
    elif case == "odd_stride_k":
        wide = randn(g, (B, Sk, Hk, D + 4), torch.float16, DEV)
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


@pytest.mark.parametrize("workspace", ["small", "missing"])
def test_raw_short_workspace_answers_its_size_and_writes_nothing(workspace):
    """A call whose workspace is short does not run: it returns the bytes it needs."""
    g = make_gen(15)
    q, k, v = make_qkv(g, 1, 64, 3000, 4, 2, 64, torch.float16, DEV)
    out, lse = torch.full_like(q, 7.0), torch.full((1, 4, 64), 7.0, device=DEV)
    with force_schedule("cta_per_split"):
        need = workspace_bytes(q, k)
    ws = torch.empty(16, dtype=torch.uint8, device=DEV) if workspace == "small" else None
    got = raw_fwd(q, k, v, out, lse, schedule=_C.SCHEDULE_CTA_PER_SPLIT, workspace=ws)
    torch.cuda.synchronize()
    assert need > 16 and got == need
    assert (out == 7.0).all() and (lse == 7.0).all()
    assert raw_fwd(q, k, v, out, lse, schedule=_C.SCHEDULE_CTA_PER_SPLIT,
                   workspace=torch.empty(need, dtype=torch.uint8, device=DEV)) is None


def test_workspace_size_is_zero_for_one_cta_and_positive_for_split():
    g = make_gen(15)
    q, k, _ = make_qkv(g, 1, 64, 5000, 4, 4, 64, torch.bfloat16, DEV)
    with force_schedule("one_cta"):
        assert workspace_bytes(q, k) == 0
    with force_schedule("cta_per_split"):
        assert workspace_bytes(q, k) > 0
    with force_schedule("auto"):
        assert workspace_bytes(q, k) > 0  # tiny grid: auto spreads splits over CTAs


# --------------------------------------------------------------------------
# the invariance contract, bit for bit
# --------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal", [False, True])
def test_seed_batch8_vs_two_batches_of_4(dtype, causal):
    g = make_gen(100)
    q, k, v = make_qkv(g, 8, 2048, 2048, 32, 32, 64, dtype, DEV)
    out, lse = both(q, k, v, causal=causal)
    oa, la = both(q[:4], k[:4], v[:4], causal=causal)
    ob, lb = both(q[4:], k[4:], v[4:], causal=causal)
    assert torch.equal(out, torch.cat([oa, ob])) and torch.equal(lse, torch.cat([la, lb]))
    assert_close(out[:1], attention_ref(q[:1], k[:1], v[:1], causal=causal)[0], dtype,
                 ATOL[dtype], ULPS)


@pytest.mark.parametrize("split_size", [128, 512, 1024])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_batch_composition(split_size, D):
    """One sequence alone and inside batches of 3 and 17 with different neighbours."""
    set_deterministic_mode(True, split_size=split_size)
    g = make_gen(101)
    Sq, Sk, H, Hk = 1000, 1500, 8, 2
    q1, k1, v1 = make_qkv(g, 1, Sq, Sk, H, Hk, D, torch.bfloat16, DEV)
    slopes = make_alibi(g, (H,), DEV)
    kw = dict(causal=True, softcap=20.0, alibi_slopes=slopes)
    alone, lse_alone = both(q1, k1, v1, **kw)
    for B, pos in [(3, 1), (17, 16), (17, 0)]:
        q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, D, torch.bfloat16, DEV)
        q[pos], k[pos], v[pos] = q1[0], k1[0], v1[0]
        out, lse = both(q, k, v, **kw)
        assert torch.equal(out[pos], alone[0]), f"B={B} pos={pos}"
        assert torch.equal(lse[pos], lse_alone[0]), f"B={B} pos={pos}"


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (700, 30)},
                                {"softcap": 10.0}, {"alibi": True}])
def test_schedules_bit_equal(D, kw):
    kw = dict(kw)
    g = make_gen(102)
    q, k, v = make_qkv(g, 1, 200, 5000, 4, 2, D, torch.bfloat16, DEV)
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = make_alibi(g, (4,), DEV)
    results = {}
    for name in ("one_cta", "cta_per_split", "auto"):
        with force_schedule(name):
            results[name] = both(q, k, v, **kw)
            if name == "auto":
                assert workspace_bytes(q, k) > 0, "auto did not pick the split schedule"
    for name in ("cta_per_split", "auto"):
        assert torch.equal(results[name][0], results["one_cta"][0]), name
        assert torch.equal(results[name][1], results["one_cta"][1]), name


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("window", [(-1, 0), (1000, 0)])
@pytest.mark.parametrize("rising", [False, True])
def test_prefill_decode_chunked(dtype, D, window, rising):
    """Causal: row t of the full prefill == decode of row t alone over keys [0, t]
    == the same row in any chunk [a, b) run over keys [0, b). rising: scores whose max
    moves by more than the rescale slack from tile to tile (conftest.rising_scores)."""
    g = make_gen(103)
    N = 3000
    q, k, v = make_qkv(g, 2, N, N, 8, 2, D, dtype, DEV)
    if rising:
        q, k = rising_scores(q, k)
    full, full_lse = both(q, k, v, causal=True, window_size=window)
    for t in [0, 1, 63, 64, 127, 128, 511, 512, 513, 1000, 2047, 2999]:
        for sched in ("auto", "one_cta", "cta_per_split"):
            with force_schedule(sched):
                o, l = both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True,
                            window_size=window)
            assert torch.equal(o[:, 0], full[:, t]), f"decode row {t} ({sched})"
            assert torch.equal(l[:, :, 0], full_lse[:, :, t]), f"decode row {t} ({sched})"
    bounds = [0, 1, 100, 640, 641, 2000, 2999, 3000]
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, l = both(q[:, a:b], k[:, :b], v[:, :b], causal=True, window_size=window)
        assert torch.equal(o, full[:, a:b]), f"chunk [{a}, {b})"
        outs.append(o), lses.append(l)
    assert torch.equal(torch.cat(outs, 1), full) and torch.equal(torch.cat(lses, 2), full_lse)


def test_decode_batch_of_different_positions():
    """Decode rows of several sequences in one call equal each one decoded alone."""
    g = make_gen(104)
    N, H, D = 2000, 8, 128
    q, k, v = make_qkv(g, 4, N, N, H, 2, D, torch.float16, DEV)
    full, _ = both(q, k, v, causal=True)
    t = 1777
    o, _ = both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True)
    for b in range(4):
        ob, _ = both(q[b:b + 1, t:t + 1], k[b:b + 1, :t + 1], v[b:b + 1, :t + 1], causal=True)
        assert torch.equal(ob[0], o[b]) and torch.equal(o[b, 0], full[b, t])


def test_run_to_run():
    g = make_gen(105)
    q, k, v = make_qkv(g, 3, 1000, 3000, 16, 4, 128, torch.bfloat16, DEV)
    first = both(q, k, v, causal=True)
    for _ in range(10):
        out, lse = both(q, k, v, causal=True)
        assert torch.equal(out, first[0]) and torch.equal(lse, first[1])


def test_occupancy_does_not_matter():
    """Bits do not change when another stream keeps the GPU busy."""
    g = make_gen(106)
    q, k, v = make_qkv(g, 1, 256, 5000, 8, 8, 128, torch.bfloat16, DEV)
    base = both(q, k, v, causal=True)
    a = torch.randn(4096, 4096, device=DEV, dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(20):
            a = a @ a / 64
    out = both(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])


def test_split_size_each_correct():
    g = make_gen(107)
    q, k, v = make_qkv(g, 1, 300, 4000, 4, 4, 128, torch.bfloat16, DEV)
    for s in (128, 256, 512, 2048, 4096):
        set_deterministic_mode(True, split_size=s)
        run_and_check(q, k, v, causal=True)


# The prefill kernel has a Hopper variant (wgmma, sm_90a build on an sm_90
# GPU) beside the mma.sync one; FLASH_ATTN_DET_WGMMA=0 turns it off for the
# process. Same tile walk, same fragments, and a wgmma chain rounds as the
# mma.sync chain it replaces, so both must give the same bits. On other GPUs
# (and with softcap, ALiBi or pages, which stay on mma.sync) both processes
# run the same kernel and the case holds trivially.
_VARIANT_CASES = [
    dict(D=64, Sq=700, Sk=3000, causal=False, dtype="bfloat16"),
    dict(D=128, Sq=700, Sk=3000, causal=True, dtype="bfloat16"),
    dict(D=128, Sq=513, Sk=2100, causal=False, dtype="float16"),
    dict(D=40, Sq=300, Sk=1500, causal=True, dtype="float16", window_size=(200, 5)),
    dict(D=72, Sq=400, Sk=1200, causal=False, dtype="bfloat16", window_size=(-1, 100)),
    dict(D=128, Sq=333, Sk=4000, causal=True, dtype="bfloat16", softcap=15.0),  # both mma.sync
    # the warp-specialized kernel's own walks: an odd count of 64-row blocks, a window that makes
    # its two consumers start and end on different tiles, D < 128, query rows with no key
    dict(D=128, Sq=900, Sk=2500, causal=False, dtype="bfloat16", window_size=(300, 40)),
    dict(D=96, Sq=200, Sk=1000, causal=True, dtype="float16"),
    dict(D=128, Sq=600, Sk=200, causal=True, dtype="bfloat16"),
]


def _variant_outputs():
    outs = []
    for i, case in enumerate(_VARIANT_CASES):
        case = dict(case)
        g = make_gen(300 + i)
        dtype = getattr(torch, case.pop("dtype"))
        D, Sq, Sk = case.pop("D"), case.pop("Sq"), case.pop("Sk")
        q, k, v = make_qkv(g, 2, Sq, Sk, 8, 2, D, dtype, DEV)
        if case.pop("alibi", False):
            case["alibi_slopes"] = make_alibi(g, (8,), DEV)
        for sched in ("one_cta", "cta_per_split"):
            with force_schedule(sched):
                out, lse = both(q, k, v, **case)
            outs.append((out.cpu(), lse.cpu()))
    return outs


def test_wgmma_and_mma_sync_variants_bit_equal(tmp_path):
    import os
    import subprocess
    import sys
    path = tmp_path / "mma_sync.pt"
    code = ("import sys, torch; sys.path.insert(0, %r); import test_gpu; "
            "torch.save(test_gpu._variant_outputs(), %r)" % (os.path.dirname(__file__), str(path)))
    env = dict(os.environ, FLASH_ATTN_DET_WGMMA="0")
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    theirs = torch.load(path)
    mine = _variant_outputs()
    assert len(mine) == len(theirs) == 2 * len(_VARIANT_CASES)
    for i, ((o, l), (o2, l2)) in enumerate(zip(mine, theirs)):
        assert torch.equal(o, o2) and torch.equal(l, l2), f"case {i // 2} {('one_cta', 'cta_per_split')[i % 2]}"
