"""flash_attn_with_kvcache (read path: cache_seqlens, cache_batch_idx, cache_leftpad), on the
CPU path (CI) and the GPU. The contract clauses that matter for serving: a token's bits from a
one-token decode over a cache equal its row of a causal prefill, whatever the cache capacity,
the cache entry, the left padding or the other sequences in the batch."""
import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import _C
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import DEVICES, HAS_CUDA, assert_close, assert_lse_close, make_gen, randn



def i32(values, device):
    return torch.tensor(values, dtype=torch.int32, device=device)


def place(gen, seqs_k, seqs_v, capacity, entries, lefts, n_entries, dtype, device):
    """A random cache (garbage everywhere) with sequence i written at entry entries[i],
    rows [lefts[i], lefts[i] + len)."""
    Hk, D = seqs_k[0].shape[-2:]
    kc = randn(gen, (n_entries, capacity, Hk, D), dtype, device, scale=3.0)
    vc = randn(gen, (n_entries, capacity, Hk, D), dtype, device, scale=3.0)
    for k, v, e, l in zip(seqs_k, seqs_v, entries, lefts):
        kc[e, l:l + k.shape[0]] = k
        vc[e, l:l + k.shape[0]] = v
    return kc, vc


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kw", [{"causal": True}, {"causal": True, "window_size": (100, 0)},
                                {"causal": True, "softcap": 5.0}])
def test_decode_equals_prefill_rows_any_cache_layout(device, kw):
    gen = make_gen(41)
    T, H, Hk, D = 700, 8, 2, 64 if device == "cpu" else 128
    q, k, v = (randn(gen, (1, T, h, D), torch.bfloat16, device) for h in (H, Hk, Hk))
    full = fad.flash_attn_func(q, k, v, **kw)
    for capacity, entry, left in ((T, 0, 0), (2000, 3, 0), (1500, 1, 333)):
        kc, vc = place(gen, [k[0]], [v[0]], capacity, [entry], [left], 4, torch.bfloat16, device)
        for t in (0, 1, 127, 128, 511, 512, 699):
            out = fad.flash_attn_with_kvcache(q[:, t:t + 1], kc, vc,
                                              cache_seqlens=i32([left + t + 1], device),
                                              cache_batch_idx=i32([entry], device),
                                              cache_leftpad=i32([left], device), **kw)
            assert torch.equal(out[0, 0], full[0, t]), \
                f"token {t}, capacity {capacity}, entry {entry}, leftpad {left}: bits differ"
        # A chunk of queries (chunked prefill) over the same cache.
        out = fad.flash_attn_with_kvcache(q[:, 300:420], kc, vc,
                                          cache_seqlens=i32([left + 420], device),
                                          cache_batch_idx=i32([entry], device),
                                          cache_leftpad=i32([left], device), **kw)
        assert torch.equal(out[0], full[0, 300:420])


@pytest.mark.parametrize("device", DEVICES)
def test_batch_of_decodes_matches_reference_and_single_calls(device):
    gen = make_gen(42)
    lens, H, Hk, D = [1, 40, 700, 129], 4, 1, 64
    ks = [randn(gen, (n, Hk, D), torch.float16, device) for n in lens]
    vs = [randn(gen, (n, Hk, D), torch.float16, device) for n in lens]
    entries, lefts = [2, 0, 3, 1], [5, 0, 100, 7]
    kc, vc = place(gen, ks, vs, 1000, entries, lefts, 5, torch.float16, device)
    q = randn(gen, (4, 1, H, D), torch.float16, device)
    alibi = (torch.rand((4, H), generator=gen) * 0.1).to(device)
    seqlens = [l + n for l, n in zip(lefts, lens)]
    out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32(seqlens, device),
                                           cache_batch_idx=i32(entries, device),
                                           cache_leftpad=i32(lefts, device), causal=True,
                                           alibi_slopes=alibi, return_softmax_lse=True)
    assert lse.shape == (4, H, 1)
    for b in range(4):
        kb, vb = ks[b][None], vs[b][None]
        alone = fad.flash_attn_func(q[b:b + 1], kb, vb, causal=True, alibi_slopes=alibi[b],
                                    return_attn_probs=True)
        assert torch.equal(out[b], alone[0][0]) and torch.equal(lse[b], alone[1][0])
        ref, ref_lse = attention_ref(q[b:b + 1], kb, vb, causal=True, alibi_slopes=alibi[b])
        assert_close(out[b:b + 1], ref, torch.float16, atol=2 * 2.0 ** -11)
        assert_lse_close(lse[b:b + 1], ref_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_defaults_and_int_seqlens(device):
    gen = make_gen(43)
    q = randn(gen, (2, 3, 2, 32), torch.bfloat16, device)
    kc, vc = (randn(gen, (2, 50, 2, 32), torch.bfloat16, device) for _ in range(2))
    ref = fad.flash_attn_func(q, kc, vc)
    assert torch.equal(fad.flash_attn_with_kvcache(q, kc, vc), ref)  # no cache_seqlens: all rows
    part = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=20)
    assert torch.equal(part, fad.flash_attn_func(q, kc[:, :20], vc[:, :20]))


@pytest.mark.parametrize("device", DEVICES)
def test_kvcache_bad_input(device):
    gen = make_gen(44)
    q = randn(gen, (2, 1, 2, 32), torch.bfloat16, device)
    kc, vc = (randn(gen, (2, 50, 2, 32), torch.bfloat16, device) for _ in range(2))
    call = fad.flash_attn_with_kvcache
    with pytest.raises(ValueError, match="^block_table:"):
        call(q, kc, vc, cache_seqlens=5, block_table=i32([[0]], device))  # batch 1 != 2
    with pytest.raises(TypeError, match="^cache_seqlens:"):
        call(q, kc, vc, cache_seqlens=torch.tensor([5.0, 5.0], device=device))  # (int64: taken)
    with pytest.raises(ValueError, match="^cache_batch_idx:"):
        call(q, kc, vc, cache_seqlens=5, cache_batch_idx=i32([0], device))  # wrong length
    with pytest.raises(ValueError, match="^v_cache:"):
        call(q, kc, vc[:, :40], cache_seqlens=5)


def test_kvcache_out_of_range_on_cpu_raises_and_writes_nothing():
    gen = make_gen(45)
    q = randn(gen, (2, 1, 2, 32), torch.bfloat16)
    kc, vc = (randn(gen, (2, 50, 2, 32), torch.bfloat16) for _ in range(2))
    cases = [(i32([5, 51], "cpu"), None, None, "^cache_seqlens:"),
             (i32([5, 5], "cpu"), i32([0, 2], "cpu"), None, "^cache_batch_idx:"),
             (i32([5, 5], "cpu"), None, i32([0, 6], "cpu"), "^cache_leftpad:")]
    for seqlens, idx, left, match in cases:
        out = torch.full_like(q, 7.0)
        lse = torch.full((2, 2, 1), 7.0)
        dl = torch.utils.dlpack.to_dlpack
        with pytest.raises(ValueError, match=match):
            _C.fwd_kvcache(dl(q), dl(kc), dl(vc), dl(out), dl(lse), dl(seqlens),
                           None if idx is None else dl(idx), None if left is None else dl(left),
                           None, None, None, 0.17, 0.0, -1, -1, 0, 1, 512, 0, 0)
        assert (out == 7).all() and (lse == 7).all(), "a refused call wrote its outputs"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_kvcache_schedules_bit_equal_and_bad_entry_is_nan_gpu():
    gen = make_gen(46)
    q = randn(gen, (3, 1, 32, 128), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (3, 8192, 8, 128), torch.bfloat16, "cuda") for _ in range(2))
    seqlens = i32([8192, 5000, 1], "cuda")
    outs = []
    for name in ("auto", "one_cta", "cta_per_split"):
        with force_schedule(name):
            outs.append(fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens))
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    bad = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([8192, 9000, 1], "cuda"))
    torch.cuda.synchronize()
    assert bad[1].isnan().all(), "a sequence past the cache must come back NaN, not garbage"
    assert torch.equal(bad[0], outs[0][0]) and torch.equal(bad[2], outs[0][2])


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("cap", [1000, 8192, 8193, 20000])
def test_decode_split_folds_bit_equal_gpu(cap):
    """A decode step's split partials folded by the combine kernel (CTA-per-split) and by
    fold_split inside one CTA give the same bits: 2, 16, 17 and 40 splits (the combine
    fetches 16 splits per round trip, so 17 and 40 cross its batches)."""
    gen = make_gen(61)
    q = randn(gen, (2, 1, 16, 64), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (2, cap, 4, 64), torch.bfloat16, "cuda") for _ in range(2))
    lens = i32([cap, cap // 2 + 1], "cuda")
    res = {}
    for sched in ("one_cta", "cta_per_split"):
        with force_schedule(sched):
            res[sched] = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens,
                                                     return_softmax_lse=True)
    (a, a_lse), (b, b_lse) = res["one_cta"], res["cta_per_split"]
    assert torch.isfinite(a).all() and torch.equal(a, b) and torch.equal(a_lse, b_lse)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("Sq", [1, 3, 40])  # the packed kernel (Sq <= 16) and the prefill kernel
@pytest.mark.parametrize("sched", ["one_cta", "cta_per_split"])
def test_bad_sequence_rows_are_nan_without_prefill_gpu(Sq, sched):
    """The outputs are allocated uninitialised: every row of a sequence past its cache, or of
    a cache entry that does not exist, is written NaN by the kernels (out and lse), under
    either schedule, and the other sequences keep their bits."""
    gen = make_gen(50)
    q = randn(gen, (4, Sq, 8, 64), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (3, 700, 2, 64), torch.bfloat16, "cuda") for _ in range(2))
    good = dict(cache_seqlens=i32([700, 300, 64, 500], "cuda"), cache_batch_idx=i32([0, 1, 2, 1], "cuda"))
    bad = dict(cache_seqlens=i32([700, 800, 64, 500], "cuda"), cache_batch_idx=i32([0, 1, 2, 5], "cuda"))
    with force_schedule(sched):
        ref, ref_lse = fad.flash_attn_with_kvcache(q, kc, vc, causal=True, return_softmax_lse=True,
                                                   **good)
        for _ in range(3):  # reuse of the allocator's blocks: stale values must not survive
            out, lse = fad.flash_attn_with_kvcache(q, kc, vc, causal=True,
                                                   return_softmax_lse=True, **bad)
    torch.cuda.synchronize()
    for b in (1, 3):
        assert out[b].isnan().all() and lse[b].isnan().all(), f"sequence {b}: not all NaN"
    for b in (0, 2):
        assert torch.equal(out[b], ref[b]) and torch.equal(lse[b], ref_lse[b])


# --- appending new keys and rotary --------------------------------------------------

def rotary_ref(x, cos, sin, pos, interleaved):
    """float64 rotary, written independently of the library."""
    x = x.double()
    rd = 2 * cos.shape[1]
    c, s = cos.double()[pos][:, :, None], sin.double()[pos][:, :, None]
    out = x.clone()
    for j in range(rd // 2):
        i0, i1 = (2 * j, 2 * j + 1) if interleaved else (j, j + rd // 2)
        out[..., i0] = x[..., i0] * c[..., j] - x[..., i1] * s[..., j]
        out[..., i1] = x[..., i0] * s[..., j] + x[..., i1] * c[..., j]
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_decode_with_append_and_rotary_equals_prefill(device, interleaved):
    from flash_attn_det.interface import _rotary
    gen = make_gen(47)
    T, H, Hk, D, rd = 150, 4, 2, 64, 32
    q, k, v = (randn(gen, (2, T, h, D), torch.bfloat16, device) for h in (H, Hk, Hk))
    theta = torch.rand((T + 10, rd // 2), generator=gen, dtype=torch.float64) * 6.28
    cos, sin = theta.cos().to(torch.bfloat16).to(device), theta.sin().to(torch.bfloat16).to(device)
    entries, left = i32([2, 0], device), i32([7, 0], device)
    # rotary positions are absolute cache rows, leftpad included (flash_attn 2.8.3's kernel and
    # its test's reference: seqlen_offsets=cache_seqlens): sequence 0's token t sits at row 7 + t
    pos = torch.arange(T, device=device)[None] + left.long()[:, None]
    q_rot, k_rot = _rotary(q, cos, sin, pos, interleaved), _rotary(k, cos, sin, pos, interleaved)
    ref_rot = rotary_ref(k, cos, sin, pos, interleaved)
    assert (k_rot.double() - ref_rot).abs().max() < 2 ** -6 * ref_rot.abs().max()
    full = fad.flash_attn_func(q_rot, k_rot, v, causal=True)
    kc = torch.zeros(3, 256, Hk, D, dtype=torch.bfloat16, device=device)
    vc = torch.zeros_like(kc)
    step = 1 if device == "cpu" else 3  # on the GPU, chunks of 3 new tokens per call
    for t in range(0, T, step):
        n = min(step, T - t)
        out = fad.flash_attn_with_kvcache(q[:, t:t + n], kc, vc, k=k[:, t:t + n], v=v[:, t:t + n],
                                          rotary_cos=cos, rotary_sin=sin,
                                          rotary_interleaved=interleaved,
                                          cache_seqlens=left + t, cache_batch_idx=entries,
                                          cache_leftpad=left, causal=True)
        assert torch.equal(out, full[:, t:t + n]), f"tokens [{t}, {t + n}): bits differ"
    assert torch.equal(kc[2, 7:7 + T], k_rot[0]) and torch.equal(vc[0, :T], v[1])


def test_append_past_capacity_on_cpu_raises_and_writes_nothing():
    gen = make_gen(48)
    q = randn(gen, (1, 1, 2, 32), torch.bfloat16)
    k = randn(gen, (1, 2, 2, 32), torch.bfloat16)
    kc, vc = torch.zeros(1, 10, 2, 32, dtype=torch.bfloat16), torch.zeros(1, 10, 2, 32,
                                                                            dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^cache_seqlens:"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=k, cache_seqlens=9)
    assert not kc.any() and not vc.any()
    cos = torch.ones(5, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^rotary_cos:"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=k, rotary_cos=cos, rotary_sin=cos,
                                    cache_seqlens=4)
    assert not kc.any()
    with pytest.raises(ValueError, match="^k, v:"):
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, cache_seqlens=1)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_append_past_capacity_gpu_is_nan():
    gen = make_gen(49)
    q = randn(gen, (2, 1, 2, 32), torch.bfloat16, "cuda")
    k = randn(gen, (2, 2, 2, 32), torch.bfloat16, "cuda")
    kc, vc = (torch.zeros(2, 10, 2, 32, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    out = fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=k, cache_seqlens=i32([3, 9], "cuda"))
    torch.cuda.synchronize()
    assert not out[0].isnan().any() and out[1].isnan().all()


# --- paged KV ---------------------------------------------------------------------------

def to_pages(gen, k, v, page, num_blocks, device):
    """k, v (B, S, Hk, D) scattered over a paged cache in a random block order."""
    B, S = k.shape[:2]
    per = (S + page - 1) // page
    order = torch.randperm(num_blocks, generator=gen)[:B * per].reshape(B, per)
    kc = randn(gen, (num_blocks, page, *k.shape[2:]), k.dtype, device, scale=3.0)
    vc = randn(gen, (num_blocks, page, *k.shape[2:]), k.dtype, device, scale=3.0)
    for b in range(B):
        for j in range(per):
            n = min(page, S - j * page)
            kc[order[b, j], :n] = k[b, j * page:j * page + n]
            vc[order[b, j], :n] = v[b, j * page:j * page + n]
    return kc, vc, order.to(torch.int32).to(device)


@pytest.mark.parametrize("device", DEVICES)
def test_paged_equals_contiguous_any_page_size_and_order(device):
    gen = make_gen(50)
    B, S, H, Hk, D = 2, 300, 4, 2, 64
    q, k, v = (randn(gen, (B, S, h, D), torch.bfloat16, device) for h in (H, Hk, Hk))
    full = fad.flash_attn_func(q, k, v, causal=True)
    lens = i32([300, 171], device)
    for page in (16, 48, 64, 256):
        kc, vc, bt = to_pages(gen, k, v, page, 64, device)
        for t in (0, 170, 299):
            out = fad.flash_attn_with_kvcache(q[:, t:t + 1], kc, vc, cache_seqlens=t + 1,
                                              block_table=bt, causal=True)
            assert torch.equal(out[:, 0], full[:, t]), f"page {page}, token {t}: bits differ"
        out = fad.flash_attn_with_kvcache(q[:, 100:110], kc, vc, cache_seqlens=lens,
                                          block_table=bt, causal=True)
        assert torch.equal(out[0], fad.flash_attn_func(q[:1, 100:110], k[:1], v[:1], causal=True)[0])


@pytest.mark.parametrize("device", DEVICES)
def test_paged_decode_with_append(device):
    gen = make_gen(51)
    T, H, Hk, D, page = 90, 2, 1, 32, 16
    q, k, v = (randn(gen, (1, T, h, D), torch.float16, device) for h in (H, Hk, Hk))
    full = fad.flash_attn_func(q, k, v, causal=True)
    kc = torch.zeros(20, page, Hk, D, dtype=torch.float16, device=device)
    vc = torch.zeros_like(kc)
    bt = i32([[7, 3, 19, 0, 12, 5, 11]], device)
    for t in range(T):
        out = fad.flash_attn_with_kvcache(q[:, t:t + 1], kc, vc, k=k[:, t:t + 1], v=v[:, t:t + 1],
                                          cache_seqlens=t, block_table=bt, causal=True)
        assert torch.equal(out[0, 0], full[0, t])


def test_paged_bad_blocks_on_cpu_raise_and_write_nothing():
    gen = make_gen(52)
    q = randn(gen, (1, 1, 2, 32), torch.bfloat16)
    k = randn(gen, (1, 1, 2, 32), torch.bfloat16)
    kc, vc = torch.zeros(4, 16, 2, 32, dtype=torch.bfloat16), torch.zeros(4, 16, 2, 32,
                                                                           dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^block_table:"):   # needs slot 1 (row 16), which is 9
        fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=k, cache_seqlens=16,
                                    block_table=i32([[0, 9]], "cpu"))
    assert not kc.any()
    with pytest.raises(TypeError, match="^block_table:"):
        fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=1, block_table=torch.zeros(1, 2))
    out = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=16, block_table=i32([[0, -1]], "cpu"))
    assert torch.isfinite(out).all()  # unused slots may hold anything


def test_paged_c_entry_checks_pages_on_cpu():
    """The C entry itself (no Python pre-check) refuses a block outside the cache and a page
    size that is not a multiple of 16, and writes nothing."""
    gen = make_gen(56)
    q = randn(gen, (1, 1, 2, 32), torch.bfloat16)
    dl = torch.utils.dlpack.to_dlpack
    for page, table, match in ((16, [[0, 9]], "^block_table:"), (8, [[0, 1]], "^page_size:")):
        kc, vc = (randn(gen, (4, page, 2, 32), torch.bfloat16) for _ in range(2))
        out, lse = torch.full_like(q, 7.0), torch.full((1, 2, 1), 7.0)
        with pytest.raises(ValueError, match=match):
            _C.fwd_kvcache(dl(q), dl(kc), dl(vc), dl(out), dl(lse), dl(i32([page + 4], "cpu")),
                           None, None, dl(i32(table, "cpu")), None, None, 0.17, 0.0, -1, -1, 0, 1,
                           512, 0, 0)
        assert (out == 7).all() and (lse == 7).all(), "a refused call wrote its outputs"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("page", [16, 48, 64, 256])
@pytest.mark.parametrize("sched", ["one_cta", "cta_per_split"])
def test_paged_in_kernel_equals_contiguous_gpu(page, sched):
    """Pages read in place by both kernels (shuffled blocks, tiles spanning pages) give the
    contiguous cache's bits: decode (packed kernel) and a 40-row chunk (prefill kernel; at
    pages of 64 and 256 rows the warp-specialized one copies a whole tile a box)."""
    gen = make_gen(57 + page)
    B, S, H, Hk, D = 3, 1500, 8, 2, 128
    q, k, v = (randn(gen, (B, S, h, D), torch.bfloat16, "cuda") for h in (H, Hk, Hk))
    kc, vc, bt = to_pages(gen, k, v, page, B * ((S + page - 1) // page) + 5, "cuda")
    lens = i32([1500, 777, 1025], "cuda")
    for Sq in (1, 4, 40):
        for kw in ({"causal": True}, {"causal": True, "window_size": (300, 0)},
                   {"causal": True, "softcap": 6.0}):
            with force_schedule(sched):
                paged, lse_p = fad.flash_attn_with_kvcache(
                    q[:, :Sq], kc, vc, cache_seqlens=lens, block_table=bt,
                    return_softmax_lse=True, **kw)
                contig, lse_c = fad.flash_attn_with_kvcache(
                    q[:, :Sq], k, v, cache_seqlens=lens, return_softmax_lse=True, **kw)
            assert torch.equal(paged, contig) and torch.equal(lse_p, lse_c), f"Sq {Sq}, {kw}"
            assert torch.isfinite(paged).all()


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sched", ["one_cta", "cta_per_split"])
def test_paged_bad_block_gpu_is_nan(sched):
    gen = make_gen(53)
    q = randn(gen, (2, 1, 2, 32), torch.bfloat16, "cuda")
    kc, vc = (randn(gen, (4, 16, 2, 32), torch.bfloat16, "cuda") for _ in range(2))
    with force_schedule(sched):
        out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([20, 20], "cuda"),
                                               block_table=i32([[0, 1], [2, 99]], "cuda"),
                                               return_softmax_lse=True)
    torch.cuda.synchronize()
    assert torch.isfinite(out[0]).all() and out[1].isnan().all()
    assert torch.isfinite(lse[0]).all() and lse[1].isnan().all()


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("page", [16, 64])
def test_paged_prefill_bad_block_gpu_is_nan(page):
    """A prefill chunk (the warp-specialized kernel at D128 reads the pages: whole tiles through
    the copy engine, a box per 16 rows, or per tile at pages of 64) over a cache with a page
    outside it in one sequence: the rows that reach it are NaN, the other sequence's equal the
    contiguous cache's, and the call returns (the box outside the map still completes its
    barrier)."""
    gen = make_gen(58 + page)
    B, S, H, Hk, D = 2, 700, 8, 2, 128
    q = randn(gen, (B, 100, H, D), torch.bfloat16, "cuda")
    k, v = (randn(gen, (B, S, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    kc, vc, bt = to_pages(gen, k, v, page, B * ((S + page - 1) // page), "cuda")
    bt[1, 2] = kc.shape[0] + 7
    lens = i32([S, S], "cuda")
    out = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, block_table=bt, causal=True)
    ref = fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out[0], ref[0])
    assert out[1].isnan().all(), "every row of the chunk sees the bad page (causal, at the cache's end)"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_decode_step_in_cuda_graph_matches_eager():
    """A decode step (append + attention over the cache) captured once and replayed with new
    cache_seqlens and new cache contents gives the eager call's bits at every step."""
    gen = make_gen(54)
    B, H, Hk, D, cap, steps = 3, 8, 2, 128, 2048, 40
    qs = randn(gen, (steps, B, 1, H, D), torch.bfloat16, "cuda")
    ks = randn(gen, (steps, B, 1, Hk, D), torch.bfloat16, "cuda")
    vs = randn(gen, (steps, B, 1, Hk, D), torch.bfloat16, "cuda")
    start = [5, 700, 1500]
    kc0 = randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda")
    vc0 = randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda")

    # eager reference on its own copy of the cache
    kc_e, vc_e = kc0.clone(), vc0.clone()
    eager = []
    for t in range(steps):
        seqlens = i32([s + t for s in start], "cuda")
        eager.append(fad.flash_attn_with_kvcache(qs[t], kc_e, vc_e, k=ks[t], v=vs[t],
                                                 cache_seqlens=seqlens, causal=True))

    kc_g, vc_g = kc0.clone(), vc0.clone()
    q_buf, k_buf, v_buf = qs[0].clone(), ks[0].clone(), vs[0].clone()
    seq_buf = i32(start, "cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the graph, on a scratch cache
        fad.flash_attn_with_kvcache(q_buf, kc_g.clone(), vc_g.clone(), k=k_buf, v=v_buf,
                                    cache_seqlens=seq_buf, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_buf = fad.flash_attn_with_kvcache(q_buf, kc_g, vc_g, k=k_buf, v=v_buf,
                                              cache_seqlens=seq_buf, causal=True)
    for t in range(steps):
        q_buf.copy_(qs[t]), k_buf.copy_(ks[t]), v_buf.copy_(vs[t])
        seq_buf.copy_(i32([s + t for s in start], "cuda"))
        graph.replay()
        assert torch.equal(out_buf, eager[t]), f"step {t}: graph replay differs from eager"
    assert torch.equal(kc_g, kc_e) and torch.equal(vc_g, vc_e)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sched", ["one_cta", "cta_per_split"])
def test_decode_chain_reads_what_the_step_before_wrote_gpu(sched):
    """On sm_90 the decode kernel is launched early (programmatic dependent launch) and must
    wait for the kernel before it before reading anything. Each step here reads as q the
    output the previous step's last kernel just wrote (the combine, or the decode kernel
    itself), and appends into the cache the previous step read, with nothing in between
    on the stream: eager and in a CUDA graph, the chain gives the bits of the same steps
    run one at a time with a synchronize between them."""
    gen = make_gen(57)
    B, H, Hk, D, cap, steps = 2, 8, 2, 128, 4096, 6
    q0 = randn(gen, (B, 1, H, D), torch.bfloat16, "cuda")
    ks = randn(gen, (steps, B, 1, Hk, D), torch.bfloat16, "cuda")
    vs = randn(gen, (steps, B, 1, Hk, D), torch.bfloat16, "cuda")
    kc0 = randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda")
    vc0 = randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda")
    lens = [i32([s + t for s in (3000, 1200)], "cuda") for t in range(steps)]

    def chain(kc, vc, sync):
        q, outs = q0, []
        for t in range(steps):
            q = fad.flash_attn_with_kvcache(q, kc, vc, k=ks[t], v=vs[t], cache_seqlens=lens[t],
                                            causal=True)
            outs.append(q)
            if sync:
                torch.cuda.synchronize()
        return outs

    with force_schedule(sched):
        ref = chain(kc0.clone(), vc0.clone(), True)
        got = chain(kc0.clone(), vc0.clone(), False)
        kc_g, vc_g = kc0.clone(), vc0.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the graph, on scratch caches
            chain(kc0.clone(), vc0.clone(), False)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            graphed = chain(kc_g, vc_g, False)
        graph.replay()
        torch.cuda.synchronize()
    for t in range(steps):
        assert torch.isfinite(ref[t]).all()
        assert torch.equal(got[t], ref[t]), f"eager step {t} differs from the synchronized chain"
        assert torch.equal(graphed[t], ref[t]), f"graph step {t} differs from the synchronized chain"


# --- the packed decode kernel (GQA heads packed into M) vs the prefill kernel ----------
# Query blocks of at most 16 rows run on fwd_packed_kernel (fad_core.c, use_packed_kernel);
# FLASH_ATTN_DET_FWD_KERNEL=packed|prefill pins the kernel, so the same call can be run on
# both. Every row must get the same bits from either, and from a causal prefill.

KERNEL_ENV = "FLASH_ATTN_DET_FWD_KERNEL"


def _decode_kw(kind, H, device, gen):
    return {"causal": {"causal": True},
            "window": {"causal": True, "window_size": (200, 0)},
            "softcap": {"causal": True, "softcap": 7.0},
            "alibi": {"causal": True,
                      "alibi_slopes": (torch.rand((H,), generator=gen) * 0.3 + 0.01).to(device)},
            }[kind]


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("G", [1, 4, 8])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("kind", ["causal", "window", "softcap", "alibi"])
def test_packed_decode_equals_prefill_rows_gpu(monkeypatch, G, D, kind):
    gen = make_gen(60 + G + D)
    T, Hk = 1100, 2
    H = G * Hk
    q, k, v = (randn(gen, (2, T, h, D), torch.bfloat16, "cuda") for h in (H, Hk, Hk))
    kw = _decode_kw(kind, H, "cuda", gen)
    full, full_lse = fad.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2]
    kc, vc = place(gen, [k[0], k[1]], [v[0], v[1]], 1500, [1, 0], [0, 0], 2, torch.bfloat16, "cuda")
    for Sq in (1, 2, 3, 8):
        for t in (Sq - 1, 63, 64, 511, 512, 700, T - 1):
            a = t + 1 - Sq
            if a < 0:
                continue
            results = []
            for kernel in ("packed", "prefill"):
                for sched in ("auto", "one_cta", "cta_per_split"):
                    monkeypatch.setenv(KERNEL_ENV, kernel)
                    with force_schedule(sched):
                        out, lse = fad.flash_attn_with_kvcache(
                            q[:, a:t + 1], kc, vc, cache_seqlens=i32([t + 1, t + 1], "cuda"),
                            cache_batch_idx=i32([1, 0], "cuda"), return_softmax_lse=True, **kw)
                    results.append((kernel, sched, out, lse))
            monkeypatch.delenv(KERNEL_ENV)
            for kernel, sched, out, lse in results:
                what = f"Sq {Sq}, token {t}, {kernel} kernel, {sched}"
                assert torch.equal(out, full[:, a:t + 1]), f"{what}: out bits differ from prefill"
                assert torch.equal(lse, full_lse[:, :, a:t + 1]), f"{what}: lse bits differ"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (300, 20)},
                                {"softcap": 10.0, "causal": True}, {"alibi": True}])
def test_packed_kernel_equals_prefill_kernel_any_shape_gpu(monkeypatch, D, kw):
    """The same call (prefill shapes, not causal too) on both kernels and both schedules."""
    kw = dict(kw)
    gen = make_gen(70 + D)
    B, Sq, Sk, H, Hk = 2, 150, 1300, 8, 2
    q, k, v = (randn(gen, (B, s, h, D), torch.bfloat16, "cuda")
               for s, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = (torch.rand((B, H), generator=gen) * 0.3 + 0.01).cuda()
    ref = None
    for kernel in ("prefill", "packed"):
        for sched in ("one_cta", "cta_per_split"):
            monkeypatch.setenv(KERNEL_ENV, kernel)
            with force_schedule(sched):
                out, lse = fad.flash_attn_func(q, k, v, return_attn_probs=True, **kw)[:2]
            if ref is None:
                ref = (out, lse)
                o64, l64 = attention_ref(q, k, v, **kw)
                assert_close(out, o64, torch.bfloat16, 2.0 ** -7)
                assert_lse_close(lse, l64)
            assert torch.equal(out, ref[0]) and torch.equal(lse, ref[1]), f"{kernel}, {sched}"
    # The last query row alone (Sq = 1 picks the packed kernel by default): bottom-right
    # aligned masks put it at the same key position, so it is the same row.
    monkeypatch.delenv(KERNEL_ENV)
    o1, l1 = fad.flash_attn_func(q[:, -1:], k, v, return_attn_probs=True, **kw)[:2]
    assert torch.equal(o1[:, 0], ref[0][:, -1]) and torch.equal(l1[:, :, 0], ref[1][:, :, -1])


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("sched", ["auto", "one_cta", "cta_per_split"])
def test_packed_decode_batch_invariance_gpu(sched):
    """One sequence decoded alone (B=1) and inside B=16 with other lengths, GQA 32/8, D128."""
    gen = make_gen(80)
    H, Hk, D, cap = 32, 8, 128, 4096
    B = 16
    lens = [int(x) for x in torch.randint(1, cap + 1, (B,), generator=gen)]
    pos, L = 5, 3001
    lens[pos] = L
    kc, vc = (randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    q = randn(gen, (B, 1, H, D), torch.bfloat16, "cuda")
    with force_schedule(sched):
        out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32(lens, "cuda"),
                                               causal=True, return_softmax_lse=True)
        alone, lse1 = fad.flash_attn_with_kvcache(q[pos:pos + 1], kc[pos:pos + 1].clone(),
                                                  vc[pos:pos + 1].clone(),
                                                  cache_seqlens=i32([L], "cuda"), causal=True,
                                                  return_softmax_lse=True)
    assert torch.equal(out[pos], alone[0]) and torch.equal(lse[pos], lse1[0])
    full = fad.flash_attn_func(q[pos:pos + 1], kc[pos:pos + 1, :L], vc[pos:pos + 1, :L])
    assert torch.equal(alone, full)  # one query row, no mask: the whole prefix
    ref, _ = attention_ref(q[pos:pos + 1], kc[pos:pos + 1, :L], vc[pos:pos + 1, :L])
    assert_close(alone, ref, torch.bfloat16, 2.0 ** -7)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kernel", ["packed", "prefill"])
@pytest.mark.parametrize("D", [128, 200])
@pytest.mark.parametrize("paged", [False, True])
def test_packed_many_splits_equal_one_cta_gpu(paged, D, kernel, monkeypatch):
    """The packed kernel at many splits (128-key splits over a 12k cache, 16 row blocks: 1536
    split CTAs, more than the SMs hold at once): the CTA-per-split schedule gives the one-CTA
    schedule's bits and a lone sequence's, for a short sequence in the long cache too, with a
    window, a softcap and 4 query rows, contiguous and paged. The combine streams rows of more
    than 32 splits through shared memory in chunks of 32: 96, 65 and 33 splits here (full
    chunks and partial ones), 1 on the register path; D 200 has two columns a lane, some past
    D. After the packed kernel at one query row and more than 64 splits it polls the split
    CTAs' ready flags, launched while they run (FAD_COMBINE_POLL); after the prefill kernel
    (pinned) it waits for the whole grid."""
    monkeypatch.setenv(KERNEL_ENV, kernel)
    gen = make_gen(90 + paged + D)
    B, H, Hk, cap = 4, 16, 4, 12288
    lens = [12288, 100, 8193, 4097]
    q = randn(gen, (B, 4, H, D), torch.bfloat16, "cuda")
    k, v = (randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    if paged:
        kc, vc, bt = to_pages(gen, k, v, 64, B * cap // 64 + 3, "cuda")
    else:
        kc, vc, bt = k, v, None
    fad.set_deterministic_mode(True, split_size=128)
    for Sq in (1, 4):
        for kw in ({"causal": True}, {"causal": True, "window_size": (700, 0)},
                   {"causal": True, "softcap": 5.0}):
            res = {}
            for sched in ("one_cta", "cta_per_split"):
                with force_schedule(sched):
                    res[sched] = fad.flash_attn_with_kvcache(
                        q[:, :Sq], kc, vc, cache_seqlens=i32(lens, "cuda"), block_table=bt,
                        return_softmax_lse=True, **kw)
            (a, a_lse), (b, b_lse) = res["one_cta"], res["cta_per_split"]
            assert torch.equal(a, b) and torch.equal(a_lse, b_lse), f"Sq {Sq}, {kw}"
            assert torch.isfinite(b).all()
            with force_schedule("cta_per_split"):
                alone = fad.flash_attn_with_kvcache(q[2:3, :Sq], k[2:3], v[2:3],
                                                    cache_seqlens=i32([lens[2]], "cuda"), **kw)
            assert torch.equal(alone[0], b[2]), f"alone, Sq {Sq}, {kw}"
            if Sq == 1 and len(kw) == 1:  # plain causal decode: against float64
                for i in (0, 1):
                    ref, _ = attention_ref(q[i:i + 1, :1], k[i:i + 1, :lens[i]],
                                           v[i:i + 1, :lens[i]])
                    assert_close(b[i:i + 1], ref, torch.bfloat16, 2.0 ** -7)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("B, Sq, cap, lens, kw", [
    (1, 1, 40000, [40000], {}),                                   # 79 splits in runs; the combine polls
    (1, 1, 40000, [40000], {"window_size": (700, 0)}),            # the window's 2 splits of 79
    (1, 16, 40000, [40000], {}),                                  # 4 row blocks, each in runs
    (1, 1, 40000, [0], {}),                                       # no key: out 0, lse -inf
    (2, 1, 70000, [70000, 33001], {}),                            # mixed lengths: a CTA per split
    (8, 1, 9000, [9000, 1, 4097, 8999, 512, 513, 7000, 3000], {}),  # 18 splits, 1152 split CTAs
])
def test_packed_split_ctas_equal_one_cta_gpu(B, Sq, cap, lens, kw):
    """Decode at the default split size where the CTA-per-split schedule fills more than a wave:
    one sequence's split CTAs each walk a run of its splits (every n-th, each its own partial;
    fwd_decode.cu's launch_packed) and the combine folds chunks of splits as their CTAs flag
    them done; several sequences get a CTA per split. Either way the automatic schedule gives
    the one-CTA schedule's bits, a lone sequence's, and float64's answer within bf16's
    rounding."""
    gen = make_gen(97 + B)
    H, Hk, D = 32, 8, 128
    q = randn(gen, (B, Sq, H, D), torch.bfloat16, "cuda")
    k, v = (randn(gen, (B, cap, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    seqlens = i32(lens, "cuda")
    fad.set_deterministic_mode(True)
    res = {}
    for sched in ("auto", "one_cta"):
        with force_schedule(sched):
            res[sched] = fad.flash_attn_with_kvcache(q, k, v, cache_seqlens=seqlens, causal=True,
                                                     return_softmax_lse=True, **kw)
    (a, a_lse), (b, b_lse) = res["auto"], res["one_cta"]
    assert torch.isfinite(a).all() and torch.equal(a, b) and torch.equal(a_lse, b_lse)
    if lens == [0]:  # (float64's answer is the same zeros: nothing to compare within a tolerance)
        assert not a.any() and torch.isneginf(a_lse).all()
        return
    last = B - 1
    alone = fad.flash_attn_with_kvcache(q[last:], k[last:], v[last:], cache_seqlens=seqlens[last:],
                                        causal=True, **kw)
    assert torch.equal(alone[0], a[last])
    L = lens[0]
    ref, _ = attention_ref(q[:1], k[:1, :L], v[:1, :L], causal=True, **kw)
    assert_close(a[:1], ref, torch.bfloat16, 2.0 ** -7)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_packed_many_splits_bad_block_is_nan_gpu():
    """A page outside the cache in the middle of one sequence, on the CTA-per-split schedule at
    many splits (96: the combine polls the split CTAs' flags): that sequence's rows are NaN,
    the other sequences' are finite."""
    gen = make_gen(95)
    B, H, Hk, D, page, cap = 4, 32, 8, 64, 64, 12288
    q = randn(gen, (B, 1, H, D), torch.bfloat16, "cuda")
    blocks = B * cap // page
    kc, vc = (randn(gen, (blocks, page, Hk, D), torch.bfloat16, "cuda") for _ in range(2))
    table = torch.randperm(blocks, generator=gen).reshape(B, cap // page).to(torch.int32)
    table[1, 70] = blocks + 5
    fad.set_deterministic_mode(True, split_size=128)
    with force_schedule("cta_per_split"):
        out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=i32([cap] * B, "cuda"),
                                               block_table=table.cuda(), return_softmax_lse=True)
    torch.cuda.synchronize()
    for b in (0, 2, 3):
        assert torch.isfinite(out[b]).all() and torch.isfinite(lse[b]).all()
    assert out[1].isnan().all() and lse[1].isnan().all()


@pytest.mark.parametrize("device", DEVICES)
def test_num_splits_picks_the_schedule_not_the_bits(device):
    """flash_attn's num_splits in deterministic mode: 1 (every split of a (sequence, kv head)
    in one CTA), 2 and 7 (a CTA per split plus the combine) and 0 (the plan's choice) give the
    same out, lse and appended cache rows, for a batch of mixed lengths with new rows; on the
    GPU each equals the schedule testing.force_schedule forces. A num_splits that is not an int
    raises before anything is written."""
    gen = make_gen(311)
    B, H, Hk, D, cap = 6, 16, 4, 64, 2048
    lens = [2000, 37, 1500, 2040, 512, 900]
    q = randn(gen, (B, 1, H, D), torch.bfloat16, device)
    kc0, vc0 = (randn(gen, (B, cap, Hk, D), torch.bfloat16, device) for _ in range(2))
    knew, vnew = (randn(gen, (B, 1, Hk, D), torch.bfloat16, device) for _ in range(2))

    def call(num_splits):
        kc, vc = kc0.clone(), vc0.clone()
        out, lse = fad.flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=i32(lens, device),
                                               causal=True, num_splits=num_splits,
                                               return_softmax_lse=True)
        return out, lse, kc, vc

    base = call(0)
    assert torch.isfinite(base[0]).all()
    for ns in (1, 2, 7):
        assert all(torch.equal(a, b) for a, b in zip(call(ns), base)), f"num_splits {ns}"
    if device == "cuda":
        for sched in ("one_cta", "cta_per_split"):
            with force_schedule(sched):
                assert all(torch.equal(a, b) for a, b in zip(call(0), base)), sched
    kc, vc = kc0.clone(), vc0.clone()
    with pytest.raises(TypeError, match="num_splits"):
        fad.flash_attn_with_kvcache(q, kc, vc, knew, vnew, cache_seqlens=i32(lens, device),
                                    causal=True, num_splits=1.0)
    assert torch.equal(kc, kc0) and torch.equal(vc, vc0)
