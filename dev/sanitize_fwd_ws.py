# sanitize_fwd_ws.py: Small calls of every warp-specialized forward shape, for compute-sanitizer. Verdict: racecheck, synccheck and memcheck clean on a309f7a's build (H200).
"""D64 (the lean shape: main's starts past 16k keys), D128 (narrow, three consumers), D256 (main, long), plain and causal, and a varlen
batch whose sequences end inside 16-row warp slices (threads' stores beside the copy engine's):

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 FLASH_ATTN_DET_WGMMA=force compute-sanitizer --tool racecheck \
        python3 dev/sanitize_fwd_ws.py
"""
import torch

import flash_attn_det as fad

fad.set_deterministic_mode(True)
g = torch.Generator(device="cuda").manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=g)


for D, L in ((128, 1000), (128, 1300), (64, 2100), (64, 9000), (256, 1300), (256, 4200)):
    for causal in (False, True):
        q, k, v = rnd(1, L, 2, D), rnd(1, L, 2, D), rnd(1, L, 2, D)
        o = fad.flash_attn_func(q, k, v, causal=causal)
        torch.cuda.synchronize()
        assert torch.isfinite(o).all()
        print(f"ok D{D} L{L} causal={causal}", flush=True)
lens = [1300, 37, 1100, 250]
cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
T = sum(lens)
q, k, v = rnd(T, 4, 128), rnd(T, 2, 128), rnd(T, 2, 128)
o = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
torch.cuda.synchronize()
assert torch.isfinite(o).all()
print("ok varlen D128", flush=True)
print("all variants ran")
