# probe_bwd_last_wave.py: The D128 backward on shapes whose dK/dV grid fills its last wave of 132 SMs or not. Verdict: the last wave is not the gap (benchmarks/results/2026-11-30_h200_probes_bwd_decode_4259690.md, section 4).
"""The dK/dV kernel runs B x H x L / 128 CTAs at D128: 4,096 at the bench's shapes, 31.03 waves
of 132 SMs. This times fad_det's backward and SDPA cuDNN's (both layouts) on shapes whose grid
fills its last wave (H 17: 32.97 waves; H 33: 64.00) or not (H 16, H 32), with bench_bwd's
protocol (two turns of 2 + 5 calls each):

    PYTHONPATH=. python3 dev/probe_bwd_last_wave.py
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import torch  # noqa: E402

import bench_bwd  # noqa: E402
import common  # noqa: E402
from common import Config  # noqa: E402

impls = common.make_impls(names=["fad_det", "sdpa_cudnn", "sdpa_cudnn_bhld"])
dev = torch.device("cuda")
shapes = [(4, 8192, 16), (4, 8192, 17), (4, 8192, 33), (4, 8192, 32), (16, 2048, 16), (16, 2048, 17)]
for causal in (False, True):
    for B, L, H in shapes:
        cfg = Config("bf16", B, L, L, H, H, 128, causal)
        res = {}
        for rec in bench_bwd.measure_bwd_rounds(impls, cfg, dev, 5, 2, 2):
            if rec.get("tflops"):
                res[rec["impl"]] = rec["tflops"]
        det = res.get("fad_det", 0.0)
        cud = max(res.get("sdpa_cudnn", 0.0), res.get("sdpa_cudnn_bhld", 0.0))
        ctas = B * H * L // 128
        print(f"B{B} L{L} H{H} causal={causal} ctas={ctas} waves={ctas / 132:.2f} det={det:.1f} "
              f"cudnn={cud:.1f} ratio={det / cud if cud else 0:.3f}", flush=True)
