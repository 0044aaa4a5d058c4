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
