# sanitize_gpu.py: One small call of every CUDA kernel variant, for compute-sanitizer. Verdict: clean under memcheck, racecheck, initcheck and synccheck (H100).
"""One small call of every CUDA kernel variant, for compute-sanitizer (dev/sanitize_gpu.sh runs
it under memcheck, racecheck, initcheck and synccheck). Sizes are small so that racecheck's
shared-memory tracking finishes in minutes; each shape still crosses tile, split and page
boundaries. Every output is checked finite, so a variant that silently did nothing shows up.

Variants: the prefill kernel's wgmma variants (D64 one warpgroup, D128 warp-specialized) and its
mma.sync one (softcap / ALiBi, and FLASH_ATTN_DET_WGMMA=0 runs everything on mma.sync), the packed
decode kernel on a contiguous and a paged cache, the combine (CTA-per-split schedule), the
append + rotary step, varlen, and the backward (dK/dV, dQ, dsum; wgmma and mma.sync; dropout).
    python3 dev/sanitize_gpu.py [bwd | ws]
bwd: the backward's calls alone (with FLASH_ATTN_DET_BWD_DQ=reduce: the five-product kernels, the
dQ adds' turns crossing several key blocks in the GQA calls).
ws: the warp-specialized forward alone, at lengths that reach each of its shapes -- D64 lean, D128
narrow and three consumers, D256 main and long --, plain and causal, and a varlen batch whose
sequences end inside 16-row warp slices (the copy engine's output stores beside the threads').
"""
import sys

import torch

import flash_attn_det as fad
from flash_attn_det.testing import force_schedule

dev, bf = "cuda", torch.bfloat16
g = torch.Generator(device=dev).manual_seed(0)


def rnd(*shape, dtype=bf):
    return torch.randn(*shape, device=dev, dtype=dtype, generator=g)


def finite(name, *ts):
    torch.cuda.synchronize()
    for t in ts:
        assert torch.isfinite(t).all(), name
    print(f"ok  {name}", flush=True)


def prefill_and_backward():
    for D in (64, 128, 256):
        for kw in ({}, {"causal": True}, {"softcap": 8.0}, {"causal": True, "window_size": (40, 0)}):
            q, k, v = (rnd(2, 130, 4, D).requires_grad_() for _ in range(3))
            out = fad.flash_attn_func(q, k, v, **kw)
            out.float().square().sum().backward()
            finite(f"fwd+bwd D{D} {kw}", out, q.grad, k.grad, v.grad)
    q, k, v = (rnd(1, 200, 4, 64).requires_grad_() for _ in range(3))
    slopes = torch.rand(4, device=dev, generator=g)
    out = fad.flash_attn_func(q, k, v, causal=True, alibi_slopes=slopes)
    out.float().sum().backward()
    finite("fwd+bwd alibi", out, q.grad)
    for causal in (False, True):  # GQA 8/2, five key blocks: every dQ tile waits for its turns
        q, k, v = rnd(2, 600, 8, 128), rnd(2, 600, 2, 128), rnd(2, 600, 2, 128)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = fad.flash_attn_func(q, k, v, causal=causal)
        out.float().square().sum().backward()
        finite(f"fwd+bwd gqa 600, causal={causal}", out, q.grad, k.grad, v.grad)
    for D, Hk in ((64, 4), (128, 2)):  # dropout (the five-product kernel keeps one dQ buffer)
        q, k, v = rnd(2, 300, 4, D), rnd(2, 300, Hk, D), rnd(2, 300, Hk, D)
        q, k, v = (t.requires_grad_() for t in (q, k, v))
        out = fad.flash_attn_func(q, k, v, causal=True, dropout_p=0.2)
        out.float().square().sum().backward()
        finite(f"fwd+bwd dropout D{D} heads 4/{Hk}", out, q.grad, k.grad, v.grad)
    if sys.argv[1:2] == ["bwd"]:
        return
    # D128 past the narrow shape's 1024 keys: the three-consumer kernel (R and both halves of a
    # K/V stage in shared memory), three splits a row
    for kw in ({}, {"causal": True}, {"dropout_p": 0.2}):
        q, k, v = rnd(1, 1300, 2, 128), rnd(1, 1300, 2, 128), rnd(1, 1300, 2, 128)
        finite(f"fwd D128 1300 keys {kw}", fad.flash_attn_func(q, k, v, **kw))
    q, k, v = rnd(1, 1200, 8, 128), rnd(1, 1200, 2, 128), rnd(1, 1200, 2, 128)
    finite("fwd gqa D128 1200 keys", fad.flash_attn_func(q, k, v, causal=True))
    # D64 from 2048 keys: the four-consumer kernel (R in shared memory, folded as float4s)
    for kw in ({}, {"causal": True}, {"dropout_p": 0.2}):
        q, k, v = rnd(1, 2100, 2, 64), rnd(1, 2100, 2, 64), rnd(1, 2100, 2, 64)
        finite(f"fwd D64 2100 keys {kw}", fad.flash_attn_func(q, k, v, **kw))
    # GQA and a long enough row for several splits on the CTA-per-split schedule
    fad.set_deterministic_mode(True, split_size=128)
    for sched in ("one_cta", "cta_per_split"):
        with force_schedule(sched):
            q, k, v = rnd(1, 700, 8, 128), rnd(1, 700, 2, 128), rnd(1, 700, 2, 128)
            finite(f"fwd gqa 700 keys, {sched}", fad.flash_attn_func(q, k, v, causal=True))
    fad.set_deterministic_mode(True)


def varlen():
    lens = [37, 1, 150, 64]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device=dev)
    q, k, v = (rnd(sum(lens), 4, 64).requires_grad_() for _ in range(3))
    out = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    out.float().sum().backward()
    finite("varlen fwd+bwd", out, q.grad, k.grad, v.grad)


def decode():
    B, cap, H, Hk, D = 3, 640, 8, 2, 128
    kc, vc = rnd(B, cap, Hk, D), rnd(B, cap, Hk, D)
    lens = torch.tensor([600, 5, 333], dtype=torch.int32, device=dev)
    fad.set_deterministic_mode(True, split_size=128)
    for sched in ("one_cta", "cta_per_split"):
        with force_schedule(sched):
            for sq in (1, 4):
                out = fad.flash_attn_with_kvcache(rnd(B, sq, H, D), kc, vc, cache_seqlens=lens,
                                                  causal=True)
                finite(f"decode Sq{sq} {sched}", out)
            # paged: 64-row pages in shuffled blocks
            page = 64
            nb = B * cap // page
            table = torch.randperm(nb, device=dev, generator=g).reshape(B, cap // page).to(torch.int32)
            kp, vp = rnd(nb, page, Hk, D), rnd(nb, page, Hk, D)
            out = fad.flash_attn_with_kvcache(rnd(B, 1, H, D), kp, vp, cache_seqlens=lens,
                                              block_table=table, causal=True, softcap=5.0)
            finite(f"paged decode {sched}", out)
    # append + rotary, then attention over the grown cache
    cos, sin = (torch.rand(cap, D // 2, device=dev, generator=g).to(bf) for _ in range(2))
    lens2 = lens.clone() - 4
    out = fad.flash_attn_with_kvcache(rnd(B, 2, H, D), kc, vc, k=rnd(B, 2, Hk, D),
                                      v=rnd(B, 2, Hk, D), rotary_cos=cos, rotary_sin=sin,
                                      cache_seqlens=lens2, causal=True)
    finite("append + rotary + attention", out, kc, vc)
    fad.set_deterministic_mode(True)


def forward_ws():
    fad.set_deterministic_mode(True)
    for D, L in ((128, 1000), (128, 1300), (64, 2100), (64, 9000), (256, 1300), (256, 4200)):
        for causal in (False, True):
            q, k, v = rnd(1, L, 2, D), rnd(1, L, 2, D), rnd(1, L, 2, D)
            finite(f"fwd ws D{D} L{L} causal={causal}", fad.flash_attn_func(q, k, v, causal=causal))
    lens = [1300, 37, 1100, 250]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device=dev, dtype=torch.int32)
    q, k, v = rnd(sum(lens), 4, 128), rnd(sum(lens), 2, 128), rnd(sum(lens), 2, 128)
    finite("fwd ws varlen D128", fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True))


if __name__ == "__main__":
    if sys.argv[1:2] == ["ws"]:
        forward_ws()
        print("all variants ran")
        sys.exit(0)
    prefill_and_backward()
    varlen()
    if sys.argv[1:2] == ["bwd"]:
        print("all variants ran")
        sys.exit(0)
    decode()
    fad.set_deterministic_mode(False)
    q, k, v = rnd(1, 300, 4, 128), rnd(1, 300, 4, 128), rnd(1, 300, 4, 128)
    finite("fast mode fwd", fad.flash_attn_func(q, k, v, causal=True))
    print("all variants ran")
