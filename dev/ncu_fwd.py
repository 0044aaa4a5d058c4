# ncu_fwd.py: One call of each forward implementation under Nsight Compute. Verdict: it showed the forward's gap to cuDNN is tensor-pipe idle time, not more work.
"""One call of each forward implementation inside a profiler range, for Nsight Compute:

    ncu --clock-control none --profile-from-start off --section SpeedOfLight \
        --section MemoryWorkloadAnalysis --section WarpStateStats python3 dev/ncu_fwd.py

(dev/device_all.sh's `ncu` stage). Cases: prefill B8 L4k H16 D128 non-causal (flash_attn_det
deterministic mode, SDPA flash, SDPA cuDNN) and decode B1 L8k Hq32/Hkv8 D128 (flash_attn_det).
Each call is warmed up twice outside the range, so ncu sees only the steady-state kernels.
`python3 dev/ncu_fwd.py detfast D L B H [causal] [HK]` profiles instead flash_attn_det in
deterministic and in fast mode on one prefill shape (non-causal unless `causal`; HK key/value heads
for GQA, H by default), and with PEER=cudnn SDPA cuDNN on it too (enable_gqa where HK < H);
`python3 dev/ncu_fwd.py decode [B L]` only the decode call (B1 L8k by default), in
deterministic and fast mode, beside SDPA cuDNN's on the same cache;
`python3 dev/ncu_fwd.py dropout D L B H` one forward + backward at dropout_p 0 and at 0.1
(deterministic mode, non-causal), to see where dropout's cost goes in each kernel.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flash_attn_det as fad


def profiled(tag, fn):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    print(f"== {tag}", flush=True)
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def det_vs_fast(D, L, B, H, causal=False, HK=None):
    HK = HK or H
    q = torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(B, L, HK, D, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    tag = f"prefill D{D} L{L} B{B} H{H}/{HK}{' causal' if causal else ''}"
    for det in (True, False):
        fad.set_deterministic_mode(det)
        profiled(f"{tag} {'det' if det else 'fast'}", lambda: fad.flash_attn_func(q, k, v, causal=causal))
    if os.environ.get("PEER") == "cudnn":  # SDPA cuDNN on the same shape, in its own (B, H, L, D) layout
        qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            profiled(f"{tag} sdpa cudnn", lambda: F.scaled_dot_product_attention(
                qt, kt, vt, is_causal=causal, enable_gqa=HK < H))


def dropout(D, L, B, H):
    fad.set_deterministic_mode(True)
    q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    g = torch.randn_like(q)
    for p in (0.0, 0.1):
        profiled(f"fwd+bwd D{D} L{L} B{B} H{H} dropout_p={p}",
                 lambda: fad.flash_attn_func(q, k, v, dropout_p=p).backward(g))


def main():
    if sys.argv[1:2] == ["detfast"]:
        rest = sys.argv[6:]
        causal = "causal" in rest
        hk = [int(x) for x in rest if x.isdigit()]
        return det_vs_fast(*(int(x) for x in sys.argv[2:6]), causal=causal, HK=hk[0] if hk else None)
    if sys.argv[1:2] == ["dropout"]:
        return dropout(*(int(x) for x in sys.argv[2:6]))
    dev, bf = "cuda", torch.bfloat16
    fad.set_deterministic_mode(True)
    if sys.argv[1:2] == ["decode"]:
        return decode(128, *(int(x) for x in sys.argv[2:4]))
    B, L, H, D = 8, 4096, 16, 128
    q = torch.randn(B, L, H, D, device=dev, dtype=bf)
    k, v = torch.randn_like(q), torch.randn_like(q)
    profiled("prefill D128 L4k det", lambda: fad.flash_attn_func(q, k, v))
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        with sdpa_kernel(be):
            profiled(f"prefill D128 L4k sdpa {name}", lambda: F.scaled_dot_product_attention(qt, kt, vt))
    decode(D, peers=False)


def decode(D, B=1, L=8192, peers=True):
    """Decode at batch B over caches of L keys: deterministic mode, and with peers fast mode
    (the same kernel on its own split plan) and SDPA cuDNN on the same cache."""
    dev, bf = "cuda", torch.bfloat16
    qd = torch.randn(B, 1, 32, D, device=dev, dtype=bf)
    kc = torch.randn(B, L, 8, D, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    sl = torch.full((B,), L, dtype=torch.int32, device=dev)
    modes = (True, False) if peers else (True,)
    for det in modes:
        fad.set_deterministic_mode(det)
        profiled(f"decode B{B} L{L} {'det' if det else 'fast'}",
                 lambda: fad.flash_attn_with_kvcache(qd, kc, vc, cache_seqlens=sl, causal=True))
    fad.set_deterministic_mode(True)
    if peers:
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            profiled(f"decode B{B} L{L} sdpa cudnn", lambda: F.scaled_dot_product_attention(
                qd.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2), enable_gqa=True))


if __name__ == "__main__":
    main()
