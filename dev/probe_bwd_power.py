# probe_bwd_power.py: Power draw and SM clock of the backward (or, with fwd, the forward) beside cuDNN's, each run alone for seconds. Verdict: both run at the 700 W cap (691 W), the clock sets the speed; sustained, D128 L8k reads 1.03x (causal) and 1.015x (full) cuDNN (benchmarks/results/2026-11-30_h200_probes_drift_81a5aed.md, section 5). Forward: D128 0.96-0.99x at 4k keys, 0.99-1.00x at 16k, at a 2-4% higher clock (benchmarks/results/2026-11-30_h200_fwd_setup_f6f2d52.md, section 7).
"""Runs each backward (flash_attn_det deterministic, SDPA cuDNN in its (B, L, H, D) views)
back to back for `secs` seconds at D128 H16 bf16, L keys (8k) and batch 32768 / L, causal and
full, while nvidia-smi samples power and SM clock every 50 ms; prints per impl the mean power,
mean SM clock and TFLOP/s over the window (the first second dropped).

    PYTHONPATH=$PWD python3 dev/probe_bwd_power.py [secs] [L] [fwd]     (L: 8192; B = 32768 / L)

With `fwd` the forwards instead (cuDNN given contiguous (B, H, L, D) tensors)."""
import select
import subprocess
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_det as fad

fad.set_deterministic_mode(True)
secs = float(sys.argv[1]) if len(sys.argv) > 1 else 4.0
L = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
fwd = len(sys.argv) > 3 and sys.argv[3] == "fwd"
B, H, D = max(1, 32768 // L), 16, 128
smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                        "-lms", "50"], stdout=subprocess.PIPE, text=True)
samples = []  # (time, clock, power)


def read_samples():
    while select.select([smi.stdout], [], [], 0)[0]:
        line = smi.stdout.readline()
        try:
            c, p = (float(x) for x in line.split(","))
            samples.append((time.time(), c, p))
        except ValueError:
            pass


g = torch.Generator(device="cuda").manual_seed(0)
q, k, v, do = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
for causal in (True, False):
    flop = (1.0 if fwd else 2.5) * 4 * B * H * L * L * D / (2 if causal else 1)
    qa, ka, va = (t.clone().requires_grad_() for t in (q, k, v))
    out = fad.flash_attn_func(qa, ka, va, causal=causal)
    qt, kt, vt = (t.clone().transpose(1, 2).requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o2 = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    impls = {"fad_det": lambda: torch.autograd.grad(out, (qa, ka, va), do, retain_graph=True),
             "cudnn": lambda: torch.autograd.grad(o2, (qt, kt, vt), do.transpose(1, 2), retain_graph=True)}
    if fwd:
        qc, kc, vc = (t.transpose(1, 2).contiguous() for t in (q, k, v))

        def cudnn_fwd():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(qc, kc, vc, is_causal=causal)
        impls = {"fad_det": lambda: fad.flash_attn_func(q, k, v, causal=causal), "cudnn": cudnn_fwd}
    for rep in range(2):
        for name, fn in impls.items():
            torch.cuda.synchronize()
            t0 = time.time()
            n = 0
            while time.time() - t0 < secs:
                for _ in range(10):
                    fn()
                n += 10
                torch.cuda.synchronize()
                read_samples()
            t1 = time.time()
            time.sleep(0.3)
            read_samples()
            win = [(c, p) for t, c, p in samples if t0 + 1.0 <= t <= t1]
            clock = sum(c for c, _ in win) / max(1, len(win))
            power = sum(p for _, p in win) / max(1, len(win))
            print(f"{'causal' if causal else 'full':6s} {name:8s} turn {rep}: {flop * n / (t1 - t0) / 1e12:6.1f} TFLOP/s,"
                  f" SM clock {clock:6.0f} MHz, power {power:5.0f} W ({len(win)} samples)", flush=True)
            time.sleep(1.0)
smi.terminate()
