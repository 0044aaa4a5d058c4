"""Shared fixtures and helpers for the flash_attn_det test suite."""
import pytest
import torch
from torch.utils.dlpack import to_dlpack

import flash_attn_det
from flash_attn_det import _C, mode

HAS_CUDA = torch.cuda.is_available() and flash_attn_det.has_cuda()

requires_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="needs a CUDA GPU and a flash_attn_det build with the CUDA path")

# The devices a feature's test runs on: the CPU path in CI, the kernels on a GPU machine.
DEVICES = ["cpu", pytest.param("cuda", marks=requires_cuda)]


def on_devices(cpu, cuda):
    """Parameters (device, case) for a test whose cases differ by device (the GPU ones are
    larger, or reach kernel variants the CPU path does not have): each CPU case on "cpu", each
    GPU case on "cuda" (skipped without a GPU)."""
    return ([pytest.param("cpu", c, id=f"cpu-{c}") for c in cpu] +
            [pytest.param("cuda", c, id=f"cuda-{c}", marks=requires_cuda) for c in cuda])

DTYPES = [torch.float16, torch.bfloat16]

LOG2E = 1.4426950408889634

# Unit roundoff of the output dtypes (round to nearest even).
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


@pytest.fixture(autouse=True)
def _restore_mode():
    """Every test starts from, and leaves behind, the default mode."""
    saved = mode.state()
    mode.restore((True, _C.DEFAULT_SPLIT_SIZE, _C.SCHEDULE_AUTO, False))
    yield
    mode.restore(saved)


def warm_up_for_capture(step, calls=2):
    """torch's rule before CUDA graph capture: run `step` a few times on a side stream, then
    make the current stream wait for it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(calls):
            step()
    torch.cuda.current_stream().wait_stream(side)


def make_gen(seed):
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def randn(gen, shape, dtype, device="cpu", scale=1.0):
    """Seeded standard-normal tensor (drawn on the CPU, so the bits do not depend on device)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float32) * scale
    return x.to(dtype).to(device)


def make_qkv(gen, B, Sq, Sk, H, Hk, D, dtype, device="cpu", q_scale=1.0):
    q = randn(gen, (B, Sq, H, D), dtype, device, q_scale)
    k = randn(gen, (B, Sk, Hk, D), dtype, device)
    v = randn(gen, (B, Sk, Hk, D), dtype, device)
    return q, k, v


def rising_scores(q, k, step_log2=7.5, tile=64, period=4):
    """q, k with every row's score max rising by about step_log2 (log2 units, at the default
    softmax scale) per tile of keys, for `period` tiles, then starting over (so the logits
    stay small enough for fp32 scores to be accurate): channel 0 carries q = 1, k = ramp(j).
    The online softmax keeps a stale max while a tile's max rises by at most 8
    (fad_rescale), so steps of 7.5 plus noise exercise both the stale max (exponents up to
    ~2^8) and the rescale; random data alone almost never moves a row's max by 8 after the
    row's first tile."""
    q, k = q.clone(), k.clone()
    D, Sk = q.shape[-1], k.shape[1]
    steps = torch.arange(Sk) // tile % period
    ramp = steps.to(torch.float32) * (step_log2 / (D ** -0.5 * LOG2E))
    q[..., 0] = 1.0
    k[..., 0] = ramp.to(k.dtype).to(k.device).view(1, Sk, 1)
    return q, k


def make_alibi(gen, shape, device="cpu"):
    """Positive fp32 slopes in [0.01, 0.5)."""
    return (torch.rand(shape, generator=gen, dtype=torch.float32) * 0.49 + 0.01).to(device)


def assert_close(out, ref, dtype, atol, rtol_ulps=2.0, what="out", allow_zero_ref=False):
    """|out - ref| <= atol + rtol * |ref| elementwise, rtol = rtol_ulps unit roundoffs.

    The output must be finite; the worst element is reported on failure. Unless
    allow_zero_ref, the reference must carry signal (so the check is never vacuous).
    Returns the max abs error.
    """
    assert out.shape == ref.shape, f"{what}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o = out.double()
    assert torch.isfinite(o).all(), f"{what}: non-finite values in the output"
    rtol = rtol_ulps * UNIT_ROUNDOFF[dtype]
    err = (o - ref).abs()
    bound = atol + rtol * ref.abs()
    bad = err > bound
    if bad.any():
        flat = int((err - bound).flatten().argmax())
        pos = list(torch.unravel_index(torch.tensor(flat), err.shape))
        pos = tuple(int(p) for p in pos)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {err.numel()} elements out of tolerance "
            f"(atol={atol:g}, rtol={rtol:g}); worst at {pos}: got {float(o[pos]):.6g}, "
            f"ref {float(ref[pos]):.6g}; max abs err {float(err.max()):.3g}")
    if not allow_zero_ref:
        assert ref.numel() and float(ref.abs().max()) > 1e-3, f"{what}: reference is ~zero"
    return float(err.max()) if err.numel() else 0.0


def assert_lse_close(lse, ref_lse, atol=1e-3):
    assert lse.dtype == torch.float32
    assert lse.shape == ref_lse.shape, f"lse: shape {tuple(lse.shape)} != {tuple(ref_lse.shape)}"
    l64 = lse.double()
    fin = torch.isfinite(ref_lse)
    # -inf exactly where the reference row sees no key, and nowhere else.
    assert torch.equal(torch.isneginf(l64), torch.isneginf(ref_lse)), "lse: -inf pattern differs"
    assert torch.isfinite(l64[fin]).all(), "lse: non-finite value on a row that sees keys"
    if fin.any():
        err = float((l64[fin] - ref_lse[fin]).abs().max())
        assert err < atol, f"lse: max abs err {err:.3g} >= {atol:g}"


# Tolerances against the float64 reference, by device (assert_close's atol and rtol in units of
# the output dtype's roundoff u).
# CPU: fp32 accumulation and one rounding to fp16/bf16 at the end: the output rounding (<= 1 u
# relative) plus a few fp32 ulps.
# GPU: the kernels round P to fp16/bf16 before the P.V tensor-core product (as flash_attn does),
# so besides the output rounding there is an error of about one unit roundoff of the output dtype
# times |v| (~1 here); measured on an H200: at most 0.84 u beyond 2 u * |ref|. Allowed:
# 2 u + 2 u * |ref|.
GPU_ATOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def tolerance(device, dtype):
    """(atol, rtol_ulps) of the device's path."""
    return (2e-5, 1.0) if torch.device(device).type == "cpu" else (GPU_ATOL[dtype], 2.0)


def both(q, k, v, **kw):
    """(out, lse) of flash_attn_func."""
    out, lse, _ = flash_attn_det.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    return out, lse


def run_and_check(q, k, v, **kw):
    """flash_attn_func against attention_ref (float64) on out and lse, at the tolerance of q's
    device; rows that see no key must be exactly 0. Returns (out, lse, ref_out, ref_lse)."""
    from flash_attn_det.testing import attention_ref
    out, lse, none = flash_attn_det.flash_attn_func(q, k, v, return_attn_probs=True, **kw)
    assert none is None
    assert out.shape == q.shape and out.dtype == q.dtype and out.device == q.device
    B, Sq, H, _ = q.shape
    assert lse.shape == (B, H, Sq) and lse.dtype == torch.float32
    ref_kw = {n: kw[n] for n in ("softmax_scale", "causal", "window_size", "softcap",
                                 "alibi_slopes") if n in kw}
    ref_out, ref_lse = attention_ref(q, k, v, **ref_kw)
    masked = torch.isneginf(ref_lse).transpose(1, 2)  # (B, Sq, H)
    atol, ulps = tolerance(q.device, q.dtype)
    assert_close(out, ref_out, q.dtype, atol, ulps, allow_zero_ref=bool(masked.all()))
    assert_lse_close(lse, ref_lse)
    if masked.any():
        assert (out[masked] == 0).all()
    return out, lse, ref_out, ref_lse


def raw_fwd(q, k, v, out, lse, alibi=None, softmax_scale=None, softcap=0.0, window=(-1, -1),
            causal=False, deterministic=True, split_size=512, schedule=_C.SCHEDULE_AUTO,
            workspace="auto"):
    """Calls _C.fwd directly on caller-owned out/lse (no Python-side checks or copies).

    workspace="auto" asks fwd_workspace_size on CUDA; None passes no workspace.
    Returns what _C.fwd returns: None, or the workspace bytes it needs (nothing written).
    """
    D = q.shape[-1]
    scale = D ** -0.5 if softmax_scale is None else softmax_scale
    ws, stream = None, 0
    if q.is_cuda:
        if isinstance(workspace, str):
            B, Sq, H, _ = q.shape
            nbytes = _C.fwd_workspace_size(B, Sq, k.shape[1], H, k.shape[2], D, int(deterministic),
                                           split_size, schedule, q.device.index or 0)
            workspace = torch.empty(nbytes, dtype=torch.uint8, device=q.device) if nbytes else None
        if workspace is not None:
            ws = to_dlpack(workspace)
        stream = torch.cuda.current_stream(q.device).cuda_stream
    elif isinstance(workspace, str):
        workspace = None
    return _C.fwd(to_dlpack(q), to_dlpack(k), to_dlpack(v), to_dlpack(out),
           None if lse is None else to_dlpack(lse),
           None if alibi is None else to_dlpack(alibi), ws, float(scale), float(softcap),
           int(window[0]), int(window[1]), int(causal), int(deterministic), split_size,
           schedule, stream)


def workspace_bytes(q, k):
    """Bytes of workspace the CUDA forward asks for q, k under the current mode."""
    B, Sq, H, D = q.shape
    det, split_size, schedule = mode.current()
    return _C.fwd_workspace_size(B, Sq, k.shape[1], H, k.shape[2], D, int(det), split_size,
                                 schedule, q.device.index or 0)


def row_mask_count(Sq, Sk, window, causal):
    """Number of query rows that see no key (mirrors the documented mask)."""
    left, right = window
    if causal:
        right = 0
    n = 0
    for i in range(Sq):
        pos = i + Sk - Sq
        lo = 0 if left < 0 else max(0, pos - left)
        hi = Sk - 1 if right < 0 else min(Sk - 1, pos + right)
        n += lo > hi
    return n

