"""A fuzzer of the public entry points, with hypothesis: generated calls of
flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache and set_deterministic_mode,
valid and not (dtypes, ranks, head dims, views with odd strides, expand()ed caches, NaN/Inf,
scales, windows, softcaps, ALiBi shapes, index tensors, lengths, modes). For every case:
- it returns, or raises one of the documented types (ValueError, TypeError,
  NotImplementedError) whose message starts with the argument's name ("name:");
- when it raises, no byte of any tensor argument changed and the mode is what it was;
- when it returns, the output has q's shape and dtype, and with finite inputs it matches the
  float64 reference at the path's tolerance (flash_attn_func), or the appended cache rows are the
  new k/v (flash_attn_with_kvcache).
A crash or a hang fails the run. CI runs a fixed, bounded set of cases on the CPU path
(derandomized); FAD_FUZZ_EXAMPLES sets the count, FAD_FUZZ_DEVICE=cuda fuzzes CUDA tensors."""
import collections
import math
import os
import re

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import flash_attn_det as fad  # noqa: E402
from flash_attn_det import mode  # noqa: E402
from flash_attn_det.testing import attention_ref  # noqa: E402

from conftest import HAS_CUDA, tolerance  # noqa: E402

DEVICE = os.environ.get("FAD_FUZZ_DEVICE", "cpu")
if DEVICE == "cuda" and not HAS_CUDA:
    pytest.skip("FAD_FUZZ_DEVICE=cuda needs a GPU", allow_module_level=True)
EXAMPLES = int(os.environ.get("FAD_FUZZ_EXAMPLES", "1000"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=list(HealthCheck))
DOCUMENTED = (ValueError, TypeError, NotImplementedError)
NAMED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(, [A-Za-z_][A-Za-z0-9_]*)*:")


def _tensor(draw, shape, dtype, finite=True):
    """A seeded random tensor of `shape`, maybe a non-contiguous view of a larger one."""
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    t = torch.randn(shape, generator=g)
    if not finite and t.numel():
        t.view(-1)[0] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    t = t.to(dtype).to(DEVICE)
    view = draw(st.sampled_from(["plain", "transposed", "sliced"]))
    if view == "transposed" and t.dim() >= 2:  # the same values, last dim not contiguous
        t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    elif view == "sliced" and t.dim() >= 1:  # rows that do not start 16-byte aligned
        t = torch.cat([t, t[..., :3]], -1)[..., :shape[-1]]
    return t


def _snapshot(args):
    return {k: v.clone() for k, v in args.items() if isinstance(v, torch.Tensor)}


def _bits(t):
    """t's bytes as integers (so that NaN compares equal to itself)."""
    t = t.detach().cpu().contiguous()
    return t.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]) \
        if t.is_floating_point() else t


def _unchanged(before, args):
    for k, v in before.items():
        assert torch.equal(_bits(args[k]), _bits(v)), f"{k} changed by a call that raised"


OUTCOMES = collections.Counter()  # (entry, "ok" or the exception type) -> cases


def _call(fn, args):
    """fn(**args): ('ok', result) or ('raised', exception), checking what a raise must keep."""
    before, mode_before = _snapshot(args), mode.state()
    try:
        res = fn(**args)
    except DOCUMENTED as exc:
        assert NAMED.match(str(exc)), f"{type(exc).__name__} not naming its argument: {exc}"
        _unchanged(before, args)
        assert mode.state() == mode_before, "the mode changed under a call that raised"
        OUTCOMES[(fn.__name__, type(exc).__name__)] += 1
        return "raised", exc
    OUTCOMES[(fn.__name__, "ok")] += 1
    return "ok", res


# Each option: its valid values, then bad ones. Half the cases draw only valid values (so that
# calls return and their results are checked), half draw from all of them.
SCALES = ([None, 0.125, 0.3], [0.0, -1.0, 1e-50, math.nan, math.inf, "x", [1.0]])
SOFTCAPS = ([0.0, 5.0], [-1.0, math.nan, "x"])
WINDOWS = ([(-1, -1), (3, 0), (0, 5), (7, 2)], [(-2, 0), (math.inf, 0), "x", (1, 2, 3)])
FLOATS = [torch.float16, torch.bfloat16]


def _opt(draw, choices, valid):
    good, bad = choices
    return draw(st.sampled_from(good if valid else good + bad))


@st.composite
def attn_call(draw):
    valid = draw(st.booleans())
    B, Sq, Sk = draw(st.integers(0, 3)), draw(st.integers(0, 33)), draw(st.integers(0, 33))
    H, Hk = draw(st.sampled_from([(1, 1), (4, 2), (4, 4), (6, 3)] + ([] if valid else [(3, 2), (2, 4)])))
    D = draw(st.sampled_from([8, 16, 24, 40, 59, 64] + ([] if valid else [0, 264])))
    dtype = draw(st.sampled_from(FLOATS + ([] if valid else [torch.float32])))
    kdtype = dtype if valid or draw(st.booleans()) else draw(st.sampled_from(FLOATS))
    finite = valid or draw(st.booleans())
    q = _tensor(draw, (B, Sq, H, D), dtype, finite)
    k = _tensor(draw, (B, Sk, Hk, D), kdtype)
    v = _tensor(draw, (B, Sk, Hk, D if valid else draw(st.sampled_from([D, max(D - 8, 0)]))),
                kdtype)
    if not valid and draw(st.integers(0, 4)) == 0:  # a wrong rank
        q = q.flatten(0, 1)
    args = dict(q=q, k=k, v=v, softmax_scale=_opt(draw, SCALES, valid),
                causal=draw(st.booleans()), window_size=_opt(draw, WINDOWS, valid),
                softcap=_opt(draw, SOFTCAPS, valid), return_attn_probs=draw(st.booleans()),
                dropout_p=0.0 if valid else draw(st.sampled_from([0.0, 1.0, -0.5, float("nan")])))
    alibi = draw(st.sampled_from([None, None, "H", "BH"] + ([] if valid else ["bad_shape", "bad_dtype"])))
    if alibi == "H":
        args["alibi_slopes"] = torch.rand(H).to(DEVICE)
    elif alibi == "BH":
        args["alibi_slopes"] = torch.rand(B, H).to(DEVICE)
    elif alibi == "bad_shape":
        args["alibi_slopes"] = torch.rand(H + 1).to(DEVICE)
    elif alibi == "bad_dtype":
        args["alibi_slopes"] = torch.rand(H).half().to(DEVICE)
    return args


@FUZZ
@given(attn_call())
def test_flash_attn_func(args):
    outcome, res = _call(fad.flash_attn_func, args)
    if outcome == "raised":
        return
    out = res[0] if args["return_attn_probs"] else res
    q = args["q"]
    assert out.shape == q.shape and out.dtype == q.dtype
    ins = [args[n] for n in ("q", "k", "v")]
    if not all(torch.isfinite(t.float()).all() for t in ins) or not q.numel():
        return
    kw = {n: args[n] for n in ("softmax_scale", "causal", "window_size", "softcap",
                               "alibi_slopes") if args.get(n) is not None}
    ref, _ = attention_ref(*[t.cpu() for t in ins],
                           **{n: (x.cpu() if isinstance(x, torch.Tensor) else x)
                              for n, x in kw.items()})
    atol, _ = tolerance(q.device, q.dtype)
    err = (out.cpu().double() - ref).abs().max().item() if out.numel() else 0.0
    assert err <= max(atol, 0.02) * max(1.0, ref.abs().max().item()), err


@st.composite
def varlen_call(draw):
    lens_q = draw(st.lists(st.integers(0, 20), min_size=0, max_size=3))
    lens_k = [draw(st.integers(0, 20)) for _ in lens_q]
    H, Hk = draw(st.sampled_from([(2, 1), (4, 2), (3, 3)]))
    D = draw(st.sampled_from([16, 32, 59]))
    dtype = draw(st.sampled_from(FLOATS))
    cu = lambda ls: torch.tensor([0] + list(torch.tensor(ls, dtype=torch.int64).cumsum(0).tolist()  # noqa: E731
                                            if ls else [0]), dtype=torch.int32)
    cu_q, cu_k = cu(lens_q), cu(lens_k)
    tq, tk = int(cu_q[-1]), int(cu_k[-1])
    bad = draw(st.sampled_from(["none"] * 6 + ["decreasing", "int64", "too_long", "short_max",
                                               "float_max", "shape"]))
    if bad == "decreasing" and len(cu_q) > 2:
        cu_q[1] = cu_q[2] + 1
    elif bad == "int64":
        cu_k = cu_k.long()
    elif bad == "too_long":
        cu_k[-1] = tk + 5
    elif bad == "shape":
        cu_q = cu_q[None]
    max_q = max(lens_q, default=0) - (1 if bad == "short_max" and lens_q else 0)
    max_k = float("nan") if bad == "float_max" else max(lens_k, default=0)
    return dict(q=_tensor(draw, (tq, H, D), dtype), k=_tensor(draw, (tk, Hk, D), dtype),
                v=_tensor(draw, (tk, Hk, D), dtype), cu_seqlens_q=cu_q.to(DEVICE),
                cu_seqlens_k=cu_k.to(DEVICE), max_seqlen_q=max_q, max_seqlen_k=max_k,
                causal=draw(st.booleans()), softmax_scale=_opt(draw, SCALES, bad == "none"))


@FUZZ
@given(varlen_call())
def test_flash_attn_varlen_func(args):
    outcome, out = _call(fad.flash_attn_varlen_func, args)
    if outcome == "ok":
        assert out.shape == args["q"].shape and out.dtype == args["q"].dtype


@st.composite
def kvcache_call(draw):
    valid = draw(st.booleans())
    B, (H, Hk) = draw(st.integers(1, 3)), draw(st.sampled_from([(2, 1), (4, 2), (2, 2)]))
    D, cap = draw(st.sampled_from([16, 32, 59])), draw(st.integers(4, 24))
    dtype = draw(st.sampled_from(FLOATS))
    n_new, Sq = draw(st.integers(0, 4)), draw(st.integers(1, 3))
    entries = B + draw(st.integers(0, 2))
    kc = _tensor(draw, (entries, cap, Hk, D), dtype)
    if not valid and draw(st.integers(0, 4)) == 0:  # an expand()ed cache: rows share memory
        kc = kc[:1].expand(entries, cap, Hk, D)
    qdtype = dtype if valid else draw(st.sampled_from(FLOATS + [torch.float32]))
    args = dict(q=_tensor(draw, (B, Sq, H, D), qdtype), k_cache=kc,
                v_cache=_tensor(draw, (entries, cap, Hk, D), dtype), causal=draw(st.booleans()),
                softcap=_opt(draw, SOFTCAPS, valid))
    if n_new:
        args["k"] = _tensor(draw, (B, n_new, Hk, D), dtype)
        args["v"] = _tensor(draw, (B, n_new, Hk, D), dtype)
    lo, hi = (0, cap - n_new) if valid else (-2, cap + 2)
    lens = [draw(st.integers(lo, hi)) for _ in range(B)]
    form = draw(st.sampled_from(["int32", "int"] + ([] if valid else ["int64", "shape"])))
    if form == "int":
        args["cache_seqlens"] = lens[0]
        lens = [lens[0]] * B
    else:
        t = torch.tensor(lens, dtype=torch.int64 if form == "int64" else torch.int32)
        args["cache_seqlens"] = (t[None] if form == "shape" else t).to(DEVICE)
    if draw(st.booleans()):
        hi_e = entries - 1 if valid else entries
        args["cache_batch_idx"] = torch.tensor(
            draw(st.permutations(range(entries)))[:B] if valid else
            [draw(st.integers(-1, hi_e)) for _ in range(B)], dtype=torch.int32).to(DEVICE)
    if draw(st.booleans()):
        args["cache_leftpad"] = torch.tensor(
            [draw(st.integers(0, max(n, 0) if valid else 3)) for n in lens],
            dtype=torch.int32).to(DEVICE)
    return args


@FUZZ
@given(kvcache_call())
def test_flash_attn_with_kvcache(args):
    if DEVICE == "cuda" and any(n in args for n in ("cache_batch_idx", "cache_leftpad")):
        hypothesis.assume(False)  # (on the GPU bad indices give NaN rows by design: not fuzzed)
    outcome, out = _call(fad.flash_attn_with_kvcache, args)
    if outcome == "raised":
        return
    assert out.shape == args["q"].shape
    if "k" in args and isinstance(args["cache_seqlens"], torch.Tensor):
        idx, cap, n_new = args.get("cache_batch_idx"), args["k_cache"].shape[1], args["k"].shape[1]
        for b, n in enumerate(args["cache_seqlens"].tolist()):
            e = b if idx is None else int(idx[b])
            if 0 <= n and n + n_new <= cap:
                assert torch.equal(args["k_cache"][e, n:n + n_new], args["k"][b])
            else:  # CUDA tensors: lengths are not read back; the sequence's output is NaN
                assert DEVICE == "cuda" and out[b].isnan().all(), f"sequence {b} past the cache"


@FUZZ
@given(st.sampled_from([True, False, None, "x"]),
       st.sampled_from([512, 128, 256, 0, 100, -128, 2 ** 24 + 128, 2 ** 31 - 128, "x", 512.0]))
def test_set_deterministic_mode(enabled, split_size):
    before = mode.state()
    try:
        fad.set_deterministic_mode(enabled, split_size)
    except DOCUMENTED as exc:
        assert NAMED.match(str(exc)), exc
        assert mode.state() == before
        return
    assert fad.get_split_size() == split_size and fad.get_deterministic_mode() == bool(enabled)


def test_outcome_counts():
    """The cases per entry and outcome (printed; run with -s to see them), and a check that the
    fuzzer is not vacuous: every entry both returned and raised."""
    print("\nfuzz outcomes:", dict(sorted(OUTCOMES.items())))
    for entry in ("flash_attn_func", "flash_attn_varlen_func", "flash_attn_with_kvcache"):
        assert OUTCOMES[(entry, "ok")] > 0, f"{entry}: no call returned"
        assert sum(n for (e, o), n in OUTCOMES.items() if e == entry and o != "ok") > 0, \
            f"{entry}: no call raised"


def test_defects_the_fuzzer_found():
    """Regressions of what the first runs found: max_seqlen_k = NaN raised a bare ValueError
    from int(); head dim 0 a ZeroDivisionError from the default scale."""
    q = torch.zeros(0, 2, 16, dtype=torch.float16)
    cu = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="^max_seqlen_k:"):
        fad.flash_attn_varlen_func(q, q[:, :1], q[:, :1], cu, cu, 0, math.nan)
    with pytest.raises(TypeError, match="^max_seqlen_q:"):
        fad.flash_attn_varlen_func(q, q[:, :1], q[:, :1], cu, cu, None, 0)
    e = torch.zeros(1, 1, 1, 0, dtype=torch.float16)
    with pytest.raises(ValueError, match="^head_dim:"):
        fad.flash_attn_func(e, e, e)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason="needs a GPU"))])
def test_expanded_cache_with_a_padded_head_dim_is_refused(device):
    """Found by the fuzzer on CUDA: at head dim 59 the call ran on a padded copy of the cache,
    which hid its stride-0 rows from the checks, and copying back raised torch's RuntimeError."""
    kc = torch.randn(1, 8, 1, 59, dtype=torch.float16, device=device).expand(2, 8, 1, 59)
    vc = torch.randn(2, 8, 1, 59, dtype=torch.float16, device=device)
    new = torch.randn(2, 1, 1, 59, dtype=torch.float16, device=device)
    q = torch.randn(2, 1, 2, 59, dtype=torch.float16, device=device)
    before = (kc.clone(), vc.clone())
    with pytest.raises(ValueError, match="^k_cache:"):
        fad.flash_attn_with_kvcache(q, kc, vc, new, new, cache_seqlens=3)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])
