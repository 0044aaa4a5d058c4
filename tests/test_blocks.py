"""The batch-invariant building blocks (flash_attn_det.blocks): each against a float64
reference on fresh random inputs, and each row's bits the same alone and among other rows
(any row count, any offset), forward and backward, on the CPU and the GPU."""
import pytest
import torch

from flash_attn_det import _C, blocks

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
DTYPES = [torch.bfloat16, torch.float16]


def _skip_no_cuda(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


def _rel(a, ref):
    return float((a.detach().double() - ref.detach()).norm() / ref.detach().norm())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bias", [False, True])
def test_linear_matches_reference_and_rows_invariant(device, dtype, bias):
    _skip_no_cuda(device)
    N, K, M = (96, 64, 70) if device == "cpu" else (1536, 1024, 1100)
    g = torch.Generator().manual_seed(N + K + bias)
    x = torch.randn(M, K, generator=g).to(device, dtype)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, dtype)
    b = torch.randn(N, generator=g).to(device, dtype) if bias else None
    y = torch.full((M, N), float("nan"), device=device, dtype=dtype)
    y.copy_(blocks.linear(x, w, b))
    ref = x.double() @ w.double().T + (b.double() if bias else 0)
    assert not y.isnan().any()
    assert _rel(y, ref) < 1e-2
    for start, m in [(0, 1), (0, 2), (3, 7), (5, 64), (1, M - 1), (17, 100)]:
        assert torch.equal(blocks.linear(x[start:start + m], w, b), y[start:start + m]), (start, m)
    # a 3-D batch whose rows are the same rows
    assert torch.equal(blocks.linear(x[:60].view(3, 20, K), w, b).view(60, N), y[:60])


@pytest.mark.parametrize("device", DEVICES)
def test_linear_backward_per_row(device):
    _skip_no_cuda(device)
    N, K, M = (48, 32, 40) if device == "cpu" else (1024, 512, 700)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, K, generator=g).to(device, torch.bfloat16).requires_grad_(True)
    w = (torch.randn(N, K, generator=g) / K ** 0.5).to(device, torch.bfloat16).requires_grad_(True)
    dy = torch.randn(M, N, generator=g).to(device, torch.bfloat16)
    blocks.linear(x, w).backward(dy)
    ref_dx = dy.double() @ w.double()
    ref_dw = dy.double().T @ x.double()
    assert _rel(x.grad, ref_dx) < 1e-2 and _rel(w.grad, ref_dw) < 1e-2
    dx_full, dw_full = x.grad.clone(), w.grad.clone()
    for start, m in [(0, 1), (4, 9), (2, M - 2)]:
        xs = x.detach()[start:start + m].clone().requires_grad_(True)
        blocks.linear(xs, w.detach()).backward(dy[start:start + m])
        assert torch.equal(xs.grad, dx_full[start:start + m]), (start, m)
    # the weight gradient: the same bits run to run
    x.grad = w.grad = None
    blocks.linear(x, w).backward(dy)
    assert torch.equal(w.grad, dw_full)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(device, dtype):
    _skip_no_cuda(device)
    M, D = (33, 200) if device == "cpu" else (3000, 1536)
    g = torch.Generator().manual_seed(5)
    x = (torch.randn(M, D, generator=g) * 3).to(device, dtype)
    w = torch.randn(D, generator=g).to(device, dtype)
    y = blocks.rms_norm(x, w, 1e-6)
    xd = x.double()
    ref = w.double() * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert _rel(y, ref) < 1e-2
    for start, m in [(0, 1), (7, 5), (1, M - 1)]:
        assert torch.equal(blocks.rms_norm(x[start:start + m], w, 1e-6), y[start:start + m])
    # backward: dx per row, against autograd in float64
    xg = x.clone().requires_grad_(True)
    dy = torch.randn(M, D, generator=g).to(device, dtype)
    blocks.rms_norm(xg, w, 1e-6).backward(dy)
    xr = x.double().requires_grad_(True)
    (w.double() * xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(dy.double())
    assert _rel(xg.grad, xr.grad) < 2e-2
    for start, m in [(0, 1), (3, 10)]:
        xs = x[start:start + m].clone().requires_grad_(True)
        blocks.rms_norm(xs, w, 1e-6).backward(dy[start:start + m])
        assert torch.equal(xs.grad, xg.grad[start:start + m])
    # the weight's gradient (blocks of rows, a partial last one): against float64, and the
    # same bits run to run; dx the same bits with and without it
    wg = w.clone().requires_grad_(True)
    xg2 = x.clone().requires_grad_(True)
    blocks.rms_norm(xg2, wg, 1e-6).backward(dy)
    wr = w.double().requires_grad_(True)
    xd = x.double()
    (wr * xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(dy.double())
    assert _rel(wg.grad, wr.grad) < 2e-2
    assert torch.equal(xg2.grad, xg.grad)
    dw1 = wg.grad
    wg.grad = None
    blocks.rms_norm(x, wg, 1e-6).backward(dy)
    assert torch.equal(wg.grad, dw1)
    # no weight
    xn = x.clone().requires_grad_(True)
    blocks.rms_norm(xn, None, 1e-6).backward(dy)
    xr.grad = None
    (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6)).backward(dy.double())
    assert _rel(xn.grad, xr.grad) < 2e-2


@pytest.mark.parametrize("device", DEVICES)
def test_log_softmax_and_cross_entropy(device):
    _skip_no_cuda(device)
    M, V = (20, 1000) if device == "cpu" else (600, 151936)
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(M, V, generator=g) * 4).to(device, torch.bfloat16)
    t = torch.randint(0, V, (M,), generator=g).to(device)
    lp = blocks.log_softmax(x)
    assert lp.dtype == torch.float32
    assert _rel(lp, torch.log_softmax(x.double(), -1)) < 1e-6
    tl = blocks.token_logprobs(x, t)
    assert torch.equal(tl, lp.gather(1, t[:, None]).squeeze(1))
    for start, m in [(0, 1), (5, 3)]:
        assert torch.equal(blocks.log_softmax(x[start:start + m]), lp[start:start + m])
        assert torch.equal(blocks.token_logprobs(x[start:start + m], t[start:start + m]),
                           tl[start:start + m])
    # the same values in fp32 (generate's copies of the logits) give the same bits
    assert torch.equal(blocks.log_softmax(x.float()), lp)
    assert torch.equal(blocks.token_logprobs(x.float(), t), tl)
    # a row that starts off 16-byte alignment (read element by element) gives the same bits
    xo = torch.empty(M, V + 1, dtype=x.dtype, device=device)[:, 1:]
    xo.copy_(x)
    assert torch.equal(blocks.log_softmax(xo), lp)
    lse_o, lse_x = (torch.empty(M, device=device) for _ in range(2))
    stream = blocks._stream(x)
    _C.row_reduce(2, blocks._dl(xo), None, blocks._dl(lse_o), stream)  # (the C entry: no copy)
    _C.row_reduce(2, blocks._dl(x), None, blocks._dl(lse_x), stream)
    assert torch.equal(lse_o, lse_x)
    ce = blocks.cross_entropy(x, t)
    assert abs(float(ce) - float(torch.nn.functional.cross_entropy(x.double(), t))) < 1e-4
    # gradients: per row with reduction="sum"; against float64
    xg = x.clone().requires_grad_(True)
    blocks.cross_entropy(xg, t, reduction="sum").backward()
    xr = x.double().requires_grad_(True)
    torch.nn.functional.cross_entropy(xr, t, reduction="sum").backward()
    assert _rel(xg.grad, xr.grad) < 1e-2
    xs = x[2:5].clone().requires_grad_(True)
    blocks.cross_entropy(xs, t[2:5], reduction="sum").backward()
    assert torch.equal(xs.grad, xg.grad[2:5])
    xo = xo.detach().requires_grad_(True)
    blocks.cross_entropy(xo, t, reduction="sum").backward()
    assert torch.equal(xo.grad, xg.grad)
    # log_softmax's own backward
    xg.grad = None
    dy = torch.randn(M, V, generator=g).to(device)
    blocks.log_softmax(xg).backward(dy)
    xr.grad = None
    torch.log_softmax(xr, -1).backward(dy.double())
    assert _rel(xg.grad, xr.grad) < 1e-2
    # ignore_index rows count for nothing
    t2 = t.clone()
    t2[::2] = -100
    assert torch.equal(blocks.cross_entropy(x, t2, reduction="none")[::2],
                       torch.zeros(len(t2[::2]), device=device))


@pytest.mark.parametrize("device", DEVICES)
def test_row_reduce_dot(device):
    """The C API's DOT reduction (x of one type, y of another): against float64, and each
    row's bits the same in any slice of the rows."""
    _skip_no_cuda(device)
    g = torch.Generator().manual_seed(13)
    x = torch.randn(50, 1000, generator=g).to(device, torch.bfloat16)
    y = torch.randn(50, 1000, generator=g).to(device)
    out = torch.full((50,), float("nan"), device=device)
    stream = blocks._stream(x)
    _C.row_reduce(1, blocks._dl(x), blocks._dl(y), blocks._dl(out), stream)
    ref = (x.double() * y.double()).sum(-1)
    assert _rel(out, ref) < 1e-5
    part = torch.full((7,), float("nan"), device=device)
    _C.row_reduce(1, blocks._dl(x[20:27]), blocks._dl(y[20:27]), blocks._dl(part), stream)
    assert torch.equal(part, out[20:27])


@pytest.mark.parametrize("device", DEVICES)
def test_row_reduce_edge_rows(device):
    _skip_no_cuda(device)
    x = torch.randn(4, 300).to(device)
    x[0] = float("-inf")
    x[1, 7] = float("nan")
    x[2, 9] = float("inf")
    lse = blocks.logsumexp(x)
    assert lse[0] == float("-inf") and lse[1].isnan() and lse[2] == float("inf")
    assert torch.allclose(lse[3], torch.logsumexp(x[3].double(), 0).float())


def test_argument_errors():
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="in_features"):
        blocks.linear(x, torch.randn(3, 9, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="weight"):
        blocks.linear(x, torch.randn(3, 8, dtype=torch.float16))
    with pytest.raises(ValueError, match="bias"):
        blocks.linear(x, torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="weight"):
        blocks.rms_norm(x, torch.randn(7, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="target"):
        blocks.cross_entropy(x, torch.zeros(3, dtype=torch.long))
    from flash_attn_det import _C
    out = torch.empty(4)
    with pytest.raises(ValueError, match="op"):
        _C.row_reduce(5, x, None, out, 0)
    with pytest.raises(ValueError, match="out"):
        _C.row_reduce(0, x, None, torch.empty(3), 0)
    c = torch.full((4, 3), 7.0, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="b: inner"):
        _C.gemm(x, torch.randn(3, 9, dtype=torch.bfloat16), c, None, 0, 1, 0)
    assert torch.equal(c, torch.full((4, 3), 7.0, dtype=torch.bfloat16))  # nothing written


@pytest.mark.parametrize("device", DEVICES)
def test_forward_bits_with_and_without_autograd(device):
    """The inference paths (C's linear entry, no autograd nodes) and the training paths give
    the same forward bits: a sampler and a trainer see the same numbers."""
    _skip_no_cuda(device)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(5, 7, 64, generator=g).to(device, torch.bfloat16)
    w = torch.nn.Parameter((torch.randn(128, 64, generator=g) / 8).to(device, torch.bfloat16))
    b = torch.nn.Parameter(torch.randn(128, generator=g).to(device, torch.bfloat16))
    nw = torch.nn.Parameter(torch.randn(64, generator=g).to(device, torch.bfloat16))
    logits = torch.randn(5, 7, 300, generator=g).to(device, torch.bfloat16)
    t = torch.randint(0, 300, (5, 7), generator=g).to(device)
    with torch.no_grad():
        plain = (blocks.linear(x, w, b), blocks.linear(x[:, -1:], w, b), blocks.rms_norm(x, nw),
                 blocks.token_logprobs(logits, t), blocks.log_softmax(logits))
    xg, lg = x.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    graded = (blocks.linear(xg, w, b), blocks.linear(xg[:, -1:], w, b), blocks.rms_norm(xg, nw),
              blocks.token_logprobs(lg, t), blocks.log_softmax(lg))
    for a, c in zip(plain, graded):
        assert c.grad_fn is not None and torch.equal(a, c.detach())


def test_rms_norm_bwd_arguments():
    x = torch.randn(20, 8, dtype=torch.bfloat16)
    s = torch.ones(20)
    dx = torch.full((20, 8), 7.0, dtype=torch.bfloat16)
    w = torch.ones(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dw_part"):  # 20 rows are 2 blocks, not 1
        _C.rms_norm_bwd(x, x, w, s, dx, torch.empty(1, 8), 0)
    with pytest.raises(ValueError, match="dw_part"):  # a weight gradient needs the weight
        _C.rms_norm_bwd(x, x, None, s, dx, torch.empty(2, 8), 0)
    with pytest.raises(ValueError, match="dy"):
        _C.rms_norm_bwd(x, x[:, :4], w, s, dx, None, 0)
    assert torch.equal(dx, torch.full((20, 8), 7.0, dtype=torch.bfloat16))  # nothing written
