# quick_perf.py: Quick forward timing beside SDPA. Verdict: sanity check only; benchmarks/bench_fwd.py is the harness.
"""Quick forward timing beside SDPA flash/cuDNN (the full harness is benchmarks/bench_fwd.py).

    PYTHONPATH=. python dev/quick_perf.py
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
import torch.nn.functional as F

import flash_attn_det as fad


def bench(fn, iters=30):
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print(torch.cuda.get_device_name(), torch.__version__)
    cfgs = [(8, 4096, 32, 32, 64, False), (32, 1024, 16, 16, 128, False), (32, 1024, 16, 16, 128, True),
            (8, 4096, 16, 16, 128, False), (8, 4096, 16, 16, 128, True), (2, 16384, 16, 16, 128, False),
            (2, 16384, 16, 16, 128, True), (8, 4096, 32, 8, 128, True), (4, 4096, 8, 8, 256, False), (1, 8192, 32, 8, 128, "decode"),
            (64, 8192, 32, 8, 128, "decode")]
    for B, L, H, Hk, D, causal in cfgs:
        decode = causal == "decode"
        Lq = 1 if decode else L
        q = torch.randn(B, Lq, H, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, L, Hk, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn_like(k)
        c = bool(causal) and not decode
        flops = 4 * B * H * Lq * L * D / (2 if c else 1)
        res = {}
        fad.set_deterministic_mode(True)
        res["det"] = bench(lambda: fad.flash_attn_func(q, k, v, causal=c))
        fad.set_deterministic_mode(False)
        res["fast"] = bench(lambda: fad.flash_attn_func(q, k, v, causal=c))
        fad.set_deterministic_mode(True)
        # SDPA on the transposed views models pass, and on contiguous (B, H, L, D) (its best layout)
        views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        contig = tuple(x.contiguous() for x in views)
        for name, be, (qt, kt, vt) in (("flash", SDPBackend.FLASH_ATTENTION, views),
                                       ("cudnn", SDPBackend.CUDNN_ATTENTION, views),
                                       ("cudnn_bhld", SDPBackend.CUDNN_ATTENTION, contig)):
            try:
                with sdpa_kernel(be):
                    res[name] = bench(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=c, enable_gqa=H != Hk))
            except Exception as e:  # noqa: BLE001
                res[name] = float("nan")
        best_cudnn = min(res["cudnn"], res["cudnn_bhld"])
        if decode:
            line = " ".join(f"{n}={t * 1000:.1f}us" for n, t in res.items())
            gb = 2 * B * L * Hk * D * 2 / 1e9
            line += f"  det {gb / res['det'] * 1e3 / 1e3:.2f} TB/s"
        else:
            line = " ".join(f"{n}={flops / t / 1e9:.0f}TF" for n, t in res.items())
        print(f"B{B} L{L} H{H}/{Hk} D{D} {causal}: {line}  det/flash={res['flash'] / res['det']:.2f}x det/cudnn(best layout)={best_cudnn / res['det']:.2f}x")


if __name__ == "__main__":
    main()
