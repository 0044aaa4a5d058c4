# probe_fold_clock.py: One forward call per mode with the fold-clock probe module (branch probe-fwd-d256-fold-clock), the cycle counts its kernel writes over lse. Verdict: none yet (built, not run); with any other module it prints lse values, not counts.
"""Runs one bf16 forward, deterministic then fast mode, at the shape given (default D256, L4096,
B8, H8, non-causal), with a module built from the branch probe-fwd-d256-fold-clock. Its
warp-specialized kernel writes, for the first warp of each consumer of CTAs 0-3, over lse rows
m0 .. m0 + 6 of sequence 0, head 0: the walk's cycles, its turns, its folds, and per fold the wait
for O += P V, the fold and the exponentials after it, then an ordinary turn's exponentials
(dev/d256_fold_probes.sh builds it and runs this)."""
import sys

import torch

import flash_attn_det as fad

D, L, B, H = (int(x) for x in (sys.argv[1:5] if len(sys.argv) > 4 else (256, 4096, 8, 8)))
g = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
rows = 128 if D > 128 else 192  # a CTA's query rows (two consumers at D256, three at D128)
for det in (True, False):
    fad.set_deterministic_mode(det)
    for _ in range(3):
        lse = fad.flash_attn_func(q, k, v, return_attn_probs=True)[1]
    torch.cuda.synchronize()
    print(f"== deterministic={det} (D{D} L{L} B{B} H{H})")
    for cta in range(4):
        for c in range(rows // 64):
            m0 = cta * rows + c * 64
            walk, turns, folds, wait, fold, exp_after, exp = lse[0, 0, m0:m0 + 7].tolist()
            print(f"cta {cta} consumer {c}: walk {walk:.0f} cycles, {turns:.0f} turns, {folds:.0f} folds;"
                  f" per fold: wait {wait:.0f}, fold {fold:.0f}, exp after {exp_after:.0f};"
                  f" other turns' exp {exp:.0f}")
