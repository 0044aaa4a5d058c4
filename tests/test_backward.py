"""The backward pass on both paths: gradients against float64 autograd, and the
training contract (a sequence's dq, dk, dv do not depend on the rest of the batch,
nor on the run). The GPU tests skip without a GPU.
"""
import pytest
import torch

import flash_attn_det as fad
from flash_attn_det.testing import attention_ref

from conftest import HAS_CUDA, make_gen, on_devices, randn, warm_up_for_capture

# Relative error of a gradient (Frobenius norm) against float64 autograd: the inputs are
# rounded to the dtype and so are the gradients, so a few unit roundoffs.
REL_TOL = {torch.float16: 1e-3, torch.bfloat16: 6e-3}


def grads(fn, q, k, v, dout, **kw):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, **kw)
    out.backward(dout)
    return out.detach(), q.grad, k.grad, v.grad


def ref_grads(q, k, v, dout, **kw):
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, _ = attention_ref(q, k, v, **kw)
    out.backward(dout.double())
    return q.grad, k.grad, v.grad


def assert_rel(got, ref, dtype, what):
    assert torch.isfinite(got).all(), f"{what}: non-finite"
    den = float(ref.norm())
    err = float((got.double() - ref).norm()) / (den if den > 0 else 1.0)
    assert den > 0 or float(got.abs().max()) == 0.0, f"{what}: reference is zero, got nonzero"
    assert err < REL_TOL[dtype], f"{what}: relative error {err:.2e} >= {REL_TOL[dtype]:g}"


CASES = [
    dict(B=2, Sq=37, Sk=41, H=4, Hk=2, D=24),
    dict(B=1, Sq=80, Sk=80, H=2, Hk=2, D=64, causal=True),
    dict(B=2, Sq=50, Sk=20, H=3, Hk=1, D=8, causal=True),                 # fully masked rows
    dict(B=1, Sq=30, Sk=90, H=2, Hk=2, D=40, window_size=(10, 4)),
    dict(B=2, Sq=33, Sk=33, H=2, Hk=2, D=32, softcap=3.0, causal=True),
    dict(B=2, Sq=25, Sk=60, H=4, Hk=4, D=16, alibi="BH"),
    dict(B=1, Sq=9, Sk=700, H=2, Hk=1, D=128),                             # several splits
]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_cpu_grads_match_float64(dtype, case):
    case = dict(case)
    B, Sq, Sk, H, Hk, D = (case.pop(n) for n in ("B", "Sq", "Sk", "H", "Hk", "D"))
    gen = make_gen(21)
    q, k, v = (randn(gen, (B, S, h, D), dtype) for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    dout = randn(gen, (B, Sq, H, D), dtype)
    if case.pop("alibi", None):
        case["alibi_slopes"] = torch.rand((B, H), generator=gen) * 0.2 + 0.01
    _, dq, dk, dv = grads(fad.flash_attn_func, q, k, v, dout, **case)
    rq, rk, rv = ref_grads(q, k, v, dout, **case)
    for what, got, ref in (("dq", dq, rq), ("dk", dk, rk), ("dv", dv, rv)):
        assert_rel(got, ref, dtype, what)
    if case.get("causal") and Sq > Sk:  # rows that see no key get no gradient
        assert torch.equal(dq[:, :Sq - Sk], torch.zeros_like(dq[:, :Sq - Sk]))


def test_cpu_grads_batch_invariant_and_run_to_run():
    gen = make_gen(22)
    B, S, H, Hk, D = 4, 70, 4, 2, 32
    q, k, v, dout = (randn(gen, (B, S, h, D), torch.bfloat16) for h in (H, Hk, Hk, H))
    full = grads(fad.flash_attn_func, q, k, v, dout, causal=True)
    again = grads(fad.flash_attn_func, q, k, v, dout, causal=True)
    assert all(torch.equal(a, b) for a, b in zip(full, again)), "not run-to-run stable"
    for b in range(B):
        alone = grads(fad.flash_attn_func, q[b:b + 1], k[b:b + 1], v[b:b + 1], dout[b:b + 1],
                      causal=True)
        for name, f, a in zip(("out", "dq", "dk", "dv"), full, alone):
            assert torch.equal(f[b:b + 1], a), f"sequence {b}: {name} depends on the batch"


def test_cpu_varlen_grads_equal_single_sequences():
    gen = make_gen(23)
    lens, H, D = [30, 1, 55], 2, 32
    q, k, v, dout = (randn(gen, (sum(lens), H, D), torch.float16) for _ in range(4))
    cu = torch.tensor([0, 30, 31, 86], dtype=torch.int32)

    def varlen(q, k, v, **kw):
        return fad.flash_attn_varlen_func(q, k, v, cu, cu, 55, 55, **kw)

    _, dq, dk, dv = grads(varlen, q, k, v, dout, causal=True)
    for s0, s1 in ((0, 30), (30, 31), (31, 86)):
        _, aq, ak, av = grads(fad.flash_attn_func, q[None, s0:s1], k[None, s0:s1],
                              v[None, s0:s1], dout[None, s0:s1], causal=True)
        assert torch.equal(dq[s0:s1], aq[0]) and torch.equal(dk[s0:s1], ak[0])
        assert torch.equal(dv[s0:s1], av[0])


def test_cpu_packed_grads_equal_unpacked():
    gen = make_gen(24)
    qkv = randn(gen, (2, 40, 3, 2, 32), torch.bfloat16)
    dout = randn(gen, (2, 40, 2, 32), torch.bfloat16)
    qkv_g = qkv.clone().requires_grad_(True)
    fad.flash_attn_qkvpacked_func(qkv_g, causal=True).backward(dout)
    _, dq, dk, dv = grads(fad.flash_attn_func, *qkv.unbind(2), dout, causal=True)
    assert torch.equal(qkv_g.grad, torch.stack((dq, dk, dv), dim=2))


# ---------------------------------------------------------------------------------------
# GPU backward
# ---------------------------------------------------------------------------------------

GPU_CASES = CASES + [
    dict(B=2, Sq=300, Sk=300, H=4, Hk=1, D=128, causal=True),              # MQA, many tiles
    dict(B=1, Sq=129, Sk=517, H=4, Hk=2, D=64, window_size=(100, 0)),     # sliding window
    dict(B=2, Sq=200, Sk=64, H=2, Hk=2, D=96, causal=True),               # rows with no key
    dict(B=1, Sq=190, Sk=190, H=2, Hk=1, D=128, softcap=5.0, alibi="H"),
    dict(B=2, Sq=150, Sk=170, H=4, Hk=2, D=256, causal=True),             # dK/dV column slices
    dict(B=1, Sq=100, Sk=230, H=2, Hk=2, D=192, window_size=(50, 20), softcap=2.0),
]


def _to_cuda(*ts):
    return tuple(t.cuda() for t in ts)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_gpu_grads_match_float64(dtype, case):
    """Within the larger of REL_TOL and twice the error of the same math done in the
    dtype by torch (P and dS are rounded to the dtype for the tensor cores, as in FA2)."""
    case = dict(case)
    B, Sq, Sk, H, Hk, D = (case.pop(n) for n in ("B", "Sq", "Sk", "H", "Hk", "D"))
    gen = make_gen(31)
    q, k, v = (randn(gen, (B, S, h, D), dtype) for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    dout = randn(gen, (B, Sq, H, D), dtype)
    alibi = case.pop("alibi", None)
    if alibi:
        shape = (B, H) if alibi == "BH" else (H,)
        case["alibi_slopes"] = (torch.rand(shape, generator=gen) * 0.2 + 0.01).cuda()
    rq, rk, rv = ref_grads(*_to_cuda(q, k, v, dout), **case)
    qc, kc, vc, dc = _to_cuda(q, k, v, dout)
    _, dq, dk, dv = grads(fad.flash_attn_func, qc, kc, vc, dc, **case)
    lp = [t.grad for t in (qc, kc, vc)]
    qt, kt, vt = (t.detach().clone().requires_grad_(True) for t in (qc, kc, vc))
    attention_ref(qt, kt, vt, upcast=False, **case)[0].backward(dc)  # the math in the dtype
    for what, got, ref, peer in (("dq", dq, rq, qt.grad), ("dk", dk, rk, kt.grad),
                                 ("dv", dv, rv, vt.grad)):
        den = float(ref.norm()) or 1.0
        peer_err = float((peer.double() - ref).norm()) / den
        assert torch.isfinite(got).all(), f"{what}: non-finite"
        err = float((got.double() - ref).norm()) / den
        tol = max(REL_TOL[dtype], 2 * peer_err)
        assert err < tol, f"{what}: relative error {err:.2e} >= {tol:.2e} (torch in dtype: {peer_err:.2e})"
    if case.get("causal") and Sq > Sk:  # rows that see no key get no gradient
        assert torch.equal(dq[:, :Sq - Sk], torch.zeros_like(dq[:, :Sq - Sk]))


def _gpu_inputs(seed, shapes, dtype=torch.bfloat16):
    gen = make_gen(seed)
    return [randn(gen, s, dtype, device="cuda") for s in shapes]


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kw", [dict(causal=True), dict(window_size=(64, 32)), dict(softcap=4.0)],
                         ids=["causal", "window", "softcap"])
def test_gpu_grads_batch_invariant_and_run_to_run(kw):
    """The batch-split test for gradients: B=8 against the same sequences as 4 + 4 and alone."""
    B, S, H, Hk, D = 8, 333, 8, 2, 128
    q, k, v, dout = _gpu_inputs(41, [(B, S, h, D) for h in (H, Hk, Hk, H)])
    full = grads(fad.flash_attn_func, q, k, v, dout, **kw)
    again = grads(fad.flash_attn_func, q, k, v, dout, **kw)
    assert all(torch.equal(a, b) for a, b in zip(full, again)), "not run-to-run stable"
    halves = [grads(fad.flash_attn_func, q[s], k[s], v[s], dout[s], **kw)
              for s in (slice(0, 4), slice(4, 8))]
    for name, f, a, b in zip(("out", "dq", "dk", "dv"), full, *halves):
        assert torch.equal(f, torch.cat((a, b))), f"{name}: B=8 differs from 4 + 4"
    alone = grads(fad.flash_attn_func, q[5:6], k[5:6], v[5:6], dout[5:6], **kw)
    for name, f, a in zip(("out", "dq", "dk", "dv"), full, alone):
        assert torch.equal(f[5:6], a), f"{name}: sequence 5 depends on the batch"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_varlen_grads_equal_single_sequences():
    lens, H, Hk, D = [300, 1, 77, 520], 4, 2, 64
    T = sum(lens)
    q, dout = _gpu_inputs(42, [(T, H, D)] * 2)
    k, v = _gpu_inputs(43, [(T, Hk, D)] * 2)
    cu = torch.tensor([0, 300, 301, 378, 898], dtype=torch.int32, device="cuda")

    def varlen(q, k, v, **kw):
        return fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), **kw)

    _, dq, dk, dv = grads(varlen, q, k, v, dout, causal=True)
    bounds = cu.tolist()
    for s0, s1 in zip(bounds[:-1], bounds[1:]):
        _, aq, ak, av = grads(fad.flash_attn_func, q[None, s0:s1], k[None, s0:s1],
                              v[None, s0:s1], dout[None, s0:s1], causal=True)
        assert torch.equal(dq[s0:s1], aq[0]) and torch.equal(dk[s0:s1], ak[0])
        assert torch.equal(dv[s0:s1], av[0])


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_packed_grads_equal_unpacked():
    qkv, dout = _gpu_inputs(44, [(2, 150, 3, 4, 64), (2, 150, 4, 64)])
    qkv_g = qkv.clone().requires_grad_(True)
    fad.flash_attn_qkvpacked_func(qkv_g, causal=True).backward(dout)
    _, dq, dk, dv = grads(fad.flash_attn_func, *qkv.unbind(2), dout, causal=True)
    assert torch.equal(qkv_g.grad, torch.stack((dq, dk, dv), dim=2))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", [dict(H=16, Hk=8, D=128, causal=True), dict(H=8, Hk=8, D=64)],
                         ids=["D128-gqa-causal", "D64"])
def test_gpu_backward_under_graph_capture(case):
    """A forward + backward captured in a CUDA graph, on a grid of at least one dK/dV CTA per
    SM (on sm_90: the wgmma kernels, the dQ kernel launched as a programmatic dependent of the
    dK/dV kernel): each replay on new inputs gives the bits of an eager call on them."""
    H, Hk, D, causal = case["H"], case["Hk"], case["D"], case.get("causal", False)
    L = 1100  # 9 blocks of 128 keys a (sequence, kv head)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    B = max(2, -(-sms // (9 * Hk)))
    assert 9 * B * Hk >= sms
    shapes = [(B, L, H, D), (B, L, Hk, D), (B, L, Hk, D), (B, L, H, D)]
    static = [t.requires_grad_(i < 3) for i, t in enumerate(_gpu_inputs(45, shapes))]
    q, k, v, dout = static

    def step():
        for t in (q, k, v):
            t.grad = None  # (the captured backward allocates its grads in the graph's pool)
        out = fad.flash_attn_func(q, k, v, causal=causal)
        out.backward(dout)
        return out

    warm_up_for_capture(step)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = step()
    for seed in (46, 47):
        fresh = _gpu_inputs(seed, shapes)
        with torch.no_grad():
            for t, f in zip(static, fresh):
                t.copy_(f)
        torch.cuda.synchronize()
        static_out.detach().fill_(float("nan"))  # poison: the replay must write every element
        for t in (q, k, v):
            t.grad.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        want = grads(fad.flash_attn_func, *fresh, causal=causal)
        for name, a, b in zip(("out", "dq", "dk", "dv"),
                              (static_out.detach(), q.grad, k.grad, v.grad), want):
            assert torch.equal(a, b), f"replay on inputs {seed}: {name} differs from eager"


# The backward's matmul kernels have Hopper variants (wgmma, sm_90a build on an sm_90 GPU,
# D <= 256 (no dropout above 128), softcap and ALiBi included, on grids of at least one dK/dV
# CTA per SM) beside the mma.sync ones; FLASH_ATTN_DET_WGMMA=0 turns them off for the process,
# =force runs them at every grid size (these cases are small). Same chains in the same order on
# the same fragments, so both must give the same bits; the default process, which picks by grid
# size, must too.
# Elsewhere every process runs the same kernels.
_BWD_VARIANT_CASES = [
    dict(B=2, Sq=700, Sk=700, H=4, Hk=2, D=128, dtype="bfloat16", causal=True),
    dict(B=2, Sq=333, Sk=1000, H=4, Hk=1, D=64, dtype="float16"),
    dict(B=1, Sq=257, Sk=300, H=2, Hk=2, D=96, dtype="bfloat16", window_size=(64, 16)),
    dict(B=2, Sq=500, Sk=200, H=3, Hk=1, D=40, dtype="float16", causal=True),  # rows with no key
    # softcap and ALiBi: a kMod variant of each kernel, with dkdv_kernel's / dq_kernel's bwd_score
    dict(B=1, Sq=190, Sk=190, H=2, Hk=1, D=128, dtype="bfloat16", softcap=5.0),
    dict(B=2, Sq=333, Sk=500, H=4, Hk=2, D=64, dtype="float16", causal=True, alibi=True),
    dict(B=1, Sq=257, Sk=300, H=2, Hk=2, D=96, dtype="bfloat16", window_size=(64, 16), alibi=True,
         softcap=10.0),
    dict(B=16, Sq=1100, Sk=1100, H=16, Hk=8, D=64, dtype="bfloat16", causal=True, alibi=True),
    dict(B=16, Sq=1100, Sk=1100, H=16, Hk=8, D=64, dtype="bfloat16", causal=True),  # >= 1 wave
    # dropout: a kDrop variant of each kernel, with the same keep rule and element-wise math
    dict(B=2, Sq=700, Sk=700, H=4, Hk=2, D=128, dtype="bfloat16", causal=True, dropout_p=0.15),
    dict(B=2, Sq=333, Sk=1000, H=4, Hk=1, D=64, dtype="float16", dropout_p=0.3),
    dict(B=16, Sq=1100, Sk=1100, H=16, Hk=8, D=64, dtype="bfloat16", causal=True, dropout_p=0.1),
    dict(B=2, Sq=700, Sk=700, H=4, Hk=2, D=128, dtype="bfloat16", causal=True, softcap=30.0,
         dropout_p=0.15),
    # D256: both kernels' column-split variants (S and dP split between the warpgroups),
    # D < 256 zero-filled
    dict(B=2, Sq=300, Sk=333, H=4, Hk=2, D=256, dtype="bfloat16", causal=True),
    dict(B=1, Sq=200, Sk=260, H=2, Hk=1, D=192, dtype="float16", window_size=(64, 16)),
    dict(B=1, Sq=190, Sk=190, H=2, Hk=1, D=256, dtype="bfloat16", softcap=30.0),
    dict(B=4, Sq=1100, Sk=1100, H=8, Hk=2, D=256, dtype="bfloat16", causal=True),  # >= 1 wave
    dict(B=2, Sq=333, Sk=500, H=4, Hk=2, D=256, dtype="float16", causal=True, alibi=True),
]


def _bwd_variant_grads():
    outs = []
    for i, case in enumerate(_BWD_VARIANT_CASES):
        case = dict(case)
        B, Sq, Sk, H, Hk, D = (case.pop(n) for n in ("B", "Sq", "Sk", "H", "Hk", "D"))
        dtype = getattr(torch, case.pop("dtype"))
        q, k, v, dout = _gpu_inputs(500 + i, [(B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D),
                                              (B, Sq, H, D)], dtype)
        if case.pop("alibi", False):  # (the same slopes in every process)
            gen = torch.Generator().manual_seed(900 + i)
            case["alibi_slopes"] = (torch.rand(B, H, generator=gen) * 0.3).cuda()
        torch.manual_seed(2000 + i)  # dropout's seed and offset: the same in every process
        outs.append([t.cpu() for t in grads(fad.flash_attn_func, q, k, v, dout, **case)])
    lens = [300, 1, 77, 520]
    cu = torch.tensor([0, 300, 301, 378, 898], dtype=torch.int32, device="cuda")
    q, dout = _gpu_inputs(550, [(898, 4, 64)] * 2)
    k, v = _gpu_inputs(551, [(898, 2, 64)] * 2)
    outs.append([t.cpu() for t in grads(
        lambda q, k, v: fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens),
                                                   causal=True), q, k, v, dout)])
    return outs


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_gpu_wgmma_and_mma_sync_backward_bit_equal(tmp_path):
    import os
    import subprocess
    import sys
    # (the wgmma kernels' producers copy whole tiles by TMA unless FLASH_ATTN_DET_WS_TMA=0)
    settings = {"0": dict(FLASH_ATTN_DET_WGMMA="0"), "force": dict(FLASH_ATTN_DET_WGMMA="force"),
                "force, cp.async": dict(FLASH_ATTN_DET_WGMMA="force", FLASH_ATTN_DET_WS_TMA="0"),
                None: {}}
    results = {}
    for setting, extra in settings.items():
        path = tmp_path / f"grads_{len(results)}.pt"
        code = ("import sys, torch; sys.path.insert(0, %r); import test_backward; "
                "torch.save(test_backward._bwd_variant_grads(), %r)" % (os.path.dirname(__file__),
                                                                         str(path)))
        # (the dQ pass: the five-product path, the default where it applies, has no mma.sync
        # form, so FLASH_ATTN_DET_WGMMA=0 gives other bits there; tests/test_bwd_dq_reduce.py)
        env = dict(os.environ, FLASH_ATTN_DET_BWD_DQ="recompute")
        env.pop("FLASH_ATTN_DET_WGMMA", None)
        env.pop("FLASH_ATTN_DET_WS_TMA", None)
        env.update(extra)
        subprocess.run([sys.executable, "-c", code], env=env, check=True,
                       cwd=os.path.dirname(__file__))
        results[setting] = torch.load(path)
    mma_sync = results["0"]
    assert len(mma_sync) == len(_BWD_VARIANT_CASES) + 1
    for setting in ("force", "force, cp.async", None):
        for i, (a, b) in enumerate(zip(results[setting], mma_sync)):
            for name, x, y in zip(("out", "dq", "dk", "dv"), a, b):
                assert torch.equal(x, y), f"case {i}: {name} differs ({setting} vs mma.sync)"


# ---------------------------------------------------------------------------------------
# One part of the backward (dQ only, dK/dV only): context parallel's calls
# ---------------------------------------------------------------------------------------

# (device, case): the CPU path; on the GPU mma.sync (small grid), the wgmma kernels (a grid of
# at least as many dK/dV CTAs as SMs), a score mod and dropout (the kMod / kDrop variants)
_PART_CASES = on_devices(
    [dict(B=2, Sq=37, Sk=41, H=4, Hk=2, D=24, causal=True)],
    [dict(B=2, Sq=130, Sk=170, H=4, Hk=2, D=64, causal=True),
     dict(B=2, Sq=1100, Sk=1100, H=16, Hk=8, D=128, causal=True),
     dict(B=1, Sq=300, Sk=260, H=2, Hk=1, D=128, softcap=4.0, window_size=(90, 10)),
     dict(B=2, Sq=200, Sk=200, H=2, Hk=2, D=64, dropout=0.2),
     dict(B=2, Sq=1100, Sk=1100, H=16, Hk=8, D=128, causal=True, dropout=0.1),
     dict(B=4, Sq=1100, Sk=1100, H=8, Hk=2, D=256, causal=True)])


def _case_inputs(case, seed, device):
    """q, k, v, dout (bf16, seeded) of a dict case with B, Sq, Sk, H, Hk, D; returns the case's
    other keys (a copy) first."""
    case = dict(case)
    B, Sq, Sk, H, Hk, D = (case.pop(n) for n in ("B", "Sq", "Sk", "H", "Hk", "D"))
    gen = make_gen(seed)
    q, k, v = (randn(gen, (B, S, h, D), torch.bfloat16).to(device)
               for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    dout = randn(gen, (B, Sq, H, D), torch.bfloat16).to(device)
    return case, q, k, v, dout


@pytest.mark.parametrize("device,case", _PART_CASES)
def test_backward_parts_equal_the_whole(device, case):
    """_backward(part="dq") gives the dq bits of part="all", part="dkdv" its dk and dv, and
    each leaves the other part out (None): the dQ and dK/dV passes share only the row sums."""
    from flash_attn_det import interface as I
    from flash_attn_det import dropout as fdrop
    case, q, k, v, dout = _case_inputs(case, 77, device)
    p = case.pop("dropout", 0.0)
    opts = (None, case.get("causal", False), case.get("window_size", (-1, -1)),
            case.get("softcap", 0.0), None)
    drop = None
    if p:
        seed, offset, _ = fdrop.draw(q, p)
        drop = (p, seed, offset)
    out, lse = I._fwd(q, k, v, *opts, dropout=drop)
    whole = I._backward(dout, q, k, v, out, lse, *opts, dropout=drop)
    dq, none_k, none_v = I._backward(dout, q, k, v, out, lse, *opts, dropout=drop, part="dq")
    none_q, dk, dv = I._backward(dout, q, k, v, out, lse, *opts, dropout=drop, part="dkdv")
    assert none_k is None and none_v is None and none_q is None
    for name, got, ref in (("dq", dq, whole[0]), ("dk", dk, whole[1]), ("dv", dv, whole[2])):
        assert float(ref.abs().max()) > 0, f"{name}: the whole backward gave zeros"
        assert torch.equal(got, ref), f"{name}: the part differs from the whole backward"
    with pytest.raises(ValueError, match="part"):
        I._backward(dout, q, k, v, out, lse, *opts, part="dk")


# (device, case): keys no query sees (a window that starts past them; Sk > Sq), rows that see
# no key (causal, Sq > Sk), and on the GPU each kernel family: mma.sync (small grids), the
# wgmma kernels at D64, D128 (GQA) and D256 (grids of at least one CTA an SM), a score mod,
# dropout, a head dim the kernels pad (96) and one Python pads (59)
_WRITE_CASES = on_devices(
    [dict(B=2, Sq=30, Sk=90, H=4, Hk=2, D=40, window_size=(10, 4)),
     dict(B=2, Sq=50, Sk=20, H=3, Hk=1, D=8, causal=True),
     dict(B=2, Sq=0, Sk=30, H=2, Hk=2, D=16)],
    [dict(B=2, Sq=130, Sk=400, H=4, Hk=2, D=64, window_size=(40, 0)),
     dict(B=2, Sq=50, Sk=20, H=3, Hk=1, D=64, causal=True),
     dict(B=2, Sq=1100, Sk=1500, H=16, Hk=8, D=128, window_size=(100, 0)),
     dict(B=4, Sq=1100, Sk=1100, H=16, Hk=16, D=64, causal=True),
     dict(B=4, Sq=1100, Sk=1300, H=8, Hk=4, D=256, window_size=(150, 0)),
     dict(B=2, Sq=300, Sk=700, H=2, Hk=1, D=96, softcap=4.0, window_size=(90, 10)),
     dict(B=2, Sq=200, Sk=500, H=2, Hk=2, D=64, window_size=(60, 0), dropout=0.2),
     dict(B=2, Sq=70, Sk=90, H=2, Hk=2, D=59, causal=True),
     dict(B=2, Sq=0, Sk=90, H=2, Hk=2, D=64)])


@pytest.mark.parametrize("device,case", _WRITE_CASES)
def test_backward_writes_every_gradient_element(device, case, monkeypatch):
    """A dense call's dq, dk and dv start as torch.empty_like: every path must write each of
    their elements (zeros for keys that no query sees and rows that see no key). The same call
    runs twice, every floating-point tensor made by torch.empty_like starting as zeros, then
    as NaN: output and gradients must be equal bit for bit. A call with no query row launches
    nothing: its dk and dv must be zeros."""
    Sq, Sk = case["Sq"], case["Sk"]
    case, q, k, v, dout = _case_inputs(case, 91, device)
    empty_like = torch.empty_like

    def run(fill):
        def filled_like(t, *a, **kw):
            x = empty_like(t, *a, **kw)
            return x.fill_(fill) if x.is_floating_point() else x

        monkeypatch.setattr(torch, "empty_like", filled_like)
        torch.manual_seed(5)  # (dropout: the same draws in both runs)
        try:
            return grads(fad.flash_attn_func, q, k, v, dout, dropout_p=case.get("dropout", 0.0),
                         causal=case.get("causal", False),
                         window_size=case.get("window_size", (-1, -1)),
                         softcap=case.get("softcap", 0.0))
        finally:
            monkeypatch.setattr(torch, "empty_like", empty_like)

    zeros, poisoned = run(0.0), run(float("nan"))
    dk = poisoned[2]
    if Sq == 0:
        assert dk.numel() and float(dk.abs().max()) == 0.0 and float(poisoned[3].abs().max()) == 0.0
    else:
        assert float(dk.abs().max()) > 0, "dk: zeros everywhere"
        if "window_size" in case:  # keys before the first row's window: seen by no query
            unseen = Sk - Sq - case["window_size"][0]
            assert unseen > 0 and float(dk[:, :unseen].abs().max()) == 0.0
    for name, x, y in zip(("out", "dq", "dk", "dv"), poisoned, zeros):
        assert torch.equal(x, y), f"{name}: an element is left unwritten (NaN) or differs"


def test_backward_part_arguments_are_checked():
    """_C.bwd: None is allowed for dq, or for dk and dv together, nothing else; a dropout
    tuple's seq_ids are checked against the batch (both before anything is written)."""
    from torch.utils.dlpack import to_dlpack
    from flash_attn_det import _C
    from flash_attn_det import interface as I
    gen = make_gen(78)
    q, k, v, dout = (randn(gen, (2, 40, 2, 32), torch.float16) for _ in range(4))
    out, lse = I._fwd(q, k, v, None, True, (-1, -1), 0.0, None)
    dq, dk, dv = (torch.full_like(t, 7.0) for t in (q, k, v))
    opts = (None, 32 ** -0.5, 0.0, -1, 0, 1, 1, 512, _C.SCHEDULE_AUTO, 0)
    fwd = [to_dlpack(t) for t in (q, k, v, out, lse)]
    for grads in ((None, None, dv), (dq, None, dv), (None, dk, None), (None, None, None)):
        g = [None if t is None else to_dlpack(t) for t in grads]
        with pytest.raises(ValueError, match="^dq, dk, dv: None"):
            _C.bwd(to_dlpack(dout), *g, *fwd, None, *opts)
    g = [to_dlpack(t) for t in (dq, dk, dv)]
    with pytest.raises(ValueError, match="^dropout_seq_ids"):
        _C.bwd(to_dlpack(dout), *g, *fwd, None, *opts,
               (0.1, 1, 2, to_dlpack(torch.zeros(3, dtype=torch.int32))))
    with pytest.raises(TypeError, match="^dropout_seq_ids: expected dtype int32"):
        _C.bwd(to_dlpack(dout), *g, *fwd, None, *opts,
               (0.1, 1, 2, to_dlpack(torch.zeros(2, dtype=torch.int64))))
    for t in (dq, dk, dv):
        assert (t == 7.0).all(), "a refused call wrote a gradient"
