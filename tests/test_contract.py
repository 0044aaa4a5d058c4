"""The invariance contract, clause by clause, bit for bit (torch.equal), on every device: a
row's output and lse do not depend on the batch, its neighbours, the other heads, how many query
rows the call has (prefill, chunk, decode), the split schedule, the GPU's occupancy or the run.
On a GPU the shapes are larger, so that every kernel (prefill on mma.sync and wgmma, the
warp-specialized kernel, packed decode, combine) and every schedule is reached."""
import pytest
import torch

from flash_attn_det import flash_attn_func, set_deterministic_mode
from flash_attn_det.testing import attention_ref, force_schedule

from conftest import (DEVICES, DTYPES, assert_close, both, make_alibi, make_gen, make_qkv,
                      on_devices, requires_cuda, rising_scores, tolerance,
                      workspace_bytes)

SPLITS = [128, 512]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,split_size", on_devices(cpu=SPLITS, cuda=[512]))
@pytest.mark.parametrize("causal", [False, True])
def test_batch8_vs_two_batches_of_4(device, dtype, split_size, causal):
    """The smallest clause of the contract: a batch of 8 equals two batches of 4."""
    set_deterministic_mode(True, split_size=split_size)
    L, H = (300, 2) if device == "cpu" else (2048, 32)
    q, k, v = make_qkv(make_gen(100), 8, L, L, H, H, 64, dtype, device)
    out, lse = both(q, k, v, causal=causal)
    out_a, lse_a = both(q[:4], k[:4], v[:4], causal=causal)
    out_b, lse_b = both(q[4:], k[4:], v[4:], causal=causal)
    assert torch.equal(out, torch.cat([out_a, out_b]))
    assert torch.equal(lse, torch.cat([lse_a, lse_b]))
    if device == "cuda":  # and the bits are right
        assert_close(out[:1], attention_ref(q[:1], k[:1], v[:1], causal=causal)[0], dtype,
                     *tolerance(device, dtype))


_ALONE_CPU = [dict(split_size=s, kw=kw, D=64) for s in SPLITS
              for kw in [{}, {"causal": True}, {"window_size": (100, 3)}]]
_ALONE_GPU = [dict(split_size=s, kw="mods", D=D) for s in (128, 512, 1024) for D in (64, 128, 256)]


@pytest.mark.parametrize("device,case", on_devices(cpu=_ALONE_CPU, cuda=_ALONE_GPU))
def test_sequence_alone_vs_in_batch(device, case):
    """One sequence alone and inside batches of other sizes, at other positions, with fresh
    neighbours."""
    set_deterministic_mode(True, split_size=case["split_size"])
    g = make_gen(101)
    if device == "cpu":
        Sq, Sk, H, Hk, dtype, spots = 200, 260, 4, 2, torch.bfloat16, [(2, 0), (3, 1), (5, 4)]
        kw = case["kw"]
    else:
        Sq, Sk, H, Hk, dtype, spots = 1000, 1500, 8, 2, torch.bfloat16, [(3, 1), (17, 16), (17, 0)]
    q1, k1, v1 = make_qkv(g, 1, Sq, Sk, H, Hk, case["D"], dtype, device)
    if device == "cuda":
        kw = dict(causal=True, softcap=20.0, alibi_slopes=make_alibi(g, (H,), device))
    alone, lse_alone = both(q1, k1, v1, **kw)
    for B, pos in spots:
        q, k, v = make_qkv(g, B, Sq, Sk, H, Hk, case["D"], dtype, device)  # fresh neighbours
        q[pos], k[pos], v[pos] = q1[0], k1[0], v1[0]
        out, lse = both(q, k, v, **kw)
        assert torch.equal(out[pos], alone[0]), f"B={B} pos={pos}"
        assert torch.equal(lse[pos], lse_alone[0]), f"B={B} pos={pos}"


@pytest.mark.parametrize("device", DEVICES)
def test_head_alone_vs_among_heads(device):
    """The bits of one head do not depend on how many other heads are in the call."""
    q, k, v = make_qkv(make_gen(102), 2, 90, 150, 6, 3, 32, torch.float16, device)
    out, lse = both(q, k, v, causal=True)
    for h in (0, 3, 5):
        hk = h // 2
        o1, l1 = both(q[:, :, h:h + 1], k[:, :, hk:hk + 1], v[:, :, hk:hk + 1], causal=True)
        assert torch.equal(o1[:, :, 0], out[:, :, h]) and torch.equal(l1[:, 0], lse[:, h])


_PREFILL_CPU = [dict(D=64, window=(-1, 0), split_size=s) for s in SPLITS]
_PREFILL_GPU = [dict(D=D, window=w, split_size=512) for D in (64, 128) for w in [(-1, 0), (1000, 0)]]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device,case", on_devices(cpu=_PREFILL_CPU, cuda=_PREFILL_GPU))
@pytest.mark.parametrize("rising", [False, True])
def test_prefill_vs_decode_vs_chunks(device, dtype, case, rising):
    """Causal: row t of the full prefill == decode of row t alone over keys [0, t] (on a GPU in
    every schedule) == the same row in any chunk [a, b) run over keys [0, b). rising: scores whose
    max moves by more than the rescale slack from tile to tile (conftest.rising_scores)."""
    set_deterministic_mode(True, split_size=case["split_size"])
    window = case["window"]
    if device == "cpu":
        N, H, Hk = 300, 4, 2
        rows = [0, 1, 63, 64, 127, 128, 129, 255, 256, 299]
        bounds, schedules = [0, 1, 37, 128, 129, 250, 300], ["auto"]
    else:
        N, H, Hk = 3000, 8, 2
        rows = [0, 1, 63, 64, 127, 128, 511, 512, 513, 1000, 2047, 2999]
        bounds, schedules = [0, 1, 100, 640, 641, 2000, 2999, 3000], ["auto", "one_cta", "cta_per_split"]
    q, k, v = make_qkv(make_gen(103), 2, N, N, H, Hk, case["D"], dtype, device)
    if rising:
        q, k = rising_scores(q, k)
    full, full_lse = both(q, k, v, causal=True, window_size=window)
    for t in rows:
        for sched in schedules:
            with force_schedule(sched):
                o, l = both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True,
                            window_size=window)
            assert torch.equal(o[:, 0], full[:, t]), f"decode row {t} ({sched})"
            assert torch.equal(l[:, :, 0], full_lse[:, :, t]), f"decode row {t} ({sched})"
    outs, lses = [], []
    for a, b in zip(bounds[:-1], bounds[1:]):
        o, l = both(q[:, a:b], k[:, :b], v[:, :b], causal=True, window_size=window)
        assert torch.equal(o, full[:, a:b]), f"chunk [{a}, {b})"
        outs.append(o), lses.append(l)
    assert torch.equal(torch.cat(outs, 1), full) and torch.equal(torch.cat(lses, 2), full_lse)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("split_size", SPLITS)
def test_chunked_prefill_with_window(device, split_size):
    """Rows [a, b) with k/v prefix [0, b) == the same rows of the full call, sliding window."""
    set_deterministic_mode(True, split_size=split_size)
    N, window = 300, (70, 0)
    q, k, v = make_qkv(make_gen(104), 2, N, N, 2, 1, 64, torch.bfloat16, device)
    full, full_lse = both(q, k, v, causal=True, window_size=window)
    for a, b in zip([0, 1, 37, 128, 129, 250], [1, 37, 128, 129, 250, 300]):
        o, l = both(q[:, a:b], k[:, :b], v[:, :b], causal=True, window_size=window)
        assert torch.equal(o, full[:, a:b]) and torch.equal(l, full_lse[:, :, a:b]), f"[{a}, {b})"


@pytest.mark.parametrize("device", DEVICES)
def test_decode_with_longer_cache_and_window(device):
    """A decode row with a sliding window sees the same keys whatever lies outside the window."""
    N, W = 400, 50
    q, k, v = make_qkv(make_gen(105), 1, N, N, 2, 2, 32, torch.float16, device)
    full, _ = both(q, k, v, causal=True, window_size=(W, 0))
    t = 350
    o, _ = both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True, window_size=(W, 0))
    assert torch.equal(o[:, 0], full[:, t])


@pytest.mark.parametrize("device,case", on_devices(cpu=[(2000, 4, 32)], cuda=[(2000, 8, 128)]))
def test_decode_batch_of_different_positions(device, case):
    """Decode rows of several sequences in one call equal each one decoded alone."""
    N, H, D = case
    q, k, v = make_qkv(make_gen(104), 4, N, N, H, 2, D, torch.float16, device)
    full, _ = both(q, k, v, causal=True)
    t = 1777
    o, _ = both(q[:, t:t + 1], k[:, :t + 1], v[:, :t + 1], causal=True)
    for b in range(4):
        ob, _ = both(q[b:b + 1, t:t + 1], k[b:b + 1, :t + 1], v[b:b + 1, :t + 1], causal=True)
        assert torch.equal(ob[0], o[b]) and torch.equal(o[b, 0], full[b, t])


@pytest.mark.parametrize("device,case", on_devices(
    cpu=[dict(shape=(3, 150, 400, 4, 2, 64), mods=True, reruns=4)],
    cuda=[dict(shape=(3, 1000, 3000, 16, 4, 128), mods=False, reruns=10)]))
def test_run_to_run(device, case):
    g = make_gen(106)
    q, k, v = make_qkv(g, *case["shape"], torch.bfloat16, device)
    kw = dict(causal=True)
    if case["mods"]:
        kw.update(softcap=10.0, alibi_slopes=make_alibi(g, (case["shape"][3],), device))
    first, first_lse = both(q, k, v, **kw)
    for _ in range(case["reruns"]):
        out, lse = both(q, k, v, **kw)
        assert torch.equal(out, first) and torch.equal(lse, first_lse)


@pytest.mark.parametrize("device", DEVICES)
def test_deterministic_kwarg_is_accepted_and_has_no_effect(device):
    q, k, v = make_qkv(make_gen(108), 2, 30, 60, 2, 2, 32, torch.float16, device)
    assert torch.equal(flash_attn_func(q, k, v, deterministic=True),
                       flash_attn_func(q, k, v, deterministic=False))


@pytest.mark.parametrize("name", ["auto", "one_cta", "cta_per_split"])
def test_cpu_ignores_schedule(name):
    q, k, v = make_qkv(make_gen(109), 2, 30, 300, 2, 2, 32, torch.bfloat16)
    set_deterministic_mode(True, split_size=128)
    base = flash_attn_func(q, k, v, causal=True)
    with force_schedule(name):
        assert torch.equal(flash_attn_func(q, k, v, causal=True), base)



@requires_cuda
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("kw", [{}, {"causal": True}, {"window_size": (700, 30)},
                                {"softcap": 10.0}, {"alibi": True}])
def test_schedules_bit_equal(D, kw):
    """One CTA per row block, one CTA per split plus the combine, and auto: the same bits."""
    kw = dict(kw)
    g = make_gen(102)
    q, k, v = make_qkv(g, 1, 200, 5000, 4, 2, D, torch.bfloat16, "cuda")
    if kw.pop("alibi", False):
        kw["alibi_slopes"] = make_alibi(g, (4,), "cuda")
    results = {}
    for name in ("one_cta", "cta_per_split", "auto"):
        with force_schedule(name):
            results[name] = both(q, k, v, **kw)
            if name == "auto":
                assert workspace_bytes(q, k) > 0, "auto did not pick the split schedule"
    for name in ("cta_per_split", "auto"):
        assert torch.equal(results[name][0], results["one_cta"][0]), name
        assert torch.equal(results[name][1], results["one_cta"][1]), name


@requires_cuda
def test_occupancy_does_not_matter():
    """Bits do not change when another stream keeps the GPU busy."""
    q, k, v = make_qkv(make_gen(106), 1, 256, 5000, 8, 8, 128, torch.bfloat16, "cuda")
    base = both(q, k, v, causal=True)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(20):
            a = a @ a / 64
    out = both(q, k, v, causal=True)
    torch.cuda.synchronize()
    assert torch.equal(out[0], base[0]) and torch.equal(out[1], base[1])


# The prefill kernel has a Hopper variant (wgmma, sm_90a build on an sm_90
# GPU) beside the mma.sync one; FLASH_ATTN_DET_WGMMA=0 turns it off for the
# process. Same tile walk, same fragments, and a wgmma chain rounds as the
# mma.sync chain it replaces (tests/test_wgmma_rounding.py), so both must give the
# same bits. On other GPUs (and with softcap, ALiBi or pages, which stay on mma.sync)
# both processes run the same kernel and the case holds trivially.
_VARIANT_CASES = [
    dict(D=64, Sq=700, Sk=3000, causal=False, dtype="bfloat16"),
    dict(D=128, Sq=700, Sk=3000, causal=True, dtype="bfloat16"),
    dict(D=128, Sq=513, Sk=2100, causal=False, dtype="float16"),
    dict(D=40, Sq=300, Sk=1500, causal=True, dtype="float16", window_size=(200, 5)),
    dict(D=72, Sq=400, Sk=1200, causal=False, dtype="bfloat16", window_size=(-1, 100)),
    dict(D=128, Sq=333, Sk=4000, causal=True, dtype="bfloat16", softcap=15.0),  # both mma.sync
    # the warp-specialized kernel's own walks: an odd count of 64-row blocks, a window that makes
    # its consumers start and end on different tiles, D < 128, query rows with no key
    dict(D=128, Sq=900, Sk=2500, causal=False, dtype="bfloat16", window_size=(300, 40)),
    dict(D=96, Sq=200, Sk=1000, causal=True, dtype="float16"),
    dict(D=128, Sq=600, Sk=200, causal=True, dtype="bfloat16"),
    # at D64 its lean variant's four consumers (FAD_WS_D64_MIN_SK, or _FULL without a causal or
    # right-window mask, <= keys <= FAD_WS_D64_LEAN_MAX_SK) and its FAD_WS_D64_CONSUMERS consumers
    # above: a last CTA with blocks empty, a window, rows with no key, dropout; below both,
    # fwd_kernel
    dict(D=64, Sq=900, Sk=2500, causal=False, dtype="bfloat16", window_size=(300, 40)),
    dict(D=64, Sq=600, Sk=200, causal=True, dtype="float16"),
    dict(D=64, Sq=900, Sk=4500, causal=False, dtype="bfloat16", window_size=(300, 40)),
    dict(D=64, Sq=4100, Sk=4100, causal=True, dtype="float16", dropout_p=0.1),
    dict(D=64, Sq=1000, Sk=8300, causal=False, dtype="bfloat16", window_size=(3000, 40)),
    dict(D=64, Sq=1100, Sk=8200, causal=True, dtype="float16", dropout_p=0.1),
    dict(D=64, Sq=700, Sk=16500, causal=True, dtype="bfloat16"),
    dict(D=64, Sq=300, Sk=1500, causal=False, dtype="float16"),
    # keys that grow along the sequence (x1 .. x20), so that a tile's max often passes the running
    # max by more than the rescale slack: the path of a two-tile unit whose second tile rescales acc
    dict(D=128, Sq=700, Sk=3000, causal=False, dtype="bfloat16", ramp=20.0),
    dict(D=128, Sq=1000, Sk=1000, causal=True, dtype="float16", ramp=20.0),
    dict(D=64, Sq=1000, Sk=1000, causal=True, dtype="bfloat16", ramp=20.0),
    # dropout: its own variants of each kernel (the wgmma ones drop on P once packed, the
    # mma.sync one on P in fp32), the same keep rule and the same bits
    dict(D=64, Sq=700, Sk=3000, causal=False, dtype="bfloat16", dropout_p=0.1),
    dict(D=128, Sq=900, Sk=2500, causal=True, dtype="float16", dropout_p=0.17, window_size=(300, 40)),
    dict(D=96, Sq=513, Sk=2100, causal=False, dtype="bfloat16", dropout_p=0.3),
    # D256 (193 .. 256): the warp-specialized kernel with two consumers, R's o in global memory
    # (from FAD_WS_D256_LONG_MIN_SK keys, 2048, a quarter of it in shared memory) and Q in
    # shared memory, K and V halves released apart; padded head dims, windows, rows with no
    # key, a ramp (rescales), dropout
    dict(D=256, Sq=700, Sk=3000, causal=False, dtype="bfloat16"),
    dict(D=256, Sq=900, Sk=2500, causal=True, dtype="float16", window_size=(300, 40)),
    dict(D=200, Sq=600, Sk=200, causal=True, dtype="bfloat16"),
    dict(D=256, Sq=1000, Sk=1000, causal=True, dtype="bfloat16", ramp=20.0),
    dict(D=232, Sq=513, Sk=2100, causal=False, dtype="float16", dropout_p=0.2),
]


def _variant_outputs():
    outs = []
    for i, case in enumerate(_VARIANT_CASES):
        case = dict(case)
        g = make_gen(300 + i)
        dtype = getattr(torch, case.pop("dtype"))
        D, Sq, Sk = case.pop("D"), case.pop("Sq"), case.pop("Sk")
        q, k, v = make_qkv(g, 2, Sq, Sk, 8, 2, D, dtype, "cuda")
        ramp = case.pop("ramp", None)
        if ramp:
            k = k * torch.linspace(1.0, ramp, Sk, device="cuda")[None, :, None, None].to(dtype)
        for sched in ("one_cta", "cta_per_split"):
            torch.manual_seed(1000 + i)  # dropout's seed and offset: the same in every process
            with force_schedule(sched):
                out, lse = both(q, k, v, **case)
            outs.append((out.cpu(), lse.cpu()))
    return outs


def _variant_outputs_in(tmp_path, **env):
    """_variant_outputs in a fresh process with env set (the switches are read once). The
    child starts in tests/, so it imports the flash_attn_det this process has, not a
    checkout's copy (without its built module) from the working directory."""
    import os
    import subprocess
    import sys
    path = tmp_path / "variant.pt"
    code = ("import sys, torch; sys.path.insert(0, %r); import test_contract; "
            "torch.save(test_contract._variant_outputs(), %r)" % (os.path.dirname(__file__),
                                                                  str(path)))
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, **env), check=True,
                   cwd=os.path.dirname(__file__))
    return torch.load(path)


def _tma_outputs():
    """The warp-specialized kernel's layouts (its producer copies whole K/V tiles through tensor
    maps, FLASH_ATTN_DET_WS_TMA): _VARIANT_CASES, then varlen sequences whose ends cut tiles,
    a KV cache read through cache_batch_idx and cache_leftpad, K/V views of a wider tensor (row
    stride 3 H D + 8), K/V whose batch stride is no whole number of rows (cp.async then), and one
    batch entry whose (unused) batch stride is none either."""
    import flash_attn_det as fad
    outs = _variant_outputs()
    g = make_gen(77)
    H, Hk, D = 8, 2, 128
    for causal in (False, True):
        lens = [1000, 64, 777, 128, 1]
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device="cuda")
        q = torch.randn(sum(lens), H, D, generator=g).to("cuda", torch.bfloat16)
        k = torch.randn(sum(lens), Hk, D, generator=g).to("cuda", torch.bfloat16)
        v = torch.randn(sum(lens), Hk, D, generator=g).to("cuda", torch.bfloat16)
        out, lse, _ = fad.flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=causal,
                                                 return_attn_probs=True)
        outs.append((out.cpu(), lse.cpu()))
    kc = torch.randn(4, 2048, Hk, D, generator=g).to("cuda", torch.float16)
    vc = torch.randn(4, 2048, Hk, D, generator=g).to("cuda", torch.float16)
    q = torch.randn(3, 300, H, D, generator=g).to("cuda", torch.float16)
    seqlens = torch.tensor([1000, 2000, 450], dtype=torch.int32, device="cuda")
    for kw in (dict(cache_batch_idx=torch.tensor([2, 0, 3], dtype=torch.int32, device="cuda")),
               dict(cache_leftpad=torch.tensor([0, 37, 5], dtype=torch.int32, device="cuda"))):
        out, lse = fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                               return_softmax_lse=True, **kw)
        outs.append((out.cpu(), lse.cpu()))
    wide = torch.randn(2, 1500, 3 * H * D + 8, generator=g).to("cuda", torch.bfloat16)
    q, k, v = (wide[:, :, i * H * D:(i + 1) * H * D].unflatten(-1, (H, D)) for i in range(3))
    outs.append(tuple(t.cpu() for t in both(q, k[:, :, :Hk], v[:, :, :Hk], causal=True)))
    flat = torch.randn(2 * (1500 * Hk * D + 64), generator=g).to("cuda", torch.bfloat16)
    k, v = (flat.as_strided((2, 1500, Hk, D), (1500 * Hk * D + 64, Hk * D, D, 1), off)
            for off in (0, 8))
    outs.append(tuple(t.cpu() for t in both(q, k, v)))
    # one batch entry: its batch stride (here no whole number of rows) is never used
    k1, v1 = (t.as_strided((1, 1500, Hk, D), (7, Hk * D, D, 1), t.storage_offset()) for t in (k, v))
    outs.append(tuple(t.cpu() for t in both(q[:1], k1, v1, causal=True)))
    return outs


@requires_cuda
def test_wgmma_and_mma_sync_variants_bit_equal(tmp_path):
    theirs = _variant_outputs_in(tmp_path, FLASH_ATTN_DET_WGMMA="0")
    mine = _variant_outputs()
    assert len(mine) == len(theirs) == 2 * len(_VARIANT_CASES)
    for i, ((o, l), (o2, l2)) in enumerate(zip(mine, theirs)):
        assert torch.equal(o, o2) and torch.equal(l, l2), f"case {i // 2} {('one_cta', 'cta_per_split')[i % 2]}"


@requires_cuda
def test_ws_tma_and_cp_async_bit_equal(tmp_path):
    """Whole K/V tiles through the copy engine (default) or cp.async (FLASH_ATTN_DET_WS_TMA=0):
    the same bytes in shared memory, so the same bits, on every layout the kernel takes."""
    import os
    import subprocess
    import sys
    path = tmp_path / "tma.pt"
    code = ("import sys, torch; sys.path.insert(0, %r); import test_contract; "
            "torch.save(test_contract._tma_outputs(), %r)" % (os.path.dirname(__file__), str(path)))
    subprocess.run([sys.executable, "-c", code], env=dict(os.environ, FLASH_ATTN_DET_WS_TMA="0"),
                   check=True, cwd=os.path.dirname(__file__))
    theirs = torch.load(path)
    mine = _tma_outputs()
    assert len(mine) == len(theirs) == 2 * len(_VARIANT_CASES) + 7
    for i, ((o, l), (o2, l2)) in enumerate(zip(mine, theirs)):
        assert torch.isfinite(o).all(), f"output {i}"
        assert torch.equal(o, o2) and torch.equal(l, l2), f"output {i}"
