# probe_kernels.py: Per-kernel device time of a few calls. Verdict: tool, no verdict of its own.
"""Per-kernel device time of a few calls (torch.profiler), to see where a call's time goes.

    PYTHONPATH=. python3 dev/probe_kernels.py            # decode B1 8k and prefill D128 4k
    PYTHONPATH=. python3 dev/probe_kernels.py --prefill-only --iters 1   # one call, few kernels
    PYTHONPATH=. python3 dev/probe_kernels.py --decode-only --decode 32768 --batch 1,8
        # decode: deterministic, fast mode and SDPA cuDNN per length and batch
The combine kernel is launched early (PDL): its span includes the wait for the attention
kernel's last CTAs, so per-call sums count that overlap twice.
(For Nsight Compute use dev/ncu_fwd.py: it marks a profiler range and runs the SDPA peers too.)

Prints, per case and implementation, each kernel's name and its mean duration over the calls.
"""
import argparse
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import ProfilerActivity, profile

import flash_attn_det as fad


def kernel_times(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    acc = defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            acc[e.name].append(e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total)
    return {n: sum(v) / len(v) for n, v in acc.items()}


def show(tag, times):
    tot = sum(times.values())
    print(f"{tag}: {tot:.1f} us in {len(times)} kernels")
    for n, t in sorted(times.items(), key=lambda kv: -kv[1]):
        print(f"    {t:8.1f} us  {n[:110]}")


def decode(B, L, iters, H=32, Hk=8, D=128):
    dev, bf = "cuda", torch.bfloat16
    q = torch.randn(B, 1, H, D, device=dev, dtype=bf)
    kc = torch.randn(B, L, Hk, D, device=dev, dtype=bf)
    vc = torch.randn_like(kc)
    sl = torch.full((B,), L, dtype=torch.int32, device=dev)
    call = lambda: fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=sl, causal=True)  # noqa: E731
    for det in (True, False):
        fad.set_deterministic_mode(det)
        show(f"decode B{B} L{L} Hq{H}/{Hk} D{D} {'det' if det else 'fast'}", kernel_times(call, iters))
    fad.set_deterministic_mode(True)
    qt, kt, vt = q.transpose(1, 2), kc.transpose(1, 2), vc.transpose(1, 2)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        show(f"decode B{B} L{L} sdpa cudnn",
             kernel_times(lambda: F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True), iters))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--prefill-only", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--decode-only", action="store_true")
    ap.add_argument("--decode", default="8192", help="decode cache lengths, comma list")
    ap.add_argument("--batch", default="1", help="decode batch sizes, comma list")
    args = ap.parse_args()
    dev, bf = "cuda", torch.bfloat16
    fad.set_deterministic_mode(True)
    if not args.prefill_only:
        for L in (int(x) for x in args.decode.split(",")):
            for B in (int(x) for x in args.batch.split(",")):
                decode(B, L, args.iters)
        if args.decode_only:
            return
    B, L, H, D = 8, 4096, 16, 128
    q = torch.randn(B, L, H, D, device=dev, dtype=bf)
    k, v = torch.randn_like(q), torch.randn_like(q)
    show("prefill B8 L4k H16 D128 det", kernel_times(lambda: fad.flash_attn_func(q, k, v), args.iters))
    if args.prefill_only:
        return
    fad.set_deterministic_mode(False)
    show("prefill B8 L4k H16 D128 fast", kernel_times(lambda: fad.flash_attn_func(q, k, v), args.iters))
    fad.set_deterministic_mode(True)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        show("prefill sdpa flash", kernel_times(lambda: F.scaled_dot_product_attention(qt, kt, vt), args.iters))


if __name__ == "__main__":
    main()
