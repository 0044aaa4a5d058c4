"""Dropout: the keep mask is Philox4x32-7 keyed only by the generator's
seed and offset, the head and the positions (flash_attn_det/dropout.py, csrc/fad_math.h), so
a sequence's dropped elements and its output and gradient bits do not depend on the batch.
Checked on both paths against a float64 reference that uses the mask of dropout.keep_mask
(an independent torch implementation of the rule), plus S_dmask, seeding and the refusals.
"""
import math

import pytest
import torch

import flash_attn_det as fad
from flash_attn_det import dropout as D
from flash_attn_det.testing import attention_ref, dropout_mask_of, force_schedule

from conftest import DEVICES, HAS_CUDA, make_gen, randn, warm_up_for_capture

REL_TOL = {torch.float16: 2e-3, torch.bfloat16: 8e-3}


def test_philox_known_answers():
    """Random123's known-answer vectors for philox4x32-10."""
    assert D._philox_int([0, 0, 0, 0], 0, 0) == [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]
    ones = 0xFFFFFFFF
    assert D._philox_int([ones] * 4, ones, ones) == [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]
    c = [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344]
    want = [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]
    assert D._philox_int(c, 0xA4093822, 0x299F31D0) == want
    t = [torch.tensor([x], dtype=torch.int64) for x in c]
    assert [int(x) for x in D._philox(*t, 0xA4093822, 0x299F31D0)] == want


def test_keep_fraction_and_threshold():
    assert D.keep_threshold(0.0) == 256 and D.keep_threshold(0.5) == 128
    assert D.keep_threshold(0.1) == 230  # p acts in steps of 1/256: round(0.9 * 256)
    keep = D.keep_mask(0.3, 123, 8, torch.arange(4), torch.arange(256), torch.arange(256))
    assert abs(1 - keep.float().mean().item() - (256 - D.keep_threshold(0.3)) / 256) < 0.005
    # each of a draw's 16 bytes decides its own element: no two of a row's 64 keys agree
    # in a pattern (a byte read twice would make two columns equal over all rows)
    cols = keep[0].T.contiguous()
    assert len({tuple(c.tolist()) for c in cols}) == cols.shape[0]


def _rel(got, ref):
    den = float(ref.norm())
    return float((got.double() - ref).norm()) / (den if den > 0 else 1.0)


def _call(q, k, v, p, kw, grad_out=None):
    """(out, dq, dk, dv, dropout) of one flash_attn_func call with dropout p."""
    seed, offset, _ = D.draw(q, p)
    q, k, v = (t.detach().clone().requires_grad_(grad_out is not None) for t in (q, k, v))
    out = fad.flash_attn_func(q, k, v, dropout_p=p, **kw)
    if grad_out is None:
        return out, None, None, None, (p, seed, offset)
    out.backward(grad_out)
    return out.detach(), q.grad, k.grad, v.grad, (p, seed, offset)


CASES = [
    dict(B=2, Sq=37, Sk=300, H=4, Hk=2, Dh=64),
    dict(B=1, Sq=130, Sk=130, H=2, Hk=2, Dh=128, causal=True),
    dict(B=2, Sq=40, Sk=90, H=2, Hk=1, Dh=32, window_size=(20, 5)),
    dict(B=1, Sq=33, Sk=700, H=2, Hk=2, Dh=64, softcap=5.0),               # several splits
    dict(B=2, Sq=25, Sk=60, H=2, Hk=2, Dh=256, alibi=True),
    # several splits and tiles: on Hopper the warp-specialized kernel (both consumers, split
    # folds) and the D64 wgmma kernel, which drop on P once packed (dropout_pf)
    dict(B=2, Sq=200, Sk=1100, H=2, Hk=1, Dh=128),
    dict(B=1, Sq=150, Sk=700, H=2, Hk=2, Dh=64, causal=True),
    # a grid of at least one dK/dV CTA per SM: on Hopper the backward's wgmma kernels
    dict(B=4, Sq=300, Sk=1100, H=4, Hk=4, Dh=64),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items()))
def test_forward_and_grads_match_float64(device, dtype, case):
    case = dict(case)
    B, Sq, Sk, H, Hk, Dh = (case.pop(n) for n in ("B", "Sq", "Sk", "H", "Hk", "Dh"))
    gen = make_gen(31)
    q, k, v = (randn(gen, (B, S, h, Dh), dtype, device) for S, h in ((Sq, H), (Sk, Hk), (Sk, Hk)))
    dout = randn(gen, (B, Sq, H, Dh), dtype, device)
    if case.pop("alibi", False):
        case["alibi_slopes"] = (torch.rand((B, H), generator=gen) * 0.2 + 0.01).to(device)
    p = 0.17
    out, dq, dk, dv, drop = _call(q, k, v, p, case, dout)
    mask = dropout_mask_of(drop, H, Sq, Sk, device)
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    ref, _ = attention_ref(qd, kd, vd, dropout_p=p, dropout_mask=mask, **case)
    ref.backward(dout.double())
    # the reference's own error in the dtype: the tolerance's floor
    peer, _ = attention_ref(q, k, v, dropout_p=p, dropout_mask=mask, upcast=False, **case)
    tol = max(REL_TOL[dtype], 2 * _rel(peer, ref.detach()))
    for what, got, want in (("out", out, ref.detach()), ("dq", dq, qd.grad), ("dk", dk, kd.grad),
                            ("dv", dv, vd.grad)):
        assert torch.isfinite(got).all(), what
        assert _rel(got, want) < tol, f"{what}: relative error {_rel(got, want):.2e} >= {tol:.1e}"
    # a different mask is far off: the kernels really drew this one
    other = dropout_mask_of((p, drop[1] + 1, drop[2]), H, Sq, Sk, device)
    wrong, _ = attention_ref(qd.detach(), kd.detach(), vd.detach(), dropout_p=p,
                             dropout_mask=other, **case)
    assert _rel(out, wrong) > 10 * tol


@pytest.mark.parametrize("device", DEVICES)
def test_batch_invariant_and_seeded(device):
    """A sequence alone, in a batch (any row), and packed in a varlen batch: the same output
    and gradient bits; torch.manual_seed reproduces a call, the next call draws anew."""
    gen = make_gen(5)
    L, H, Dh, p = 150, 4, 64, 0.25
    q, k, v, dout = (randn(gen, (3, L, H, Dh), torch.bfloat16, device) for _ in range(4))
    kw = dict(causal=True)
    torch.manual_seed(11)
    full = _call(q, k, v, p, kw, dout)
    torch.manual_seed(11)
    again = _call(q, k, v, p, kw, dout)
    nxt = _call(q, k, v, p, kw, dout)
    for a, b in zip(full[:4], again[:4]):
        assert torch.equal(a, b)
    assert not torch.equal(full[0], nxt[0])
    for b in range(3):
        torch.manual_seed(11)
        alone = _call(q[b:b + 1], k[b:b + 1], v[b:b + 1], p, kw, dout[b:b + 1])
        for what, a, f in zip(("out", "dq", "dk", "dv"), alone[:4], full[:4]):
            assert torch.equal(a[0], f[b]), f"sequence {b}: {what} alone != in the batch"
    # varlen: the three sequences cut to different lengths, packed
    lens = [150, 61, 97]
    cu = torch.tensor([0, 150, 211, 308], dtype=torch.int32, device=device)
    pack = lambda t: torch.cat([t[b, :n] for b, n in enumerate(lens)])
    qv, kv, vv = (pack(t).requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(11)
    out = fad.flash_attn_varlen_func(qv, kv, vv, cu, cu, 150, 150, dropout_p=p, causal=True)
    out.backward(pack(dout))
    for b, n in enumerate(lens):
        torch.manual_seed(11)
        alone = _call(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n], p, kw, dout[b:b + 1, :n])
        s = slice(int(cu[b]), int(cu[b + 1]))
        for what, a, f in zip(("out", "dq", "dk", "dv"), alone[:4], (out, qv.grad, kv.grad, vv.grad)):
            assert torch.equal(a[0], f[s].detach()), f"varlen sequence {b}: {what}"


@pytest.mark.parametrize("device", DEVICES)
def test_seq_ids_travel_with_the_sequence(device):
    """dropout_seq_ids: a sequence's mask depends on its id, not on its batch index. Equal
    sequences with equal ids get equal bits, with different ids different masks; a sequence
    alone with its id, or packed in a varlen batch with it, has its bits in the batch; the
    forward and the gradients match float64 under the mask of each id."""
    gen = make_gen(12)
    L, H, Dh, p = 140, 2, 64, 0.3
    one = [randn(gen, (1, L, H, Dh), torch.bfloat16, device) for _ in range(4)]
    q, k, v, dout = (t.expand(3, -1, -1, -1).contiguous() for t in one)  # three equal sequences
    ids = [7, 7, 2 ** 32 - 3]
    kw = dict(causal=True, dropout_seq_ids=ids)
    torch.manual_seed(4)
    out, dq, dk, dv, drop = _call(q, k, v, p, kw, dout)
    for what, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.equal(t[0], t[1]), f"{what}: same sequence, same id, different bits"
        assert not torch.equal(t[0], t[2]), f"{what}: another id gave the same bits"
    mask = dropout_mask_of(drop, H, L, L, device, ids)
    assert not torch.equal(mask[0], mask[2])
    qd, kd, vd = (t.double().requires_grad_(True) for t in (q, k, v))
    ref, _ = attention_ref(qd, kd, vd, dropout_p=p, dropout_mask=mask, causal=True)
    ref.backward(dout.double())
    for what, got, want in (("out", out, ref.detach()), ("dq", dq, qd.grad), ("dk", dk, kd.grad),
                            ("dv", dv, vd.grad)):
        assert _rel(got, want) < REL_TOL[torch.bfloat16], what
    for b in (2, 0):
        torch.manual_seed(4)
        alone = _call(q[b:b + 1], k[b:b + 1], v[b:b + 1], p,
                      dict(causal=True, dropout_seq_ids=[ids[b]]), dout[b:b + 1])
        for what, a, f in zip(("out", "dq", "dk", "dv"), alone[:4], (out, dq, dk, dv)):
            assert torch.equal(a[0], f[b]), f"sequence {b} alone: {what}"
    # varlen: the id-2**32-3 sequence second in a pack, after a shorter one with id 7
    cu = torch.tensor([0, 90, 90 + L], dtype=torch.int32, device=device)
    qv, kv, vv = (torch.cat([t[0, :90], t[2]]).requires_grad_(True) for t in (q, k, v))
    torch.manual_seed(4)
    outv = fad.flash_attn_varlen_func(qv, kv, vv, cu, cu, L, L, dropout_p=p, causal=True,
                                      dropout_seq_ids=torch.tensor([7, 2 ** 32 - 3]))
    outv.backward(torch.cat([dout[0, :90], dout[2]]))
    for what, a, f in zip(("out", "dq", "dk", "dv"), (out, dq, dk, dv),
                          (outv.detach(), qv.grad, kv.grad, vv.grad)):
        assert torch.equal(a[2], f[90:]), f"varlen: {what}"
    # S_dmask decodes each sequence's own mask
    torch.manual_seed(4)
    _, _, S = fad.flash_attn_func(q, k, v, p, causal=True, return_attn_probs=True,
                                  dropout_seq_ids=ids)
    seen = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    assert torch.equal((S[:, :, :L, :L] >= 0)[:, :, seen], mask[:, :, seen])


@pytest.mark.parametrize("device", DEVICES)
def test_bad_seq_ids_raise_before_anything(device):
    q, k, v = (torch.randn(2, 8, 2, 16, dtype=torch.float16, device=device) for _ in range(3))
    state = (torch.cuda.get_rng_state(q.device) if q.is_cuda else torch.get_rng_state())
    for ids, exc in (([1, 2, 3], ValueError), ([-1, 0], ValueError), ([0, 2 ** 32], ValueError),
                     (torch.zeros(2, 1, dtype=torch.int64), ValueError), ([0.5, 1.0], TypeError),
                     ("ab", TypeError), (True, TypeError)):
        with pytest.raises(exc, match="^dropout_seq_ids:"):
            fad.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seq_ids=ids)
        with pytest.raises(exc, match="^dropout_seq_ids:"):  # checked without dropout too
            fad.flash_attn_func(q, k, v, dropout_seq_ids=ids)
    after = (torch.cuda.get_rng_state(q.device) if q.is_cuda else torch.get_rng_state())
    assert torch.equal(state, after), "a call that raised advanced the generator"
    # one int: every sequence's id; without dropout ids change nothing
    torch.manual_seed(1)
    a = fad.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seq_ids=5)
    torch.manual_seed(1)
    b = fad.flash_attn_func(q, k, v, dropout_p=0.2, dropout_seq_ids=[5, 5])
    assert torch.equal(a, b)
    assert torch.equal(fad.flash_attn_func(q, k, v, dropout_seq_ids=[3, 4]),
                       fad.flash_attn_func(q, k, v))


@pytest.mark.parametrize("device", DEVICES)
def test_s_dmask_decodes_to_the_mask_and_the_probabilities(device):
    gen = make_gen(8)
    B, L, H, Dh, p = 2, 70, 2, 32, 0.3
    q, k, v = (randn(gen, (B, L, H, Dh), torch.float16, device) for _ in range(3))
    seed, offset, _ = D.draw(q, p)
    out, lse, S = fad.flash_attn_func(q, k, v, p, causal=True, return_attn_probs=True)
    assert S.shape == (B, H, 128, 128) and S.dtype == q.dtype
    seen = torch.ones(L, L, dtype=torch.bool, device=device).tril()
    keep = dropout_mask_of((p, seed, offset), H, L, L, device)[0]
    assert torch.equal((S[:, :, :L, :L] >= 0)[:, :, seen], keep.expand(B, H, L, L)[:, :, seen])
    assert (S[:, :, L:] == 0).all() and (S[:, :, :, L:] == 0).all()
    assert (S[:, :, :L, :L][:, :, ~seen] == 0).all()
    # |S| * exp(row max - lse) is the softmax (flash_attn's normalisation, one block per row)
    s = torch.einsum("bihd,bjhd->bhij", q.double(), k.double()) * Dh ** -0.5
    s = s.masked_fill(~seen, -math.inf)
    prob = torch.softmax(s, -1)
    got = S[:, :, :L, :L].abs().double() * torch.exp(s.amax(-1, keepdim=True) - lse.double()[..., None])
    assert (got - prob).abs().max() < 2e-3
    assert fad.flash_attn_func(q, k, v, 0.0, return_attn_probs=True)[2] is None


@pytest.mark.parametrize("device", DEVICES)
def test_bad_dropout_changes_nothing(device):
    q, k, v = (torch.randn(1, 8, 2, 16, dtype=torch.float16, device=device) for _ in range(3))
    state = (torch.cuda.get_rng_state(q.device) if q.is_cuda else torch.get_rng_state())
    for p, exc in ((1.0, ValueError), (-0.1, ValueError), (float("nan"), ValueError), ("x", TypeError)):
        with pytest.raises(exc, match="^dropout_p:"):
            fad.flash_attn_func(q, k, v, dropout_p=p)
    with pytest.raises(ValueError, match="^softcap:"):  # valid dropout, bad other argument
        fad.flash_attn_func(q, k, v, dropout_p=0.1, softcap=-1.0)
    after = (torch.cuda.get_rng_state(q.device) if q.is_cuda else torch.get_rng_state())
    assert torch.equal(state, after), "a call that raised advanced the generator"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_gpu_schedules_give_the_same_bits_with_dropout():
    gen = make_gen(9)
    q, k, v = (randn(gen, (1, 40, 2, 128), torch.bfloat16, "cuda") for _ in range(3))
    k, v = (randn(gen, (1, 1500, 2, 128), torch.bfloat16, "cuda") for _ in range(2))
    outs = []
    for name in ("one_cta", "cta_per_split"):
        with force_schedule(name):
            torch.manual_seed(3)
            outs.append(fad.flash_attn_func(q, k, v, dropout_p=0.2))
    assert torch.equal(outs[0], outs[1])


def _wrong_pairs(device):
    """(pair, exception) for every kind of dropout_seed_offset _C must refuse."""
    other = "cpu" if device == "cuda" else "cuda" if HAS_CUDA else "meta"
    z = dict(dtype=torch.int64, device=device)
    return [(torch.zeros(2, dtype=torch.int32, device=device), TypeError),
            (torch.zeros(3, **z), ValueError), (torch.zeros(1, 2, **z), ValueError),
            (torch.zeros(4, **z)[::2], ValueError), (torch.zeros(1, **z).expand(2), ValueError),
            (torch.zeros(2, dtype=torch.int64, device=other), ValueError),
            ([1, 2], TypeError)]


@pytest.mark.parametrize("device", DEVICES)
def test_seed_offset_read_from_a_tensor(device):
    """fad_fwd_params.dropout_seed_offset, what a captured CUDA graph relies on: _C.fwd and
    _C.bwd given (seed, offset) as an int64 (2,) tensor on q's device, with host seed and
    offset 0, give the bits of the call given them as ints (with and without seq_ids; a seed
    past 2**63 is negative as an int64); a pair of the wrong dtype, shape, layout or device,
    or not a tensor, is refused naming dropout_seed_offset before anything is written."""
    from flash_attn_det import _C, interface as I
    gen = make_gen(21)
    B, L, H, Dh, p = 2, 150, 2, 64, 0.2
    q, k, v, dout = (randn(gen, (B, L, H, Dh), torch.bfloat16, device) for _ in range(4))
    opts = (None, True, (-1, -1), 0.0, None)  # softmax_scale, causal, window, softcap, alibi
    seed, offset = 2 ** 64 - 5, 2 ** 40 + 7
    pair = torch.tensor([seed - 2 ** 64, offset], dtype=torch.int64, device=device)
    ids = torch.tensor([7, -3], dtype=torch.int32, device=device)
    for seq_ids in (None, ids):
        runs = {}
        for name, drop in (("ints", (p, seed, offset, seq_ids)),
                           ("pair", (p, 0, 0, seq_ids, pair)),
                           ("zeros", (p, 0, 0, seq_ids))):  # what ignoring the pair would give
            out, lse = I._fwd(q, k, v, *opts, dropout=drop)
            runs[name] = (out, *I._backward(dout, q, k, v, out, lse, *opts, dropout=drop))
        for what, a, b, z in zip(("out", "dq", "dk", "dv"), runs["ints"], runs["pair"],
                                 runs["zeros"]):
            assert torch.equal(a, b), f"{what}: the pair gave other bits than the ints"
            assert not torch.equal(b, z), f"{what}: the pair was not read"
    # refusals, on the raw entries: out, lse and the gradients poisoned, and left as they were
    out = torch.full_like(q, float("nan"))
    lse = torch.full((B, H, L), float("nan"), device=device)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    stream = I._current_stream(q) if q.is_cuda else 0
    fwd_args = [I._dl(t) for t in (q, k, v, out, lse)] + [
        None, None, Dh ** -0.5, 0.0, -1, 0, 1, 1, 512, _C.SCHEDULE_AUTO, stream]
    bwd_args = [I._dl(t) for t in (dout, *grads)] + fwd_args
    for bad, exc in _wrong_pairs(device):
        bad = I._dl(bad) if isinstance(bad, torch.Tensor) else bad
        for entry, args in ((_C.fwd, fwd_args), (_C.bwd, bwd_args)):
            with pytest.raises(exc, match="^dropout_seed_offset:"):
                entry(*args, (p, 0, 0, None, bad))
    with pytest.raises(TypeError, match="^dropout: expected None or"):
        _C.fwd(*fwd_args, (p, 0, 0, None, pair, None))
    for name, t in (("out", out), ("softmax_lse", lse), ("dq", grads[0]), ("dk", grads[1]),
                    ("dv", grads[2])):
        assert torch.isnan(t).all(), f"{name}: a refused call wrote it"


def test_captured_path_on_the_cpu(monkeypatch):
    """The interface's capture path, run on the CPU with dropout.capturing forced on (the
    real capture: the GPU test below): the call draws its pair with dropout.draw_captured and
    passes it to the forward and, kept by autograd, to the backward, which therefore give the
    bits of an eager call given that pair's values; the host generator's draw and commit are
    not used; return_attn_probs with dropout, and dropout_seq_ids (checked on the
    host), are refused before anything is drawn."""
    gen = make_gen(22)
    B, L, H, Dh, p = 2, 90, 2, 32, 0.3
    q, k, v, dout = (randn(gen, (B, L, H, Dh), torch.float16) for _ in range(4))
    pairs = []
    monkeypatch.setattr(D, "capturing", lambda x: True)
    monkeypatch.setattr(D, "draw_captured", lambda x: pairs.append(
        torch.randint(0, 2 ** 62, (2,), dtype=torch.int64)) or pairs[-1])
    state = torch.get_rng_state()
    with pytest.raises(NotImplementedError, match="^return_attn_probs:"):
        fad.flash_attn_func(q, k, v, dropout_p=p, causal=True, return_attn_probs=True)
    with pytest.raises(NotImplementedError, match="^return_attn_probs:"):
        cu = torch.tensor([0, L, 2 * L], dtype=torch.int32)
        fad.flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, L,
                                   L, dropout_p=p, return_attn_probs=True)
    for drop in (p, 0.0):  # (ids are checked on the host, with or without dropout)
        with pytest.raises(NotImplementedError, match="^dropout_seq_ids:"):
            fad.flash_attn_func(q, k, v, dropout_p=drop, dropout_seq_ids=[1, 2])
    assert not pairs and torch.equal(state, torch.get_rng_state()), "a refused call drew"
    monkeypatch.setattr(D, "draw", lambda *a: pytest.fail("the host generator was drawn"))
    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))
    out = fad.flash_attn_func(qg, kg, vg, dropout_p=p, causal=True)
    out.backward(dout)
    got = (out.detach(), qg.grad, kg.grad, vg.grad)
    assert len(pairs) == 1
    seed, offset = pairs[0].tolist()
    monkeypatch.undo()
    monkeypatch.setattr(D, "draw", lambda x, p_: (seed, offset, lambda: None))
    want = _call(q, k, v, p, dict(causal=True), dout)
    for what, a, b in zip(("out", "dq", "dk", "dv"), got[:4], want[:4]):
        assert torch.equal(a, b), f"{what}: the captured path's bits differ from eager's"
    # the testing helper reads a captured call's pair
    assert torch.equal(dropout_mask_of((p, 0, 0, None, pairs[0]), H, L, L),
                       dropout_mask_of((p, seed, offset), H, L, L))


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
def test_gpu_graph_capture_with_dropout_draws_on_replay(monkeypatch):
    """Under CUDA graph capture the seed and offset are drawn on the device by a captured
    torch RNG op (dropout.draw_captured) that the kernels read: two replays of a captured
    forward + backward draw different pairs and drop differently, and each replay's output
    and gradients are the bits of an eager call given the pair that replay drew. S_dmask
    (built on the host) is refused under capture, before anything is drawn."""
    gen = make_gen(13)
    B, L, H, Dh, p = 2, 130, 2, 64, 0.1
    q, k, v = (randn(gen, (B, L, H, Dh), torch.bfloat16, "cuda").requires_grad_(True)
               for _ in range(3))
    dout = randn(gen, (B, L, H, Dh), torch.bfloat16, "cuda")
    pairs, draw_captured = [], D.draw_captured
    monkeypatch.setattr(D, "draw_captured", lambda x: pairs.append(draw_captured(x)) or pairs[-1])

    def step():
        for t in (q, k, v):
            t.grad = None  # (the captured backward allocates its grads in the graph's pool)
        out = fad.flash_attn_func(q, k, v, dropout_p=p, causal=True)
        out.backward(dout)
        return out

    torch.manual_seed(5)
    warm_up_for_capture(step)
    assert not pairs, "an eager call drew on the device"
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = step()
    assert len(pairs) == 1, "the captured call did not draw its pair on the device"
    replays = []
    for _ in range(2):
        g.replay()
        torch.cuda.synchronize()
        seed, offset = pairs[0].tolist()
        replays.append(((seed, offset), static_out.detach().clone(),
                        *(t.grad.clone() for t in (q, k, v))))
    assert replays[0][0] != replays[1][0], "two replays drew the same seed and offset"
    assert not torch.equal(replays[0][1], replays[1][1]), "two replays dropped alike"
    for (seed, offset), *got in replays:
        monkeypatch.setattr(D, "draw", lambda x, p_, s=seed, o=offset: (s, o, lambda: None))
        qe, ke, ve = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
        ref = fad.flash_attn_func(qe, ke, ve, dropout_p=p, causal=True)
        ref.backward(dout)
        for what, a, b in zip(("out", "dq", "dk", "dv"), got,
                              (ref.detach(), qe.grad, ke.grad, ve.grad)):
            assert torch.equal(a, b), f"replay with pair {(seed, offset)}: {what} != eager's"
    g2 = torch.cuda.CUDAGraph()
    with pytest.raises(NotImplementedError, match="^return_attn_probs:"):
        with torch.cuda.graph(g2):
            fad.flash_attn_func(q.detach(), k.detach(), v.detach(), dropout_p=p,
                                return_attn_probs=True)
    assert len(pairs) == 1, "the refused call drew a pair"


def test_paged_kv_with_dropout_is_refused():
    q = torch.randn(4, 2, 16, dtype=torch.float16)
    pages = torch.randn(2, 16, 2, 16, dtype=torch.float16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    cuk = torch.tensor([0, 10], dtype=torch.int32)
    table = torch.zeros(1, 2, dtype=torch.int32)
    with pytest.raises(NotImplementedError, match="^dropout_p:"):
        fad.flash_attn_varlen_func(q, pages, pages, cu, cuk, 4, 32, dropout_p=0.1,
                                   block_table=table)
