"""The five-product backward on sm_90 (FLASH_ATTN_DET_BWD_DQ=reduce): the dK/dV kernel issues
dQ = dS K and adds each tile to an fp32 accumulator in key-block order (docs/design.md,
"backward-order"). The switch is read once per process, so every check runs in a child
process with it set (the parent asserts the child's exit and prints its report):

- dq, dk, dv against float64 autograd on fresh random inputs, the gradients' memory
  poisoned with NaN and the workspace with 0xff bytes (D64, D96, D128; causal or not;
  GQA 4:1; a window; softcap; ALiBi; more query rows than keys; dropout, the reference
  given the call's keep mask);
- dk and dv bit-equal to the dQ-recomputing path's with one query head a kv head (the same
  products in the same order), dq differing somewhere (its sum regrouped: the path really ran);
  with GQA dk differing too (the five-product kernel walks its row tiles from the last down,
  the group's heads inner);
- run to run, batch size (B=1 against the same sequence in B=4) and padded against varlen,
  bit for bit; the dq-only and dk/dv-only parts equal to the whole.

And on the CPU (nvcc only, host code): the add order's turns against the dK/dV kernel's own
walk for random lengths and masks, and the accumulator's layout for random dense and varlen
batches (tests/dq_turn_check.cu).
"""
import os
import subprocess
import sys

import pytest
import torch

from conftest import requires_cuda


# (B, Sq, Sk, H, Hk, D, kwargs)
REF_CASES = [
    (2, 700, 700, 4, 4, 64, {}),
    (2, 700, 700, 8, 2, 64, dict(causal=True)),
    (2, 600, 650, 8, 2, 128, dict(causal=True)),
    (1, 1000, 1000, 4, 4, 128, {}),
    (1, 777, 900, 4, 1, 128, dict(window_size=(100, 20))),
    (2, 500, 500, 4, 2, 96, dict(causal=True)),
    (1, 640, 640, 4, 4, 128, dict(softcap=5.0, causal=True)),
    (2, 520, 520, 4, 4, 64, dict(alibi=True)),
    (2, 400, 150, 4, 2, 64, dict(causal=True)),  # rows that see no key
    (4, 1100, 1100, 16, 4, 128, dict(causal=True)),  # more than one wave of CTAs
    # dropout (one dQ buffer: bwd_dkdv_wgmma.cu), its mask from flash_attn_det.testing
    (2, 700, 700, 4, 4, 128, dict(causal=True, dropout_p=0.15)),
    (2, 600, 650, 8, 2, 64, dict(dropout_p=0.3)),
    (2, 520, 520, 4, 2, 128, dict(window_size=(100, 20), dropout_p=0.1)),
]
REL_TOL = {torch.float16: 1e-3, torch.bfloat16: 6e-3}


def _child_main():
    """Runs in the child (FLASH_ATTN_DET_BWD_DQ set by the parent): asserts, prints a report."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import flash_attn_det as fad
    from flash_attn_det import dropout as drop_rule
    from flash_attn_det.testing import attention_ref, dropout_mask_of
    from conftest import make_gen, randn

    mode = os.environ.get("FLASH_ATTN_DET_BWD_DQ") or "reduce"
    empty_like, empty = torch.empty_like, torch.empty

    def poisoned_like(t, *a, **kw):  # the gradients start as NaN: every element must be written
        x = empty_like(t, *a, **kw)
        return x.fill_(float("nan")) if x.is_floating_point() else x

    def poisoned_empty(*a, **kw):  # the workspace starts as 0xff bytes: the call zeroes the semaphores,
        x = empty(*a, **kw)        # and every accumulator tile must be written (first add a copy) or skipped
        return x.fill_(255) if x.dtype == torch.uint8 else x

    def grads(fn, q, k, v, dout, **kw):
        q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        torch.empty_like, torch.empty = poisoned_like, poisoned_empty
        try:
            out = fn(q, k, v, **kw)
            out.backward(dout)
        finally:
            torch.empty_like, torch.empty = empty_like, empty
        return q.grad, k.grad, v.grad

    def inputs(seed, B, Sq, Sk, H, Hk, D, dtype):
        gen = make_gen(seed)
        return [randn(gen, s, dtype, device="cuda") for s in
                ((B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, D), (B, Sq, H, D))]

    results = {}
    for i, (B, Sq, Sk, H, Hk, D, kw) in enumerate(REF_CASES):
        for dtype in (torch.bfloat16, torch.float16):
            kw = dict(kw)
            q, k, v, dout = inputs(700 + i, B, Sq, Sk, H, Hk, D, dtype)
            if kw.pop("alibi", False):
                kw["alibi_slopes"] = torch.rand(B, H, generator=make_gen(800 + i)).cuda() * 0.3
            ref_kw = dict(kw)
            if kw.get("dropout_p"):  # the call's seed and offset, read before it draws them
                # (torch seeds its CUDA generator from /dev/urandom: the children compared
                # below must draw the same masks)
                torch.manual_seed(1000 + i)
                seed, offset, _ = drop_rule.draw(q, kw["dropout_p"])
                ref_kw["dropout_mask"] = dropout_mask_of((kw["dropout_p"], seed, offset), H, Sq, Sk, "cuda")
            got = grads(fad.flash_attn_func, q, k, v, dout, **kw)
            qd, kd, vd = (t.detach().double().requires_grad_(True) for t in (q, k, v))
            out_ref, _ = attention_ref(qd, kd, vd, **ref_kw)
            out_ref.backward(dout.double())
            errs = []
            for name, g, r in zip(("dq", "dk", "dv"), got, (qd.grad, kd.grad, vd.grad)):
                assert torch.isfinite(g).all(), f"case {i} {dtype}: {name} has NaN/inf (unwritten?)"
                err = float((g.double() - r).norm()) / max(float(r.norm()), 1e-30)
                errs.append(err)
                assert err < REL_TOL[dtype], f"case {i} {dtype}: {name} relative error {err:.2e}"
            print(f"{mode} case {i} {dtype}: rel err dq/dk/dv " + " ".join(f"{e:.2e}" for e in errs))
            results[(i, str(dtype))] = [t.cpu() for t in got]

    # run to run, batch size, padded vs varlen, parts
    for D, kw in ((64, dict(causal=True)), (128, dict(causal=True)), (128, {}),
                  (64, dict(window_size=(200, 0)))):
        B, S, H, Hk = 4, 1000, 8, 2
        q, k, v, dout = inputs(900 + D, B, S, S, H, Hk, D, torch.bfloat16)
        full = grads(fad.flash_attn_func, q, k, v, dout, **kw)
        again = grads(fad.flash_attn_func, q, k, v, dout, **kw)
        for name, a, b in zip(("dq", "dk", "dv"), full, again):
            assert torch.equal(a, b), f"D{D} {kw}: {name} not run-to-run stable"
        alone = grads(fad.flash_attn_func, q[2:3], k[2:3], v[2:3], dout[2:3], **kw)
        for name, f, a in zip(("dq", "dk", "dv"), full, alone):
            assert torch.equal(f[2:3], a), f"D{D} {kw}: {name} of sequence 2 depends on the batch"
        cu = torch.arange(0, (B + 1) * S, S, dtype=torch.int32, device="cuda")
        flat = [t.reshape(B * S, *t.shape[2:]) for t in (q, k, v, dout)]
        var = grads(lambda q, k, v, **kw: fad.flash_attn_varlen_func(q, k, v, cu, cu, S, S, **kw),
                    *flat, **kw)
        for name, f, a in zip(("dq", "dk", "dv"), full, var):
            assert torch.equal(f.reshape(a.shape), a), f"D{D} {kw}: {name} padded differs from varlen"
        from flash_attn_det import interface
        out, lse = interface._fwd(q, k, v, None, kw.get("causal", False), kw.get("window_size", (-1, -1)),
                                  0.0, None)
        args = (dout, q, k, v, out, lse, None, kw.get("causal", False), kw.get("window_size", (-1, -1)), 0.0,
                None)
        whole = interface._backward(*args)
        dq_only = interface._backward(*args, part="dq")[0]
        dkdv_only = interface._backward(*args, part="dkdv")[1:]
        assert torch.equal(whole[0], dq_only), f"D{D} {kw}: the dq part differs from the whole"
        assert all(torch.equal(a, b) for a, b in zip(whole[1:], dkdv_only)), f"D{D} {kw}: dk/dv part differs"
        print(f"{mode} D{D} {kw}: run to run, B=1 vs B=4, padded vs varlen, parts: bit-equal")
    return results


def _run_code(code, setting, timeout=300, extra_env=None):
    """code in a child process with FLASH_ATTN_DET_BWD_DQ=setting (None: unset, the default)
    and extra_env, from this directory."""
    env = dict(os.environ)
    env.pop("FLASH_ATTN_DET_BWD_DQ", None)
    env.pop("FLASH_ATTN_DET_BWD_CTAS", None)
    env.update(extra_env or {})
    if setting is not None:
        env["FLASH_ATTN_DET_BWD_DQ"] = setting
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=os.path.dirname(os.path.abspath(__file__)))


def _run_child(mode, path):
    code = ("import sys, torch; sys.path.insert(0, %r); import test_bwd_dq_reduce as t; "
            "torch.save(t._child_main(), %r)" % (os.path.dirname(os.path.abspath(__file__)), str(path)))
    r = _run_code(code, mode, timeout=600)
    print(r.stdout)
    assert r.returncode == 0, f"{mode}: child failed\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return torch.load(path)


@pytest.mark.gpu
@requires_cuda
def test_gpu_dq_reduce_against_float64_and_recompute(tmp_path):
    """Both settings meet the float64 reference and the contract; without GQA dk, dv are
    bit-equal across them; dq differs somewhere, and with GQA dk too (so the five-product path
    ran: the sums are regrouped). The variable unset gives reduce's bits: it is the default."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the five-product path is sm_90's")
    reduce = _run_child("reduce", tmp_path / "reduce.pt")
    recompute = _run_child("recompute", tmp_path / "recompute.pt")
    default = _run_child(None, tmp_path / "default.pt")
    assert default.keys() == reduce.keys()
    for key, grads in default.items():
        assert all(torch.equal(a, b) for a, b in zip(grads, reduce[key])), f"{key}: the default is not reduce"
    dq_differs = dk_differs = False
    for key, (dq, dk, dv) in reduce.items():
        rdq, rdk, rdv = recompute[key]
        dq_differs |= not torch.equal(dq, rdq)
        if REF_CASES[key[0]][3] == REF_CASES[key[0]][4]:  # H == Hk: the recomputing path's walk
            assert torch.equal(dk, rdk) and torch.equal(dv, rdv), f"{key}: dk/dv differ between the settings"
        else:
            dk_differs |= not torch.equal(dk, rdk)
    assert dq_differs, "dq bit-equal to the recomputing path everywhere: was the reduce path taken?"
    assert dk_differs, "GQA dk bit-equal to the recomputing path everywhere: was the five-product walk taken?"


@pytest.mark.gpu
@requires_cuda
def test_gpu_dq_reduce_rejects_unknown_setting(tmp_path):
    """An unknown FLASH_ATTN_DET_BWD_DQ is a clear error naming the variable, not a silent default."""
    # (the backward is called directly, not through loss.backward(): an exception on autograd's
    # CUDA device thread can abort torch at interpreter exit, after the refusal was printed)
    code = ("import torch, flash_attn_det as fad\n"
            "from flash_attn_det import interface\n"
            "q = torch.randn(1, 64, 2, 64, device='cuda', dtype=torch.bfloat16)\n"
            "out, lse, _ = fad.flash_attn_func(q, q, q, return_attn_probs=True)\n"
            "try:\n"
            "    interface._backward(out, q, q, q, out, lse, None, False, (-1, -1), 0.0, None)\n"
            "except ValueError as e:\n"
            "    assert 'FLASH_ATTN_DET_BWD_DQ' in str(e), e\n"
            "    print('refused')\n")
    r = _run_code(code, "sometimes")
    assert r.returncode == 0 and "refused" in r.stdout, r.stdout + r.stderr


def test_dq_turns_follow_the_walk(tmp_path):
    """Every row tile's walkers (dkdv_row_tiles) take the turns 0, 1, 2, ... from the last key
    block down (dq_turn): no gap (a CTA would wait forever) and no repeat; and no two
    (sequence, head, row tile) share an accumulator tile, all within the workspace's count
    (dq_tile). Host code, built with nvcc from the kernels' own headers."""
    import shutil
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    here = os.path.dirname(os.path.abspath(__file__))
    exe = str(tmp_path / "dq_turn_check")
    subprocess.run([nvcc, "-O2", "-std=c++17", "--expt-relaxed-constexpr",
                    "-I" + os.path.join(here, "..", "csrc"), "-o", exe,
                    os.path.join(here, "dq_turn_check.cu")], check=True, timeout=300)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("ok "), r.stdout + r.stderr


@pytest.mark.gpu
@requires_cuda
def test_gpu_dq_accumulator_sized_by_rows(tmp_path):
    """Varlen: the dQ accumulator takes a tile set per sequence in the call's packed rows (the
    call's rows rounded up to a tile, plus a tile a sequence), not batch x the longest sequence:
    one sequence of 4096 rows and 63 of 64 ask for the workspace that bound gives (D128: tiles of
    64 rows x 128 fp32 and a semaphore, and the dK/dV grid's ticket), a fraction of the old size;
    and the gradients still meet the padded call's bit for bit (a sequence's tiles start where the
    layout says)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the five-product path is sm_90's")
    code = (
        "import torch, flash_attn_det as fad\n"
        "from flash_attn_det import interface\n"
        "H, D, lens = 4, 128, [4096] + [64] * 63\n"
        "T, B = sum(lens), len(lens)\n"
        "cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device='cuda')\n"
        "g = torch.Generator(device='cuda').manual_seed(3)\n"
        "q, k, v, do = (torch.randn(T, H, D, device='cuda', dtype=torch.bfloat16, generator=g) for _ in range(4))\n"
        "q, k, v = (t.requires_grad_() for t in (q, k, v))\n"
        "out = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)\n"
        "grads = torch.autograd.grad(out, (q, k, v), do)\n"
        "need = max(n for key, n in interface._WS_BYTES.items() if key[0] == 'bwd')\n"
        "tile = 64 * 128 * 4 + 4\n"
        "bound = -(-(H * T * 4) // 256) * 256 + H * (T // 64 + B) * tile + 4\n"
        "old = H * B * (4096 // 64) * tile\n"
        "assert need <= bound, (need, bound)\n"
        "assert need * 8 < old, (need, old)\n"
        "for i in (0, 5, 63):  # a sequence alone, padded: the same bits\n"
        "    s0, s1 = int(cu[i]), int(cu[i + 1])\n"
        "    qi, ki, vi = (t.detach()[None, s0:s1].clone().requires_grad_() for t in (q, k, v))\n"
        "    oi = fad.flash_attn_func(qi, ki, vi, causal=True)\n"
        "    gi = torch.autograd.grad(oi, (qi, ki, vi), do[None, s0:s1])\n"
        "    assert all(torch.equal(a[s0:s1], b[0]) for a, b in zip(grads, gi)), i\n"
        "print('workspace', need, 'bound', bound, 'old', old)\n")
    r = _run_code(code, "reduce")
    assert r.returncode == 0 and "workspace" in r.stdout, r.stdout + r.stderr[-3000:]
    print(r.stdout)


@pytest.mark.gpu
@requires_cuda
def test_gpu_persistent_grid_any_cta_count():
    """The persistent dK/dV grid hands its items out in order whatever runs them: with at most 1,
    2 or 7 CTAs (FLASH_ATTN_DET_BWD_CTAS, each CTA then running hundreds of items back to back),
    every gradient is the full grid's bit for bit -- D64 and D128, causal and not, GQA, varlen,
    dropout -- and nothing hangs."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("the five-product path is sm_90's")
    code = (
        "import hashlib, torch, flash_attn_det as fad\n"
        "fad.set_deterministic_mode(True)\n"
        "h = hashlib.sha256()\n"
        "for B, L, H, Hk, D, causal, p in [(4, 1024, 8, 8, 64, False, 0.0), (2, 2048, 16, 4, 128, True, 0.0),\n"
        "                                  (2, 1000, 8, 8, 128, True, 0.1)]:\n"
        "    g = torch.Generator(device='cuda').manual_seed(B * L + D)\n"
        "    q, k, v = (torch.randn(B, L, h_, D, device='cuda', dtype=torch.bfloat16, generator=g).requires_grad_()\n"
        "               for h_ in (H, Hk, Hk))\n"
        "    do = torch.randn(B, L, H, D, device='cuda', dtype=torch.bfloat16, generator=g)\n"
        "    torch.manual_seed(0)\n"
        "    out = fad.flash_attn_func(q, k, v, dropout_p=p, causal=causal)\n"
        "    for t in torch.autograd.grad(out, (q, k, v), do):\n"
        "        h.update(t.float().cpu().numpy().tobytes())\n"
        "    cu = torch.tensor([0, L // 3, B * L], dtype=torch.int32, device='cuda')\n"
        "    qv, kv, vv = (t.detach().reshape(B * L, t.shape[2], D).clone().requires_grad_() for t in (q, k, v))\n"
        "    ov = fad.flash_attn_varlen_func(qv, kv, vv, cu, cu, B * L - L // 3, B * L - L // 3, causal=causal)\n"
        "    for t in torch.autograd.grad(ov, (qv, kv, vv), do.reshape(B * L, H, D)):\n"
        "        h.update(t.float().cpu().numpy().tobytes())\n"
        "print('digest', h.hexdigest())\n")
    digests = []
    for ctas in (None, "1", "2", "7"):
        r = _run_code(code, None, extra_env={"FLASH_ATTN_DET_BWD_CTAS": ctas} if ctas else None)
        assert r.returncode == 0 and "digest" in r.stdout, r.stdout + r.stderr[-3000:]
        digests.append(r.stdout.split("digest")[1].strip())
    assert len(set(digests)) == 1, digests
