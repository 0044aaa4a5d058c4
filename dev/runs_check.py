# runs_check.py: One-sequence decode whose split CTAs walk runs (split tickets), bit for bit against num_splits=1, against itself over repeated calls, and near fp64. Verdict: tool.
"""One-sequence decode calls that take the packed kernel's runs (packed_runs_shape: batch 1, a CTA
per split past one wave), where a CTA takes its splits from its row block's ticket as it goes:
each case's output and lse against the one-CTA walk (num_splits=1), against its own repeats
(which CTA takes which split changes from call to call; no bit may), and near a float64 reference.
Lengths off the tile and split grid, a window that starts the rows' splits past 0, D 64 / 256,
MHA (no spare flag row in the workspace), and a 4-token chunk.

    python3 dev/runs_check.py        # prints one line a case, then "differ: N of M"
"""
import torch

import flash_attn_det as fad
from decode_checks import fp64_row, schedule_faults

fad.set_deterministic_mode(True)
gen = torch.Generator(device="cuda").manual_seed(2)


def randn(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)


# (name, Sq, H, Hk, D, length, kwargs)
cases = [
    ("l17k", 1, 32, 8, 128, 17408, {}),
    ("l32k", 1, 32, 8, 128, 32768, {}),
    ("l40000", 1, 32, 8, 128, 40000, {}),
    ("l128k", 1, 32, 8, 128, 131072, {}),
    ("l131001_window", 1, 32, 8, 128, 131001, {"window_size": (100000, 0)}),
    ("d64_l100k", 1, 16, 4, 64, 100000, {}),
    ("d256_l70k", 1, 8, 2, 256, 70000, {}),
    ("mha_l64k", 1, 8, 8, 128, 65536, {}),
    ("chunk4_l64k", 4, 32, 8, 128, 65536, {}),
]
differ = 0
for name, Sq, H, Hk, D, n, kw in cases:
    q = randn(1, Sq, H, D)
    kc, vc = randn(1, n, Hk, D), randn(1, n, Hk, D)
    lens = torch.tensor([n], device="cuda", dtype=torch.int32)

    def run(**extra):
        # poison: the caching allocator hands the output memory that last held NaN
        torch.empty(q.numel() * 4 + Sq * H * 4, device="cuda").fill_(float("nan"))
        return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, causal=True,
                                           return_softmax_lse=True, **kw, **extra)

    o, lse, bad = schedule_faults(run, 5)
    nonfinite = int((~torch.isfinite(o.float())).sum())
    if nonfinite:
        bad.append(f"{nonfinite} non-finite")
    # float64: the last query row (it sees the window's keys, or all n)
    left = kw.get("window_size", (-1, 0))[0]
    lo = 0 if left < 0 else max(0, n - 1 - left)
    ref = fp64_row(q[0, -1], kc[0, lo:], vc[0, lo:])
    err = (o[0, -1].double() - ref).abs().max().item()
    if err > 2e-2:
        bad.append(f"err {err:.3g}")
    differ += bool(bad)
    print(f"{name}: {'; '.join(bad) or 'same'} (fp64 err {err:.2g})")
print(f"differ: {differ} of {len(cases)}")
