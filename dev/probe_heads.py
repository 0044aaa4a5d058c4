# probe_heads.py: Does the forward's ratio to cuDNN depend on GQA or the head count? Verdict: no; GQA and MHA alike (0.79-0.83x cuDNN at 4k, H100).
"""Does the forward's ratio to cuDNN depend on GQA or on the head count? flash_attn_det
(deterministic) and SDPA cuDNN (contiguous (B, H, L, D), enable_gqa) on bf16 D128 prefill
shapes that differ only in heads: H16/16, H32/32, H32/8 at B8 L4k, and H32/8 at B4 (MHA B8
H16's flops). Same inputs, impls in alternating rounds, median of CUDA-event times.

    PYTHONPATH=. python3 dev/probe_heads.py
"""
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_det as fad
from bench_dropout import timed  # (dev/: n CUDA-event timings of fn)


def main():
    fad.set_deterministic_mode(True)
    print(f"# {torch.cuda.get_device_name()}: bf16 D128 L4096, TFLOP/s (median of 8 rounds x 10 calls)")
    print("| B | H | Hkv | causal | det | cuDNN | det / cuDNN |")
    print("|---|---|---|---|---|---|---|")
    for B, H, Hkv in ((8, 16, 16), (8, 32, 32), (8, 32, 8), (4, 32, 8)):
        for causal in (False, True):
            L, D = 4096, 128
            q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(B, L, Hkv, D, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))

            def det():
                fad.flash_attn_func(q, k, v, causal=causal)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=Hkv != H)

            fns = (det, cudnn)
            for f in fns:
                f(), f()
            res = [[] for _ in fns]
            for _ in range(8):
                for i, f in enumerate(fns):
                    res[i] += timed(f, 10)
            flops = 4 * B * H * L * L * D / (2 if causal else 1)
            tf = [flops / (statistics.median(r) * 1e-3) / 1e12 for r in res]
            print(f"| {B} | {H} | {Hkv} | {causal} | {tf[0]:.1f} | {tf[1]:.1f} | {tf[0] / tf[1]:.2f} |", flush=True)


if __name__ == "__main__":
    main()
