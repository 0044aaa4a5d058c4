"""Variable-length and packed entry points, on the CPU path (CI) and the GPU (skipped without).

The strongest check is the contract itself: in deterministic mode each sequence of a
varlen batch must give exactly the bits flash_attn_func gives for that sequence alone.
Correctness against the float64 reference is checked on top.
"""
import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import _C
from flash_attn_det.bert_padding import pad_input, unpad_input
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import DEVICES, HAS_CUDA, assert_close, assert_lse_close, make_gen, randn



def make_varlen(gen, lens_q, lens_k, H, Hk, D, dtype, device):
    """Random packed q/k/v and int32 cu_seqlens for the given per-sequence lengths."""
    q = randn(gen, (sum(lens_q), H, D), dtype, device)
    k = randn(gen, (sum(lens_k), Hk, D), dtype, device)
    v = randn(gen, (sum(lens_k), Hk, D), dtype, device)

    def cu(lens):
        return torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32,
                            device=device)

    return q, k, v, cu(lens_q), cu(lens_k)


def per_sequence(cu_q, cu_k, lens_k_used=None):
    cq, ck = cu_q.tolist(), cu_k.tolist()
    for b in range(len(cq) - 1):
        k1 = ck[b + 1] if lens_k_used is None else ck[b] + lens_k_used[b]
        yield b, slice(cq[b], cq[b + 1]), slice(ck[b], k1)


def check_against_single(out, lse, q, k, v, cu_q, cu_k, kw, dtype, alibi=None, used=None,
                         ref_check=True):
    """Each sequence: bits equal flash_attn_func alone, and close to the reference."""
    for b, sq, sk in per_sequence(cu_q, cu_k, used):
        if sq.stop == sq.start:
            continue
        qb, kb, vb = q[sq][None], k[sk][None], v[sk][None]
        slopes = None if alibi is None else (alibi[b] if alibi.dim() == 2 else alibi)
        ob, lb, _ = fad.flash_attn_func(qb, kb, vb, return_attn_probs=True, alibi_slopes=slopes,
                                        **kw)
        assert torch.equal(out[sq], ob[0]), f"sequence {b}: out bits differ from a batch of one"
        assert torch.equal(lse[:, sq], lb[0]), f"sequence {b}: lse bits differ"
        if ref_check:
            ref, ref_lse = attention_ref(qb, kb, vb, alibi_slopes=slopes, **kw)
            u = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
            assert_close(out[sq][None], ref, dtype, atol=2 * u, rtol_ulps=2,
                         allow_zero_ref=True)
            assert_lse_close(lse[:, sq][None], ref_lse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (40, 7)},
                                {"causal": True, "softcap": 3.0}])
def test_varlen_matches_single_sequences(device, dtype, kw):
    gen = make_gen(11)
    lens_q = [70, 1, 0, 130, 33]
    lens_k = [70, 300, 5, 130, 1]
    D = 40 if device == "cpu" else 128
    q, k, v, cu_q, cu_k = make_varlen(gen, lens_q, lens_k, 4, 2, D, dtype, device)
    fad.set_deterministic_mode(True, split_size=128)
    out, lse, none = fad.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                return_attn_probs=True, **kw)
    assert none is None and out.shape == q.shape and lse.shape == (4, sum(lens_q))
    check_against_single(out, lse, q, k, v, cu_q, cu_k, kw, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alibi_shape", ["H", "BH"])
def test_varlen_alibi(device, alibi_shape):
    gen = make_gen(12)
    lens = [50, 200, 3]
    q, k, v, cu_q, cu_k = make_varlen(gen, lens, lens, 4, 4, 64, torch.bfloat16, device)
    shape = (4,) if alibi_shape == "H" else (3, 4)
    alibi = (torch.rand(shape, generator=gen) * 0.3 + 0.01).to(device)
    out, lse, _ = fad.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 200, causal=True,
                                             alibi_slopes=alibi, return_attn_probs=True)
    check_against_single(out, lse, q, k, v, cu_q, cu_k, {"causal": True}, torch.bfloat16,
                         alibi=alibi)


@pytest.mark.parametrize("device", DEVICES)
def test_seqused_k(device):
    gen = make_gen(13)
    lens_q, lens_k, used = [5, 9, 1], [100, 40, 300], [60, 40, 0]
    q, k, v, cu_q, cu_k = make_varlen(gen, lens_q, lens_k, 2, 1, 64, torch.float16, device)
    seqused = torch.tensor(used, dtype=torch.int32, device=device)
    out, lse, _ = fad.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 9, 300, seqused_k=seqused,
                                             return_attn_probs=True)
    # Sequence 2 uses no key: out 0, lse -inf, as flash_attn.
    assert torch.equal(out[14:15], torch.zeros_like(out[14:15]))
    assert torch.isneginf(lse[:, 14]).all()
    check_against_single(out[:14], lse[:, :14], q, k, v, cu_q[:3], cu_k[:3], {}, torch.float16,
                         used=used[:2])


@pytest.mark.parametrize("device", DEVICES)
def test_packed_variants_equal_unpacked(device):
    gen = make_gen(14)
    B, S, H, D = 2, 150, 4, 64
    qkv = randn(gen, (B, S, 3, H, D), torch.bfloat16, device)
    q, k, v = qkv.unbind(2)
    ref = fad.flash_attn_func(q, k, v, causal=True)
    assert torch.equal(fad.flash_attn_qkvpacked_func(qkv, causal=True), ref)
    assert torch.equal(fad.flash_attn_kvpacked_func(q, qkv[:, :, 1:], causal=True), ref)

    lens = [150, 77]
    qkv_u = randn(gen, (sum(lens), 3, H, D), torch.bfloat16, device)
    cu = torch.tensor([0, 150, 227], dtype=torch.int32, device=device)
    qu, ku, vu = qkv_u.unbind(1)
    ref_u = fad.flash_attn_varlen_func(qu, ku, vu, cu, cu, 150, 150, causal=True)
    assert torch.equal(fad.flash_attn_varlen_qkvpacked_func(qkv_u, cu, 150, causal=True), ref_u)
    assert torch.equal(fad.flash_attn_varlen_kvpacked_func(qu, qkv_u[:, 1:], cu, cu, 150, 150,
                                                           causal=True), ref_u)


@pytest.mark.parametrize("device", DEVICES)
def test_unpad_pad_roundtrip_and_attention(device):
    gen = make_gen(15)
    B, S, H, D = 3, 64, 2, 32
    x = randn(gen, (B, S, H, D), torch.float16, device)
    mask = torch.zeros(B, S, dtype=torch.bool, device=device)
    for b, n in enumerate([64, 17, 1]):
        mask[b, :n] = True
    xu, idx, cu, max_s, used = unpad_input(x, mask)
    assert xu.shape == (82, H, D) and cu.tolist() == [0, 64, 81, 82] and max_s == 64
    assert used.tolist() == [64, 17, 1] and cu.dtype == torch.int32
    back = pad_input(xu, idx, B, S)
    assert torch.equal(back[mask], x[mask]) and not back[~mask].any()
    # Attention over the unpadded batch = attention over each sequence's valid prefix.
    out = fad.flash_attn_varlen_func(xu, xu, xu, cu, cu, max_s, max_s, causal=True)
    for b, n in enumerate([64, 17, 1]):
        alone = fad.flash_attn_func(x[b:b + 1, :n], x[b:b + 1, :n], x[b:b + 1, :n], causal=True)
        assert torch.equal(pad_input(out, idx, B, S)[b, :n], alone[0])


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_bad_input(device):
    gen = make_gen(16)
    q, k, v, cu_q, cu_k = make_varlen(gen, [10, 20], [10, 20], 2, 2, 64, torch.bfloat16, device)
    call = fad.flash_attn_varlen_func
    with pytest.raises(TypeError, match="^cu_seqlens_q:"):
        call(q, k, v, cu_q.float(), cu_k, 20, 20)  # (int64: converted)
    with pytest.raises(ValueError, match="^cu_seqlens_k:"):
        call(q, k, v, cu_q, cu_k[:2], 20, 20)
    with pytest.raises(ValueError, match="^q:"):
        call(q[None], k, v, cu_q, cu_k, 20, 20)
    with pytest.raises(ValueError, match="^max_seqlen_q"):
        call(q, k, v, cu_q, cu_k, -1, 20)
    with pytest.raises(ValueError, match="^k: expected 4 dims"):  # paged: k/v are pages
        call(q, k, v, cu_q, cu_k, 20, 20,
             block_table=torch.zeros(2, 1, dtype=torch.int32, device=q.device))
    with pytest.raises(ValueError, match="^dropout_p:"):
        call(q, k, v, cu_q, cu_k, 20, 20, dropout_p=1.0)
    with pytest.raises(ValueError, match="^seqused_k:"):
        call(q, k, v, cu_q, cu_k, 20, 20, seqused_k=torch.ones(3, dtype=torch.int32,
                                                               device=device))


def test_varlen_bad_cu_seqlens_on_cpu_raise_and_write_nothing():
    gen = make_gen(17)
    q, k, v, cu_q, cu_k = make_varlen(gen, [10, 20], [10, 20], 2, 2, 64, torch.bfloat16, "cpu")
    cases = [
        (torch.tensor([0, 20, 10], dtype=torch.int32), cu_k, 20, 20, "^cu_seqlens_q:"),  # decreasing
        (torch.tensor([0, 10, 31], dtype=torch.int32), cu_k, 21, 20, "^cu_seqlens_q:"),  # past q
        (cu_q, cu_k, 15, 20, "^cu_seqlens_q:"),                                     # > max_seqlen_q
        (cu_q, torch.tensor([1, 10, 30], dtype=torch.int32), 20, 20, "^cu_seqlens_q, cu_seqlens_k"),
        (cu_q, cu_k, 20, 19, "^cu_seqlens_k:"),                                     # > max_seqlen_k
    ]
    for cq, ck, mq, mk, match in cases:
        out = torch.full_like(q, 7.0)
        lse = torch.full((2, 30), 7.0)
        with pytest.raises(ValueError, match=match):
            _C.fwd_varlen(*(torch.utils.dlpack.to_dlpack(t) for t in (q, k, v, out, lse, cq, ck)),
                          None, None, mq, mk, None, None, 0.125, 0.0, -1, -1, 0, 1, 512, 0, 0)
        assert (out == 7).all() and (lse == 7).all(), "a refused call wrote its outputs"


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("kw", [{}, {"causal": True}])
def test_varlen_schedules_bit_equal_gpu(kw):
    gen = make_gen(18)
    lens_q, lens_k = [1, 3, 1, 200], [5000, 1200, 1, 3000]
    q, k, v, cu_q, cu_k = make_varlen(gen, lens_q, lens_k, 8, 2, 128, torch.bfloat16, "cuda")
    outs = []
    for name in ("auto", "one_cta", "cta_per_split"):
        with force_schedule(name):
            outs.append(fad.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 200, 5000,
                                                   return_attn_probs=True, **kw))
    for o, l, _ in outs[1:]:
        assert torch.equal(o, outs[0][0]) and torch.equal(l, outs[0][1])
    check_against_single(outs[0][0], outs[0][1], q, k, v, cu_q, cu_k, kw, torch.bfloat16)


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_varlen_out_of_range_cu_seqlens_gpu_are_skipped_loudly():
    """GPU cu_seqlens are not read back; a sequence pointing outside q is never computed
    (no out-of-bounds access) and its rows stay NaN. The valid sequence is unaffected."""
    gen = make_gen(19)
    q, k, v, cu_q, cu_k = make_varlen(gen, [10, 20], [10, 20], 2, 2, 64, torch.bfloat16, "cuda")
    bad_q = torch.tensor([0, 10, 40], dtype=torch.int32, device="cuda")  # past the 30 rows of q
    out, lse, _ = fad.flash_attn_varlen_func(q, k, v, bad_q, cu_k, 30, 20, return_attn_probs=True)
    torch.cuda.synchronize()
    good = fad.flash_attn_func(q[None, :10], k[None, :10], v[None, :10])
    assert torch.equal(out[:10], good[0])
    assert out[10:].isnan().all() and lse[:, 10:].isnan().all()


# --- paged KV (block_table) ----------------------------------------------------------

def to_pages(k, cu_k, page, gen, spare=3):
    """k (total_k, Hk, D) of a varlen batch scattered into shuffled pages of `page` rows:
    returns (pages (num_pages, page, Hk, D), block_table (B, max_blocks) int32). Unused
    table slots hold -1 (never read), spare pages hold noise."""
    cks = cu_k.tolist()
    lens = [b - a for a, b in zip(cks[:-1], cks[1:])]
    need = [(n + page - 1) // page for n in lens]
    total = sum(need) + spare
    perm = torch.randperm(total, generator=gen).tolist()
    pages = torch.randn((total, page) + tuple(k.shape[1:]), generator=gen).to(k.dtype).to(k.device)
    table = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    used = 0
    for b, (a, n) in enumerate(zip(cks[:-1], lens)):
        for s in range(need[b]):
            pg = perm[used]
            used += 1
            rows = k[a + s * page: min(a + n, a + (s + 1) * page)]
            pages[pg, :rows.shape[0]] = rows
            table[b, s] = pg
    return pages, table.to(k.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page", [16, 48])
def test_varlen_paged_equals_contiguous(device, page):
    """Shuffled pages of any multiple-of-16 size give the bits of the contiguous varlen call,
    for the packed (short query) and the prefill kernel, causal and not."""
    for lens_q in ([70, 1, 5], [3, 1, 5]):  # max_seqlen_q 70: prefill kernel; 5: packed kernel
        gen = make_gen(91 + page)
        lens_k = [70, 1, 130]
        q, k, v, cu_q, cu_k = make_varlen(gen, lens_q, lens_k, 4, 2, 64, torch.bfloat16, device)
        kp, table = to_pages(k, cu_k, page, torch.Generator().manual_seed(page))
        vp, table_v = to_pages(v, cu_k, page, torch.Generator().manual_seed(page))
        assert torch.equal(table, table_v)
        for kw in ({}, {"causal": True}):
            args = (cu_q, cu_k, max(lens_q), 130)
            ref, ref_lse, _ = fad.flash_attn_varlen_func(q, k, v, *args, return_attn_probs=True,
                                                         **kw)
            out, lse, _ = fad.flash_attn_varlen_func(q, kp, vp, *args, block_table=table,
                                                     return_attn_probs=True, **kw)
            assert torch.equal(out, ref) and torch.equal(lse, ref_lse), f"{lens_q} {kw}: bits"


def test_varlen_paged_bad_page_raises_on_cpu_and_has_no_backward():
    gen = make_gen(93)
    q, k, v, cu_q, cu_k = make_varlen(gen, [20, 20], [40, 20], 2, 2, 32, torch.float16, "cpu")
    kp, table = to_pages(k, cu_k, 16, torch.Generator().manual_seed(0))
    vp = kp.clone()
    bad = table.clone()
    bad[0, 1] = kp.shape[0]  # a page index past the cache
    with pytest.raises(ValueError, match="^block_table:"):
        fad.flash_attn_varlen_func(q, kp, vp, cu_q, cu_k, 20, 40, block_table=bad)
    out, lse, _ = fad.flash_attn_varlen_func(q.requires_grad_(True), kp, vp, cu_q, cu_k, 20, 40,
                                             block_table=table, return_attn_probs=True)
    ref, ref_lse, _ = fad.flash_attn_varlen_func(q.detach(), kp, vp, cu_q, cu_k, 20, 40,
                                                 block_table=table, return_attn_probs=True)
    assert torch.equal(out.detach(), ref) and torch.equal(lse, ref_lse)  # the forward runs
    with pytest.raises(NotImplementedError, match="^block_table:"):
        out.float().sum().backward()  # only the backward is missing (as in flash_attn)

