"""The CPU path's bits depend on nothing but the inputs: not on the number of threads it runs
on (torch.get_num_threads(), asked per call), nor on the instruction set its kernels were
picked for (FLASH_ATTN_DET_CPU_ISA pins AVX-512, AVX2 or plain C). Forward with its lse,
backward, varlen, KV-cache decode and a paged cache, at 1, 2, 3 and 4 threads; each result is
also held to the float64 reference, so that equal bits cannot mean equally wrong."""
import os
import subprocess
import sys

import pytest
import torch

import flash_attn_det as fad

from conftest import assert_close, make_gen, make_qkv, randn

THREADS = (1, 2, 3, 4)


@pytest.fixture
def threads():
    """Runs fn(n) at every thread count, restoring torch's count afterwards."""
    before = torch.get_num_threads()

    def at_each(fn):
        results = []
        for n in THREADS:
            torch.set_num_threads(n)
            assert torch.get_num_threads() == n
            results.append(fn(n))
        return results
    yield at_each
    torch.set_num_threads(before)


def _all_equal(results, what):
    first = results[0]
    for n, r in zip(THREADS[1:], results[1:]):
        for name, a, b in zip(what, first, r):
            assert torch.equal(a, b), f"{name}: 1 thread and {n} threads differ"


def _ref(q, k, v, causal):
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    qq = q.double().transpose(1, 2)
    kk = k.double().transpose(1, 2).repeat_interleave(H // Hk, 1)
    vv = v.double().transpose(1, 2).repeat_interleave(H // Hk, 1)
    s = qq @ kk.transpose(-1, -2) / D ** 0.5
    if causal:
        m = torch.ones(Sq, Sk, dtype=torch.bool).tril(Sk - Sq)
        s = s.masked_fill(~m, float("-inf"))
    return (s.softmax(-1) @ vv).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,H,Hk", [(64, 4, 4), (128, 8, 2), (72, 3, 1)])
def test_forward_threads(threads, causal, D, H, Hk):
    q, k, v = make_qkv(make_gen(1), 2, 333, 333, H, Hk, D, torch.bfloat16)

    def run(n):
        out, lse, _ = fad.flash_attn_func(q, k, v, causal=causal, return_attn_probs=True)
        return out, lse
    results = threads(run)
    _all_equal(results, ("out", "lse"))
    assert_close(results[0][0], _ref(q, k, v, causal), torch.bfloat16, atol=2e-2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("B,Hk", [(2, 2), (1, 1)])  # (1, 1): fewer kv heads than threads, two passes
def test_backward_threads(threads, causal, B, Hk):
    q, k, v = make_qkv(make_gen(2), B, 200, 600, 4, Hk, 64, torch.bfloat16)
    g = randn(make_gen(3), q.shape, torch.bfloat16)

    def run(n):
        qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
        fad.flash_attn_func(qq, kk, vv, causal=causal).backward(g)
        return qq.grad, kk.grad, vv.grad
    results = threads(run)
    _all_equal(results, ("dq", "dk", "dv"))
    qq, kk, vv = (x.double().requires_grad_(True) for x in (q, k, v))
    _ref(qq, kk, vv, causal).backward(g.double())
    for name, got, want in zip(("dq", "dk", "dv"), results[0], (qq.grad, kk.grad, vv.grad)):
        assert_close(got, want, torch.bfloat16, atol=5e-2, what=name)


def test_varlen_threads(threads):
    lens = [1, 70, 300, 129]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    total, H, D = int(cu[-1]), 4, 64
    gen = make_gen(4)
    q, k, v = (randn(gen, (total, H, D), torch.bfloat16) for _ in range(3))
    g = randn(gen, (total, H, D), torch.bfloat16)

    def run(n):
        qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
        out = fad.flash_attn_varlen_func(qq, kk, vv, cu, cu, max(lens), max(lens), causal=True)
        out.backward(g)
        return out.detach(), qq.grad, kk.grad, vv.grad
    results = threads(run)
    _all_equal(results, ("out", "dq", "dk", "dv"))
    for b in range(len(lens)):
        s = slice(int(cu[b]), int(cu[b + 1]))
        want = _ref(q[None, s], k[None, s], v[None, s], True)[0]
        assert_close(results[0][0][s], want, torch.bfloat16, atol=2e-2)


@pytest.mark.parametrize("paged", [False, True])
def test_kvcache_decode_threads(threads, paged):
    B, cap, Hq, Hk, D, page = 3, 2048, 8, 2, 128, 256
    gen = make_gen(5)
    q = randn(gen, (B, 1, Hq, D), torch.bfloat16)
    kc, vc = (randn(gen, (B, cap, Hk, D), torch.bfloat16) for _ in range(2))
    seqlens = torch.tensor([2048, 700, 1], dtype=torch.int32)
    kw = {}
    if paged:
        nblk = cap // page
        perm = torch.randperm(B * nblk, generator=gen)
        kp, vp = torch.empty(B * nblk, page, Hk, D, dtype=torch.bfloat16), None
        vp = torch.empty_like(kp)
        kp[perm], vp[perm] = kc.reshape(-1, page, Hk, D), vc.reshape(-1, page, Hk, D)
        kw["block_table"] = perm.view(B, nblk).to(torch.int32)
        kcache, vcache = kp, vp
    else:
        kcache, vcache = kc, vc

    def run(n):
        out, lse = fad.flash_attn_with_kvcache(q, kcache, vcache, cache_seqlens=seqlens,
                                               causal=True, return_softmax_lse=True, **kw)
        return out, lse
    results = threads(run)
    _all_equal(results, ("out", "lse"))
    for b in range(B):
        L = int(seqlens[b])
        want = _ref(q[b:b + 1], kc[b:b + 1, :L], vc[b:b + 1, :L], True)
        assert_close(results[0][0][b:b + 1], want, torch.bfloat16, atol=2e-2)


@pytest.mark.parametrize("isa", ["avx2", "c"])
def test_instruction_sets_same_bits(monkeypatch, isa):
    """The kernels picked for this machine and the pinned variant give the same bits (on a
    machine without AVX-512 or AVX2 the pin falls back to what it has: the test still holds)."""
    q, k, v = make_qkv(make_gen(6), 1, 150, 150, 2, 1, 40, torch.bfloat16)
    g = randn(make_gen(7), q.shape, torch.bfloat16)

    def run():
        qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
        out, lse, _ = fad.flash_attn_func(qq, kk, vv, causal=True, softcap=5.0,
                                          return_attn_probs=True)
        out.backward(g)
        return out.detach(), lse, qq.grad, kk.grad, vv.grad
    monkeypatch.delenv("FLASH_ATTN_DET_CPU_ISA", raising=False)
    best = run()
    monkeypatch.setenv("FLASH_ATTN_DET_CPU_ISA", isa)
    pinned = run()
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), best, pinned):
        assert torch.equal(a, b), f"{name}: the {isa} kernels differ from {os.uname().machine}'s best"


# (run in this process and, as source, in a subprocess)
_FWD_BWD = """
def fwd_bwd(q, k, v, g):
    import flash_attn_det as fad
    qq, kk, vv = (x.clone().requires_grad_(True) for x in (q, k, v))
    out = fad.flash_attn_func(qq, kk, vv, causal=True)
    out.backward(g)
    return out.detach(), qq.grad, kk.grad, vv.grad
"""


def test_own_threads_and_torch_team_same_bits(tmp_path):
    """Threads of the CPU path's own (FLASH_ATTN_DET_CPU_PTHREADS=1, read once a process: a
    subprocess) and a team of torch's OpenMP threads (this process, where torch's runtime is
    loaded) give the same bits, forward and backward, at 2 threads."""
    q, k, v = make_qkv(make_gen(8), 2, 300, 300, 4, 2, 64, torch.bfloat16)
    g = randn(make_gen(9), q.shape, torch.bfloat16)
    scope = {}
    exec(_FWD_BWD, scope)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        here = scope["fwd_bwd"](q, k, v, g)
    finally:
        torch.set_num_threads(before)
    torch.save((q, k, v, g), tmp_path / "in.pt")
    code = _FWD_BWD + ("import sys, torch\n"
                       "torch.set_num_threads(2)\n"
                       "torch.save(fwd_bwd(*torch.load(sys.argv[1])), sys.argv[2])\n")
    env = dict(os.environ, FLASH_ATTN_DET_CPU_PTHREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    own = torch.load(tmp_path / "out.pt")
    for name, a, b in zip(("out", "dq", "dk", "dv"), here, own):
        assert torch.equal(a, b), f"{name}: torch's OpenMP team and the path's own threads differ"
