"""torch.compile(fullgraph=True) traces the entry points as custom ops (flash_attn_det/ops.py):
no graph break, the same bits as eager, and gradients through the registered autograd."""
import pytest
import torch

import flash_attn_det as fad

from conftest import HAS_CUDA, make_gen, randn


def _grads(fn, *inputs):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    y = fn(*xs)
    y.backward()
    return y.detach(), [x.grad for x in xs]


def test_compile_fullgraph_func_forward_and_backward_cpu():
    gen = make_gen(31)
    q, k, v = (randn(gen, (2, 40, h, 32), torch.bfloat16) for h in (4, 2, 2))

    def block(q, k, v):
        return fad.flash_attn_func(q, k, v, causal=True, softcap=4.0).float().square().sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    y_c, g_c = _grads(compiled, q, k, v)
    y_e, g_e = _grads(block, q, k, v)
    assert torch.equal(y_c, y_e)
    assert all(torch.equal(a, b) for a, b in zip(g_c, g_e))


def test_compile_fullgraph_varlen_cpu():
    gen = make_gen(32)
    q = randn(gen, (80, 2, 32), torch.float16)
    cu = torch.tensor([0, 30, 80], dtype=torch.int32)

    def block(q):
        out = fad.flash_attn_varlen_func(q, q, q, cu, cu, 50, 50, causal=True)
        return out.float().sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    y_c, g_c = _grads(compiled, q)
    y_e, g_e = _grads(block, q)
    assert torch.equal(y_c, y_e) and torch.equal(g_c[0], g_e[0])


def test_custom_ops_pass_opcheck_cpu():
    gen = make_gen(33)
    q, k, v = (randn(gen, (1, 16, 2, 32), torch.bfloat16) for _ in range(3))
    torch.library.opcheck(torch.ops.flash_attn_det.fwd.default,
                          (q, k, v, 0.17, True, -1, 0, 0.0, None),
                          test_utils=("test_schema", "test_faketensor"))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_compile_fullgraph_inference_gpu():
    gen = make_gen(34)
    q, k, v = (randn(gen, (2, 300, h, 128), torch.bfloat16, "cuda") for h in (8, 2, 2))

    def block(q, k, v):
        return fad.flash_attn_func(q, k, v, causal=True) * 2

    with torch.no_grad():
        y_c = torch.compile(block, fullgraph=True)(q, k, v)
        assert torch.equal(y_c, block(q, k, v))


@pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")
def test_compile_fullgraph_training_gpu():
    """Inductor, fullgraph: the GPU backward through the registered autograd gives the eager
    bits. (The ops are opaque to inductor; the loss is a sum it may reduce in another order, so
    the loss is compared to roundoff and the gradients, which do not go through that
    reduction, bit for bit.)"""
    gen = make_gen(35)
    q, k, v = (randn(gen, (2, 200, h, 64), torch.bfloat16, "cuda") for h in (8, 2, 2))

    def block(q, k, v):
        return fad.flash_attn_func(q, k, v, causal=True, window_size=(64, 0)).float().square().sum()

    compiled = torch.compile(block, fullgraph=True)
    y_c, g_c = _grads(compiled, q, k, v)
    y_e, g_e = _grads(block, q, k, v)
    torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=0)
    assert all(torch.equal(a, b) for a, b in zip(g_c, g_e))
    assert all(float(g.abs().max()) > 0 for g in g_c)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if HAS_CUDA else []))
def test_compile_fullgraph_kvcache_decode(device):
    """A decode step with append + rotary through torch.compile(fullgraph=True): the eager
    bits, and the cache written in place as eagerly."""
    gen = make_gen(36)
    B, H, Hk, D = 2, 4, 2, 64
    q, k, v = (randn(gen, (B, 1, h, D), torch.bfloat16, device) for h in (H, Hk, Hk))
    caches = [[randn(gen, (B, 64, Hk, D), torch.bfloat16, device) for _ in range(2)]]
    caches.append([c.clone() for c in caches[0]])
    k_before = caches[0][0].clone()
    cos, sin = (randn(gen, (128, 16), torch.float32, device) for _ in range(2))
    lens = torch.tensor([5, 40], dtype=torch.int32, device=device)

    def step(q, k, v, kc, vc):
        return fad.flash_attn_with_kvcache(q, kc, vc, k=k, v=v, rotary_cos=cos, rotary_sin=sin,
                                           cache_seqlens=lens, causal=True) * 2

    backend = "aot_eager" if device == "cpu" else "inductor"
    with torch.no_grad():
        y_c = torch.compile(step, fullgraph=True, backend=backend)(q, k, v, *caches[0])
        y_e = step(q, k, v, *caches[1])
    assert torch.equal(y_c, y_e)
    assert torch.equal(caches[0][0], caches[1][0]) and torch.equal(caches[0][1], caches[1][1])
    written = (caches[0][0] != k_before).any(dim=(2, 3))  # (B, rows): the appended row only
    assert written.nonzero().tolist() == [[0, 5], [1, 40]] and y_c.abs().max() > 0


# ---------------------------------------------------------------------------------------
# Dropout under torch.compile: the forward op draws its (seed, offset) when it runs, as an
# eager call draws (torch's generator on the host), and hands the pair to its backward op; so
# every call of the compiled code draws anew, torch.manual_seed reproduces it, and compiled
# and eager code (frames a graph break or the recompile limit leaves eager) share masks.
# ---------------------------------------------------------------------------------------

_COMPILE_DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


def _dropout_inputs(device):
    gen = make_gen(37)
    return [randn(gen, (2, 70, h, 32), torch.bfloat16, device) for h in (4, 2, 2)]


def _seeded_grads(fn, seed, q, k, v):
    torch.manual_seed(seed)
    return _grads(fn, q, k, v)


@pytest.mark.parametrize("device", _COMPILE_DEVICES)
def test_compile_dropout_equals_eager_under_the_same_seed(device):
    """Under the same torch.manual_seed, compiled fwd + bwd (fixed-length and varlen, two
    calls per step, so the second draws after the first) give the eager bits, and leave the
    generator where eager leaves it."""
    q, k, v = _dropout_inputs(device)
    cu = torch.tensor([0, 30, 70], dtype=torch.int32, device=device)

    def block(q, k, v):
        y = fad.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
        y = fad.flash_attn_func(y, k, v, dropout_p=0.25)
        return y.float().square().sum()

    def block_varlen(q, k, v):
        y = fad.flash_attn_varlen_func(q[0], k[0], v[0], cu, cu, 40, 40, dropout_p=0.25)
        y = fad.flash_attn_varlen_func(y, k[0], v[0], cu, cu, 40, 40, dropout_p=0.25,
                                       causal=True)
        return y.float().square().sum()

    def next_draw():
        return torch.randint(0, 2 ** 62, (1,), device=device).item()

    backend = "aot_eager" if device == "cpu" else "inductor"
    for fn in (block, block_varlen):
        torch._dynamo.reset()
        y_c, g_c = _seeded_grads(torch.compile(fn, fullgraph=True, backend=backend), 7, q, k, v)
        after_c = next_draw()
        y_e, g_e = _seeded_grads(fn, 7, q, k, v)
        after_e = next_draw()
        if device == "cpu":
            assert torch.equal(y_c, y_e)
        else:  # (inductor may sum the loss in another order: the gradients are compared)
            torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=0)
        assert all(torch.equal(a, b) for a, b in zip(g_c, g_e)), fn.__name__
        assert after_c == after_e, fn.__name__
        # (and dropout acted: another seed gives another loss)
        assert not torch.equal(y_e, _seeded_grads(fn, 8, q, k, v)[0])


@pytest.mark.parametrize("backend", ["aot_eager", "aot_eager_decomp_partition"])
def test_compile_two_dropout_calls_on_the_same_inputs_draw_twice_cpu(backend):
    """Two calls with equal arguments (MC dropout) are two draws in compiled code as in eager:
    AOTAutograd's CSE would fold them into one if each had no tensor of its own."""
    q, k, v = _dropout_inputs("cpu")

    def twice(q, k, v):
        a = fad.flash_attn_func(q, k, v, dropout_p=0.3)
        b = fad.flash_attn_func(q, k, v, dropout_p=0.3)
        return torch.stack((a, b))

    torch._dynamo.reset()
    torch.manual_seed(4)
    c = torch.compile(twice, backend=backend, fullgraph=True)(q, k, v)
    torch.manual_seed(4)
    e = twice(q, k, v)
    assert not torch.equal(c[0], c[1]) and torch.equal(c, e)


@pytest.mark.parametrize("device", _COMPILE_DEVICES)
def test_compile_dropout_with_activation_checkpointing(device):
    """torch.utils.checkpoint around a dropout call in compiled code: the recomputed forward
    drops what the forward dropped. The check needs no knowledge of the mask: out = P_d V is
    linear in V, so for loss = <out, W> each (batch, head, feature) column has
    sum_j v_jd dv_jd = sum_i out_id W_id exactly when the backward's mask is the forward's.
    (Torch's partitioner runs a recomputed seeded op on its own generator state on CUDA, so
    the masks need not be eager's there; on the CPU they are, and the gradients too.)"""
    from torch.utils.checkpoint import checkpoint
    gen = make_gen(39)
    q, k, v = (randn(gen, (2, 70, 2, 32), torch.bfloat16, device) for _ in range(3))
    w = randn(gen, (2, 70, 2, 32), torch.float32, device)

    def layer(q, k, v):
        return fad.flash_attn_func(q, k, v, dropout_p=0.3, causal=True)

    def block(q, k, v):
        out = checkpoint(layer, q, k, v, use_reentrant=False)
        return (out.float() * w).sum(), out

    backend = "aot_eager" if device == "cpu" else "inductor"
    torch._dynamo.reset()
    runs = {}
    for name, fn in (("compiled", torch.compile(block, backend=backend)), ("eager", block)):
        qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
        torch.manual_seed(3)
        loss, out = fn(qq, kk, vv)
        loss.backward()
        runs[name] = (out.detach(), qq.grad, kk.grad, vv.grad)
        lhs = (vv.detach().float() * vv.grad.float()).sum(1)  # (B, H, D)
        terms = out.detach().float() * w
        rhs, scale = terms.sum(1), terms.abs().sum(1)
        assert ((lhs - rhs).abs() <= 3e-2 * scale + 1e-3).all(), name
    if device == "cpu":
        assert all(torch.equal(a, b) for a, b in zip(runs["compiled"], runs["eager"]))


def test_compile_dropout_draws_anew_and_follows_manual_seed_cpu():
    q, k, v = _dropout_inputs("cpu")

    def block(q, k, v):
        return fad.flash_attn_func(q, k, v, dropout_p=0.2).float().square().sum()

    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    runs = []
    for s in (5, 5, 6):
        torch.manual_seed(s)
        runs.append(_grads(compiled, q, k, v))
    (y5, g5), (y5b, g5b), (y6, _) = runs
    assert torch.equal(y5, y5b) and all(torch.equal(a, b) for a, b in zip(g5, g5b))
    assert not torch.equal(y5, y6)
    torch.manual_seed(5)
    assert not torch.equal(compiled(q, k, v), compiled(q, k, v))  # each call draws anew


@pytest.mark.parametrize("kw", [dict(return_attn_probs=True), dict(dropout_seq_ids=3)],
                         ids=["s_dmask", "seq_ids"])
def test_compile_dropout_refusals_cpu(kw):
    """What is worked out on the host -- S_dmask, the sequence ids' checks -- is refused under
    torch.compile with the argument named."""
    q, k, v = _dropout_inputs("cpu")

    def block(q, k, v):
        return fad.flash_attn_func(q, k, v, dropout_p=0.2, **kw)

    name = next(iter(kw))
    with pytest.raises(Exception, match=name):
        torch.compile(block, fullgraph=True, backend="aot_eager")(q, k, v)


def test_custom_ops_with_dropout_pass_opcheck_cpu():
    gen = make_gen(38)
    q, k, v = (randn(gen, (1, 16, 2, 32), torch.bfloat16) for _ in range(3))
    torch.library.opcheck(torch.ops.flash_attn_det.fwd.default,
                          (q, k, v, 0.17, True, -1, 0, 0.0, None, 0.3),
                          test_utils=("test_schema", "test_faketensor"))
    pair = torch.tensor([11, 22])
    dout, out = (randn(gen, (1, 16, 2, 32), torch.bfloat16) for _ in range(2))
    lse = torch.randn(1, 2, 16)
    torch.library.opcheck(torch.ops.flash_attn_det.bwd.default,
                          (dout, q, k, v, out, lse, 0.17, True, -1, 0, 0.0, None, 0.3, pair),
                          test_utils=("test_schema", "test_faketensor"))
