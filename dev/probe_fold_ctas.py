# probe_fold_ctas.py: bench_fwd.py's forward table at D256 with few and many CTAs, deterministic and fast mode. Verdict: below 128 CTAs another plan runs; at one wave (128 CTAs) the no-store probe already recovers the gap, so the folds' cost is not waves meeting (benchmarks/results/2026-11-30_h200_fwd_d256_fold_stores.md, section 5).
"""Is the D256 fold's cost its SM's own store stream or the whole GPU's traffic at once? The
deterministic forward's folds store R's o (64 KB a consumer) at the same split boundary in every
CTA; fast mode has no fold before a row's last split. This times both at D256, 4096 keys, with
32, 64, 128 and 2048 CTAs of 128 rows (B x H x L / 128), and at 16384 keys with 128 and 256:

    python3 dev/probe_fold_ctas.py --preset quick --rounds 3 --no-plot \
        --impls fad_det,fad_fast,sdpa_cudnn --out OUT --tag probe_ctas

If det / fast stays near 1.0 with few CTAs and falls with many, the folds queue on the GPU's
memory system, not on their SM."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_fwd  # noqa: E402
from common import Config  # noqa: E402

SHAPES = [(4096, 1, 1), (4096, 1, 2), (4096, 1, 4), (4096, 8, 8), (16384, 1, 1), (16384, 1, 2)]


def configs(name):
    return [Config("bf16", b, L, L, h, h, 256, False) for L, b, h in SHAPES]


bench_fwd.preset_configs = configs
sys.exit(bench_fwd.main(sys.argv[1:]))
