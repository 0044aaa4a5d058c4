"""The bit-equality check of the parallel functions, run by every rank of a process group:
for random lengths (multiples of nothing), causal and not, GQA, window, softcap, ALiBi, padded
and packed batches and both layouts, each rank's out, lse, dq, dk, dv must be torch.equal to
its rows of the single-device call on the whole input (which every rank computes too). Used by
tests/test_distributed.py (gloo on CPU, NCCL on GPUs) and dev/cp_check.py (torchrun).

    python -c "..." / torchrun: flash_attn_det.distributed.check.run_checks(group, device)
"""
import torch
import torch.distributed as dist

from ..interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .comm import group_info
from .layout import LAYOUTS, shard
from .prefill import context_parallel_prefill_with_kvcache
from .sequence import context_parallel_attn_func, context_parallel_attn_varlen_func
from .ulysses import ulysses_attn_func, ulysses_attn_varlen_func

# (rows of the padded batch, rows of the packed batch's longest sequence, head dim, heads)
_SIZES = {"small": (150, 90, 16, (4, 2)), "gpu": (1500, 900, 128, (8, 2))}

# Options beyond causal: each case below runs with every one of them in turn.
_EXTRAS = [dict(), dict(window_size=(45, 7), softcap=4.0), dict(alibi_slopes=True)]


def _cases(size):
    N, L, D, heads = _SIZES[size]
    i = 0
    for kind in ("context_parallel", "ulysses"):
        for packed in (False, True):
            for layout in LAYOUTS:
                for causal in (False, True):
                    for extra in _EXTRAS:
                        yield i, dict(kind=kind, packed=packed, layout=layout, causal=causal,
                                      N=N, L=L, D=D, heads=heads, **extra)
                        i += 1


def _inputs(case, seed, device, dtype, world):
    """Full q, k, v, dout, alibi slopes and cu_seqlens (None when padded), the same on every
    rank (drawn on the CPU from seed)."""
    g = torch.Generator().manual_seed(seed)
    H, Hk = case["heads"]
    if case["kind"] == "ulysses":  # heads divisible by the world size: a multiple of it
        H, Hk = H * world, Hk * world
    rnd = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)
    if case["packed"]:
        lens = torch.randint(1, case["L"], (4,), generator=g).tolist()
        lens[1] = 0  # an empty sequence in the middle
        cu = [0]
        for n in lens:
            cu.append(cu[-1] + n)
        lead, B = (cu[-1],), len(lens)
    else:
        cu, B = None, 2
        lead = (B, case["N"] - int(torch.randint(0, 37, (1,), generator=g)))
    q, dout = rnd(*lead, H, case["D"]), rnd(*lead, H, case["D"])
    k, v = rnd(*lead, Hk, case["D"]), rnd(*lead, Hk, case["D"])
    slopes = None
    if case.get("alibi_slopes"):
        slopes = (torch.rand(B, H, generator=g) * 0.3 + 0.01).to(device)
    return q, k, v, dout, slopes, cu


ONE_DEVICE = object()  # the group argument that asks for the single-device call (None is the default group)


def _call(case, q, k, v, cu, slopes, group=ONE_DEVICE):
    """(out, lse) of the case's function: the single-device one when group is ONE_DEVICE."""
    opts = dict(causal=case["causal"], window_size=case.get("window_size", (-1, -1)),
                softcap=case.get("softcap", 0.0), alibi_slopes=slopes, return_attn_probs=True)
    if group is ONE_DEVICE:
        if cu is None:
            return flash_attn_func(q, k, v, **opts)[:2]
        cut = torch.tensor(cu, dtype=torch.int32, device=q.device)
        longest = max(b - a for a, b in zip(cu, cu[1:]))
        return flash_attn_varlen_func(q, k, v, cut, cut, longest, longest, **opts)[:2]
    par = dict(group=group, layout=case["layout"])
    if case["kind"] == "ulysses":
        fn = ulysses_attn_func if cu is None else ulysses_attn_varlen_func
    else:
        fn = context_parallel_attn_func if cu is None else context_parallel_attn_varlen_func
    return (fn(q, k, v, **opts, **par) if cu is None else fn(q, k, v, cu, **opts, **par))[:2]


def _grads(case, q, k, v, dout, cu, slopes, group=ONE_DEVICE):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out, lse = _call(case, *leaves, cu, slopes, group)
    out.backward(dout)
    return [out, lse] + [t.grad for t in leaves]


def _agree(ok, group, device):
    """Every rank's verdict (so that all ranks stop together, none left in a collective)."""
    world, _ = group_info(group)
    flag = torch.tensor([int(ok)], device=device)
    flags = [torch.empty_like(flag) for _ in range(world)]
    dist.all_gather(flags, flag, group=group)
    return [bool(f) for f in flags]


def run_checks(group=None, device="cpu", dtype=torch.bfloat16, size="small", seed=0):
    """Runs every case on this rank (collective: every rank of group calls it alike); raises
    AssertionError on every rank when any rank's bits differ. Returns the number of cases."""
    world, rank = group_info(group)
    n = 0
    for i, case in _cases(size):
        q, k, v, dout, slopes, cu = _inputs(case, seed + i, device, dtype, world)
        ref = _grads(case, q, k, v, dout, cu, slopes)
        cut = lambda x, dim=None: shard(x, rank, world, case["layout"], cu, dim)
        mine = _grads(case, cut(q), cut(k), cut(v), cut(dout), cu, slopes, group)
        lse_dim = 1 if cu is not None else 2
        names = ("out", "lse", "dq", "dk", "dv")
        want = [cut(ref[0]), cut(ref[1], lse_dim)] + [cut(t) for t in ref[2:]]
        bad = [m for m, a, b in zip(names, mine, want) if not torch.equal(a, b)]
        verdict = _agree(not bad, group, device)
        if not all(verdict):
            failed = [r for r, f in enumerate(verdict) if not f]
            raise AssertionError(f"case {i} {case}: ranks {failed} differ from one device "
                                 f"(rank {rank}: {bad})")
        n += 1
    n += _check_prefill(group, device, dtype, size, seed, world, rank)
    _check_errors(group, device, dtype, world, rank)
    return n


def _check_prefill(group, device, dtype, size, seed, world, rank):
    """context_parallel_prefill_with_kvcache against one device's flash_attn_with_kvcache:
    out, lse and every replica's whole cache afterwards."""
    N, _, D, (H, Hk) = _SIZES[size]
    n = 0
    for layout in LAYOUTS:
        for causal in (False, True):
            for extra in _EXTRAS:
                g = torch.Generator().manual_seed(seed + 1000 + n)
                rnd = lambda *s: torch.randn(*s, generator=g).to(dtype).to(device)
                B, prior = 2, [int(x) for x in torch.randint(0, 60, (2,), generator=g)]
                new = N - int(torch.randint(0, 37, (1,), generator=g))
                q, k, v = rnd(B, new, H, D), rnd(B, new, Hk, D), rnd(B, new, Hk, D)
                caches = [rnd(B, max(prior) + new + 5, Hk, D) for _ in range(2)]
                seqlens = torch.tensor(prior, dtype=torch.int32, device=device)
                opts = dict(causal=causal, window_size=extra.get("window_size", (-1, -1)),
                            softcap=extra.get("softcap", 0.0), return_softmax_lse=True,
                            alibi_slopes=(torch.rand(B, H, generator=g) * 0.3 + 0.01).to(device)
                            if extra.get("alibi_slopes") else None)
                ref_cache = [c.clone() for c in caches]
                ref = flash_attn_with_kvcache(q, *ref_cache, k, v, cache_seqlens=seqlens, **opts)
                cut = lambda x, dim=1: shard(x, rank, world, layout, None, dim)
                mine = context_parallel_prefill_with_kvcache(
                    cut(q), *caches, cut(k), cut(v), seqlens, **opts, group=group,
                    layout=layout)
                ok = (torch.equal(mine[0], cut(ref[0])) and torch.equal(mine[1], cut(ref[1], 2))
                      and all(torch.equal(a, b) for a, b in zip(caches, ref_cache)))
                verdict = _agree(ok, group, device)
                if not all(verdict):
                    raise AssertionError(f"prefill {layout} causal={causal} {extra}: ranks "
                                         f"{[r for r, f in enumerate(verdict) if not f]} differ")
                n += 1
    return n


def _expect_value_error(fn, text, what):
    try:
        fn()
    except ValueError as e:
        if text not in str(e):
            raise
    else:
        raise AssertionError(what)


def _check_errors(group, device, dtype, world, rank):
    """A bad shard on one rank (rank 0's k one row short) raises ValueError on every rank:
    shapes are compared before any other collective, so no rank is left waiting."""
    q = torch.zeros(1, 10, 2, 16, dtype=dtype, device=device)
    k = q[:, :9] if rank == 0 else q
    _expect_value_error(lambda: context_parallel_attn_func(q, k, k, group=group),
                        "rank 0 holds 9 k", "a shard of the wrong length was accepted")
    # a bad option raises before the prefill writes any cache row
    cache = torch.randn(1, 10 * world + 3, 2, 16).to(dtype).to(device)
    before = cache.clone()
    _expect_value_error(lambda: context_parallel_prefill_with_kvcache(
        q, cache, cache, q, q, 2, softmax_scale=-1.0, group=group), "softmax_scale",
        "a negative softmax_scale was accepted")
    if not torch.equal(cache, before):
        raise AssertionError("the prefill wrote the cache before raising")
    if world > 1:  # ulysses: heads that do not divide by the world size
        q = torch.zeros(1, 10, world + 1, 16, dtype=dtype, device=device)
        _expect_value_error(lambda: ulysses_attn_func(q, q, q, group=group), "divisible",
                            "ulysses accepted heads that do not divide by the world size")


def spawn_worker(rank, world, init_file, backend, size, results):
    """A torch.multiprocessing.spawn target: joins a `world`-rank group (init through
    init_file), then runs run_checks in the subgroups of ranks [0, P) for P = 1 .. world (so
    one spawn covers every world size). Rank 0 puts {P: cases checked} on results (a queue)."""
    import datetime
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    counts = {}
    try:
        for P in range(1, world + 1):
            # the whole world as group=None, the default group (what a torchrun script passes)
            sub = None if P == world else dist.new_group(list(range(P)))
            if rank < P:
                counts[P] = run_checks(sub, device, size=size)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        results.put(counts)
