# probe_turn_clocks.py: The SM clock each forward meets in bench_fwd-style alternating turns, by the turn that ran before it. Verdict: no lag; in 6-20 ms turns both kernels run at one clock whichever turn came before (D128: 1680-1690 MHz at 4k keys, 1790-1800 at 1k), in 580 ms turns cuDNN's falls to 1614 MHz and ours to 1694 (benchmarks/results/2026-11-30_h200_fwd_inproc_36d9477.md, section 2).
"""flash_attn_det's deterministic forward and SDPA cuDNN (contiguous (B, H, L, D) tensors) take
turns of `--calls` calls each, in bench_fwd's order (common.turn_order: reversed every other round,
so that each impl sometimes follows the other and sometimes itself), while nvidia-smi samples the SM
clock and power every 20 ms on a reader thread. Per turn: TFLOP/s from CUDA events around the turn's
calls, and the mean of the samples that arrived during it. Printed per impl: all turns, the turns that
follow the other impl, the turns that follow itself.

    PYTHONPATH=$PWD python3 dev/probe_turn_clocks.py [--L 4096] [--calls 10] [--rounds 40] [--causal]

With --calls 10 the turns are as long as bench_fwd's; with --calls 500 each lasts long enough for the
clock to settle (compare dev/probe_bwd_power.py ... fwd, each impl alone for seconds)."""
import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import flash_attn_det as fad  # noqa: E402
from common import turn_order  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--L", type=int, default=4096)
ap.add_argument("--D", type=int, default=128)
ap.add_argument("--calls", type=int, default=10, help="calls a turn (bench_fwd: 10)")
ap.add_argument("--rounds", type=int, default=40)
ap.add_argument("--causal", action="store_true")
args = ap.parse_args()

fad.set_deterministic_mode(True)
L, D = args.L, args.D
B, H = max(1, 32768 // L), 2048 // D
flop = 4 * B * H * L * L * D / (2 if args.causal else 1)
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
qc, kc, vc = (t.transpose(1, 2).contiguous() for t in (q, k, v))


def cudnn():
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(qc, kc, vc, is_causal=args.causal)


impls = {"fad_det": lambda: fad.flash_attn_func(q, k, v, causal=args.causal), "cudnn": cudnn}

samples = []  # (host time of arrival, SM clock MHz, power W)
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "20"], stdout=subprocess.PIPE, text=True, bufsize=1)


def reader():
    for line in smi.stdout:
        try:
            c, p = (float(x) for x in line.split(","))
        except ValueError:
            continue
        samples.append((time.time(), c, p))


threading.Thread(target=reader, daemon=True).start()
for fn in impls.values():  # warm-up: plans, caches, the clock under load
    for _ in range(20):
        fn()
torch.cuda.synchronize()

turns = []  # (impl, previous impl, host t0, host t1, TFLOP/s)
prev = None
for r in range(args.rounds):
    for name in turn_order(impls, r):
        fn = impls[name]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        a.record()
        for _ in range(args.calls):
            fn()
        b.record()
        torch.cuda.synchronize()
        t1 = time.time()
        turns.append((name, prev, t0, t1, flop * args.calls / (a.elapsed_time(b) * 1e-3) / 1e12))
        prev = name
time.sleep(0.2)
smi.terminate()


def clock_of(t0, t1):
    win = [c for t, c, _ in samples if t0 <= t <= t1]
    return statistics.mean(win) if win else float("nan")


print(f"D{D} L{L} B{B} H{H} {'causal' if args.causal else 'full'}: {args.rounds} rounds of {args.calls} calls a turn, "
      f"{len(samples)} clock samples, turns of {statistics.median(t[3] - t[2] for t in turns) * 1e3:.1f} ms (median)")
med = {}
for name in impls:
    for label, sel in (("all turns", lambda t: True), ("after the other", lambda t: t[1] not in (None, t[0])),
                       ("after itself", lambda t: t[1] == t[0])):
        ts = [t for t in turns if t[0] == name and sel(t)]
        if not ts:
            continue
        tf = statistics.median(t[4] for t in ts)
        clocks = [c for c in (clock_of(t[2], t[3]) for t in ts) if c == c]
        clk = f"{statistics.mean(clocks):6.0f} MHz ({len(clocks)} turns with samples)" if clocks else "no samples"
        print(f"  {name:8s} {label:16s} {len(ts):3d} turns: {tf:6.1f} TFLOP/s, SM clock {clk}")
        if label == "all turns":
            med[name] = tf
print(f"  det / cuDNN (medians of all turns): {med['fad_det'] / med['cudnn']:.3f}")
