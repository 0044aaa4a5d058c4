# probe_fwd_lengths.py: bench_fwd.py's forward table at D128 lengths of one's choice (LS, default 1024,1152,1536,2048). Verdict: L1k's gap to cuDNN is not the three-consumer kernel's empty last blocks (1536 keys, none empty, 0.85x; 2048, 0.84x).
"""bench_fwd.py (its options, its report) on D128 MHA calls of 32768 tokens at the lengths in
LS, causal and not:

    LS=1024,1152,1536,2048 python3 dev/probe_fwd_lengths.py --preset quick --rounds 3 --no-plot \
        --impls fad_det,sdpa_cudnn,sdpa_cudnn_bhld --out OUT --tag probe_l

At 1152 and 1536 keys the three-consumer kernel's 192-row CTAs leave no 64-row block empty; at
1024 and 2048 they do (the last CTA of every head runs one or two consumers)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import bench_fwd  # noqa: E402
from common import Config  # noqa: E402

LS = [int(x) for x in os.environ.get("LS", "1024,1152,1536,2048").split(",")]


def configs(name):
    return [Config("bf16", max(1, 32768 // L), L, L, 16, 16, 128, causal) for L in LS
            for causal in (False, True)]


bench_fwd.preset_configs = configs
sys.exit(bench_fwd.main(sys.argv[1:]))
