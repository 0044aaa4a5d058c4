# san_decode_runs.py: One sequence's decode with its split CTAs in runs of splits (fwd_decode.cu's kRuns; the combine polling their flags), small enough for compute-sanitizer: bits against the one-CTA schedule, a window, 16 query rows. Verdict: tool.
# python3 dev/san_decode_runs.py [LEN]   (keys, default 20000: 40 splits, runs from 34 on 132 SMs)
import sys
import torch, flash_attn_det as fad
from flash_attn_det.testing import force_schedule
fad.set_deterministic_mode(True)
g = torch.Generator().manual_seed(2)
L = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
H, Hk, D = 32, 8, 128
k = torch.randn(1, L, Hk, D, generator=g).to("cuda", torch.bfloat16)
v = torch.randn(1, L, Hk, D, generator=g).to("cuda", torch.bfloat16)
lens = torch.tensor([L], dtype=torch.int32, device="cuda")
for Sq, kw in ((1, {}), (1, {"window_size": (1500, 0)}), (16, {})):
    q = torch.randn(1, Sq, H, D, generator=g).to("cuda", torch.bfloat16)
    out = {}
    for sched in ("auto", "one_cta"):
        with force_schedule(sched):
            out[sched] = fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True,
                                                     return_softmax_lse=True, **kw)
    torch.cuda.synchronize()
    same = all(torch.equal(a, b) for a, b in zip(out["auto"], out["one_cta"]))
    print(f"Sq {Sq} {kw}: runs == one CTA: {same}, finite: {bool(torch.isfinite(out['auto'][0]).all())}")
