# cp_check.py: Context parallel on several GPUs: bits against one GPU, and the speed-up. Verdict: every rank bit-equal; 1.52-1.94x on two H100s at 32k-128k tokens.
"""Context parallel over several GPUs: bits equal to one GPU, and the speed-up.

    torchrun --nproc_per_node=2 dev/cp_check.py [--seqlens 32768 65536 131072] [--json f]
    (also --nproc_per_node=4; run from the checkout root)

1. run_checks (flash_attn_det/distributed/check.py) at GPU sizes on all the ranks: every
   rank's out, lse, dq, dk, dv (sequence parallel, Ulysses, padded and packed, both layouts,
   causal and not, window, softcap, ALiBi) and the KV-cache prefill torch.equal to one GPU.
2. For each long causal sequence (batch 1, bf16): one GPU's forward+backward (rank 0 alone,
   the others waiting), then context_parallel_attn_func (head_tail layout) and
   ulysses_attn_func on all ranks: the time per forward+backward (median of --iters, the
   slowest rank's), the speed-up against one GPU, and whether every rank's out, dq, dk, dv
   equal one GPU's rows; for sequence parallel also the time of its all-gathers alone (the
   most a ring overlapping them with compute could hide).
Exit status 0 only when every check holds.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flash_attn_det import flash_attn_func  # noqa: E402
from flash_attn_det.distributed import (context_parallel_attn_func, shard,  # noqa: E402
                                        ulysses_attn_func)
from flash_attn_det.distributed import sequence as seq_mod  # noqa: E402
from flash_attn_det.distributed.check import run_checks  # noqa: E402


def _fwd_bwd(fn, q, k, v, dout):
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves)
    out.backward(dout)
    return [out] + [t.grad for t in leaves]


def _time(fn, iters, group):
    """Median seconds of fn() over iters, the slowest rank's (None: this rank does not run)."""
    times = []
    for _ in range(iters + 1):
        dist.barrier(group)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        res = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    med = torch.tensor(sorted(times[1:])[len(times[1:]) // 2], device="cuda")
    dist.all_reduce(med, op=dist.ReduceOp.MAX, group=group)
    return float(med), res


def _gather_time(q, k, v, iters):
    """Seconds (median, slowest rank) of the all-gathers alone that one sequence-parallel
    forward+backward makes (K/V; then Q, K, V, O, dO and the lse): what a ring that overlaps
    them with compute could at most hide."""
    plan = seq_mod._make_plan(q, k, v, None, "head_tail", None, 0.0)
    lse = torch.zeros(q.shape[0], q.shape[2], q.shape[1], device=q.device)

    def both():
        seq_mod._gather(plan, [k, v])
        seq_mod._gather(plan, [q, k, v, q, q], lse)
    return _time(both, iters, None)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", type=int, nargs="+", default=[32768, 65536, 131072])
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    report = {"world": world, "gpu": torch.cuda.get_device_name()}
    t0 = time.perf_counter()
    report["checks"] = run_checks(None, "cuda", size="gpu")
    report["checks_s"] = round(time.perf_counter() - t0, 1)
    ok = True
    report["runs"] = []
    for N in args.seqlens:
        g = torch.Generator().manual_seed(N)
        rnd = lambda h: torch.randn(1, N, h, args.dim, generator=g).to(torch.bfloat16).cuda()
        q, k, v, dout = rnd(args.heads), rnd(args.kv_heads), rnd(args.kv_heads), rnd(args.heads)
        solo = dist.new_group([0])
        one = None
        if rank == 0:
            one, ref = _time(lambda: _fwd_bwd(lambda *t: flash_attn_func(*t, causal=True),
                                              q, k, v, dout), args.iters, solo)
        else:
            ref = _fwd_bwd(lambda *t: flash_attn_func(*t, causal=True), q, k, v, dout)
        cut = lambda x: shard(x, rank, world, "head_tail")
        run = {"seqlen": N, "one_gpu_s": one}
        for name, fn in (("context_parallel", context_parallel_attn_func),
                         ("ulysses", ulysses_attn_func)):
            if name == "ulysses" and (args.heads % world or args.kv_heads % world):
                continue
            t, got = _time(lambda: _fwd_bwd(
                lambda *a: fn(*a, causal=True, layout="head_tail"),
                cut(q), cut(k), cut(v), cut(dout)), args.iters, None)
            same = torch.tensor([int(all(torch.equal(a, cut(b)) for a, b in zip(got, ref)))],
                                device="cuda")
            dist.all_reduce(same, op=dist.ReduceOp.MIN)
            ok &= bool(same)
            run[name] = {"s": round(t, 4), "bits_equal": bool(same)}
            if name == "context_parallel":
                run[name]["gather_s"] = round(_gather_time(cut(q), cut(k), cut(v), args.iters), 4)
        if rank == 0:
            for name in ("context_parallel", "ulysses"):
                if name in run:
                    run[name]["speedup"] = round(one / run[name]["s"], 2)
            print(json.dumps(run), flush=True)
        report["runs"].append(run)
        del ref
    if rank == 0:
        print(json.dumps(report, indent=1))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
