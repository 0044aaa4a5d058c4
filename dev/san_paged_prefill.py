# san_paged_prefill.py: A paged KV cache's prefill chunk on D128's warp-specialized kernel, small enough for compute-sanitizer: bits against the contiguous cache, and a page outside the cache (NaN rows, no hang). Verdict: tool.
# python3 dev/san_paged_prefill.py [PAGE]   (rows a page, default 16; 64 and up: a box a whole tile)
import sys
import torch, flash_attn_det as fad
fad.set_deterministic_mode(True)
g = torch.Generator().manual_seed(1)
B, S, H, Hk, D = 2, 700, 8, 2, 128
page = int(sys.argv[1]) if len(sys.argv) > 1 else 16
k = torch.randn(B, S, Hk, D, generator=g).to("cuda", torch.bfloat16)
v = torch.randn(B, S, Hk, D, generator=g).to("cuda", torch.bfloat16)
q = torch.randn(B, 100, H, D, generator=g).to("cuda", torch.bfloat16)
per = (S + page - 1) // page
order = torch.randperm(B * per, generator=g).reshape(B, per)
kc = torch.randn(B * per, page, Hk, D, generator=g).to("cuda", torch.bfloat16)
vc = torch.randn(B * per, page, Hk, D, generator=g).to("cuda", torch.bfloat16)
for b in range(B):
    for j in range(per):
        n = min(page, S - j * page)
        kc[order[b, j], :n] = k[b, j * page:j * page + n]
        vc[order[b, j], :n] = v[b, j * page:j * page + n]
bt = order.to(torch.int32).cuda()
lens = torch.tensor([700, 333], dtype=torch.int32, device="cuda")
a = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, causal=True)
c = fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
torch.cuda.synchronize()
print("paged == contiguous:", torch.equal(a, c))
# a page outside the cache in the middle of sequence 1 (whole tiles' 16-row groups, or whole
# tiles: the copy engine's boxes outside the map): its rows that reach it NaN, sequence 0
# finite, no hang
bt2 = bt.clone()
bt2[1, min(5, per // 2)] = B * per + 7
d = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=torch.tensor([700, 700], dtype=torch.int32, device="cuda"),
                                block_table=bt2, causal=True)
torch.cuda.synchronize()
print("bad page: seq 0 finite", bool(torch.isfinite(d[0]).all()), "seq 1 NaN rows", int(d[1].isnan().any(-1).any(-1).sum()), "of", d.shape[1])
