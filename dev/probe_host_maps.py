# probe_host_maps.py: Host time of one prefill call whose kernel encodes tensor maps (D128: K, V, the output and Q), beside D64, per build. Verdict: the output's map (a309f7a) costs nothing measurable (benchmarks/results/2026-11-30_h200_fwd_setup_f6f2d52.md, section 4).
# usage: cp dev/abi/_C_<build>.abi3.so flash_attn_det/_C.abi3.so && PYTHONPATH=$PWD python3 dev/probe_host_maps.py <build>
import sys

import torch

import flash_attn_det as fad
sys.path.insert(0, "benchmarks")
from bench_overhead import per_call_us, capture
fad.set_deterministic_mode(True)
rows = []
for D, L in ((128, 128), (128, 512), (64, 128)):
    q = torch.randn(1, L, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    rows.append((f"D{D} L{L} B1 H1", (lambda q=q, k=k, v=v: fad.flash_attn_func(q, k, v))))
graphs = [capture(fn) for _, fn in rows]
eager = [1e9] * len(rows); graph = [1e9] * len(rows)
for _ in range(5):
    for n, ((_, fn), g) in enumerate(zip(rows, graphs)):
        eager[n] = min(eager[n], per_call_us(fn, 1000)); graph[n] = min(graph[n], per_call_us(g.replay, 1000))
for (name, _), e, g in zip(rows, eager, graph):
    print(f"{sys.argv[1]:6s} {name:18s} eager {e:8.2f} graph {g:8.2f} host-over-device {e - g:8.2f}")
