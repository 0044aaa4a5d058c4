"""flash_attn_det.distributed: context-parallel (sequence and head parallel) attention and the
KV-cache prefill over several ranks, with one device's bits (torch.equal), forward and backward.

- gloo on CPU tensors: 4 spawned ranks, run_checks in the groups of 1, 2, 3 and 4 of them.
- NCCL on GPUs (needs >= 2): the same checks at GPU sizes, 2 to 4 ranks.
- one GPU: every rank's per-rank calls simulated in one process (simulate_ranks), so the
  CUDA kernels' key-range and row-offset paths are proven without several GPUs.
"""
import multiprocessing
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from flash_attn_det import flash_attn_func, flash_attn_varlen_func
from flash_attn_det.distributed import (LAYOUTS, context_parallel_attn_func, shard, shard_ranges,
                                        simulate_ranks, unshard)
from flash_attn_det.distributed.check import spawn_worker

from conftest import HAS_CUDA, make_gen, randn

pytestmark = pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")


# ---- layouts -------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 7])
def test_shard_ranges_cover_the_stream_once(layout, world):
    for cu in (None, [0, 13, 13, 50, 51, 200]):
        total = 203 if cu is None else cu[-1]
        seen = torch.zeros(total, dtype=torch.int64)
        for r in range(world):
            for s, e in shard_ranges(r, world, layout, total, cu):
                seen[s:e] += 1
        assert torch.equal(seen, torch.ones_like(seen)), (layout, world, cu)
        x = torch.arange(total * 3).view(1, total, 3) if cu is None else \
            torch.arange(total * 3).view(total, 3)
        parts = [shard(x, r, world, layout, cu) for r in range(world)]
        assert torch.equal(unshard(parts, layout, cu), x)


def test_head_tail_balances_causal_work():
    # rank r holds chunks r and 2P-1-r: its causal work (sum of row positions) is within a
    # chunk's worth of every other rank's
    N, P = 4000, 4
    work = [sum(sum(range(s, e)) for s, e in shard_ranges(r, P, "head_tail", N)) for r in range(P)]
    assert max(work) - min(work) <= N * N / (2 * P) / P
    contiguous = [sum(sum(range(s, e)) for s, e in shard_ranges(r, P, "contiguous", N))
                  for r in range(P)]
    assert max(contiguous) > 3 * min(contiguous)


def test_errors():
    q = torch.zeros(1, 8, 2, 16, dtype=torch.bfloat16)
    if not dist.is_initialized():
        with pytest.raises(RuntimeError, match="group"):
            context_parallel_attn_func(q, q, q)
    with pytest.raises(ValueError, match="layout"):
        context_parallel_attn_func(q, q, q, layout="zigzag")
    with pytest.raises(ValueError, match="layout"):
        shard_ranges(0, 2, "zigzag", 10)
    with pytest.raises(NotImplementedError, match="dropout_p"):
        context_parallel_attn_func(q, q, q, 0.1)
    with pytest.raises(ValueError, match="q: expected 4 dims"):
        context_parallel_attn_func(q[0], q, q)


# ---- simulated ranks (one process) ---------------------------------------------------------

def _reference(q, k, v, dout, cu, **opts):
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    if cu is None:
        out, lse, _ = flash_attn_func(*leaves, return_attn_probs=True, **opts)
    else:
        cut = torch.tensor(cu, dtype=torch.int32, device=q.device)
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        out, lse, _ = flash_attn_varlen_func(*leaves, cut, cut, longest, longest,
                                             return_attn_probs=True, **opts)
    out.backward(dout)
    return [out, lse] + [t.grad for t in leaves]


def _sim_case(seed, device, world, layout, packed, N, H, Hk, D, dtype, **opts):
    g = make_gen(seed)
    cu = None
    if packed:
        lens = torch.randint(1, N, (4,), generator=g).tolist()
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        lead = (cu[-1],)
    else:
        lead = (2, N)
    q, dout = (randn(g, lead + (H, D), dtype, device) for _ in range(2))
    k, v = (randn(g, lead + (Hk, D), dtype, device) for _ in range(2))
    if opts.get("alibi_slopes"):
        opts["alibi_slopes"] = (torch.rand(len(lens) if packed else 2, H, generator=g) * 0.3
                                + 0.01).to(device)
    ref = _reference(q, k, v, dout, cu, **opts)
    got = simulate_ranks(q, k, v, dout, world, layout, cu, **opts)
    for name, a, b in zip(("out", "lse", "dq", "dk", "dv"), got, ref):
        assert torch.equal(a, b), f"{name} differs from one device ({world} ranks, {layout})"


_OPTS = [dict(causal=True), dict(), dict(window_size=(40, 9), softcap=3.0),
         dict(causal=True, alibi_slopes=True), dict(alibi_slopes=True, window_size=(-1, 20))]


@pytest.mark.parametrize("opts", _OPTS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("packed", [False, True])
def test_simulated_ranks_cpu(opts, layout, packed):
    for world in (2, 3, 5):
        _sim_case(world, "cpu", world, layout, packed, 211, 4, 2, 16, torch.float16, **opts)


# ---- gloo ranks (CPU), NCCL ranks (GPUs) ---------------------------------------------------

def _spawn(world, backend, size, tmp_path):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.SimpleQueue()
    mp.spawn(spawn_worker, args=(world, str(tmp_path / "init"), backend, size, results),
             nprocs=world)
    return results.get()


def test_gloo_ranks_bit_equal_to_one_process(tmp_path):
    counts = _spawn(4, "gloo", "small", tmp_path)
    # 48 sequence/head-parallel cases and 12 prefill cases in each group of 1 to 4 ranks
    assert counts == {1: 60, 2: 60, 3: 60, 4: 60}


@pytest.mark.skipif(not (HAS_CUDA and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
                    reason="needs >= 2 CUDA GPUs and NCCL")
def test_nccl_ranks_bit_equal_to_one_gpu(tmp_path):
    world = min(4, torch.cuda.device_count())
    counts = _spawn(world, "nccl", "gpu", tmp_path)
    assert counts == {P: 60 for P in range(1, world + 1)}


# ---- one GPU: the ranks simulated ----------------------------------------------------------

_GPU_SIM = [dict(N=1500, H=8, Hk=2, D=128, dtype=torch.bfloat16),
            dict(N=1133, H=4, Hk=4, D=64, dtype=torch.float16)]


def _gpu_sim_cases():
    n = 0
    for i, size in enumerate(_GPU_SIM):
        for world in (2, 3, 4):
            for layout in LAYOUTS:
                for packed in (False, True):
                    for opts in _OPTS:
                        _sim_case(100 * i + world, "cuda", world, layout, packed, **size,
                                  **dict(opts))
                        n += 1
    return n


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("wgmma", [None, "0", "force"])
def test_gpu_simulated_ranks_bit_equal(wgmma):
    # the backward's wgmma and mma.sync kernels (FLASH_ATTN_DET_WGMMA, read once a process)
    env = dict(os.environ)
    env.pop("FLASH_ATTN_DET_WGMMA", None)
    if wgmma is not None:
        env["FLASH_ATTN_DET_WGMMA"] = wgmma
    code = ("import sys; sys.path.insert(0, %r); import test_distributed as t; "
            "print(t._gpu_sim_cases())" % os.path.dirname(__file__))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-4000:]
    assert int(res.stdout.split()[-1]) == len(_GPU_SIM) * 3 * 2 * 2 * len(_OPTS)
