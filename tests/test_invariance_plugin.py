"""flash_attn_det.invariance and its pytest plugin: the batch-invariance
assertion passes on a model that keeps it and fails, naming the sequence, on one that does not;
the divergence finder names the op that breaks it (forward and backward) and finds none where
nothing breaks; the `invariance` fixture comes from the installed entry point."""
import importlib.metadata

import pytest
import torch

from flash_attn_det import invariance as inv

from conftest import DEVICES


class _Scale(torch.nn.Module):
    """x * w + b per feature: a layer with parameters and no matrix product (a CPU GEMM's bits
    may depend on the batch size, which is what the finder is for, but not what a test of the
    helpers may rely on)."""

    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(n))
        self.b = torch.nn.Parameter(torch.randn(n))

    def forward(self, x):
        return x * self.w + self.b


class _Toy(torch.nn.Module):
    """Embedding -> per-feature layer and GELU -> flash_attn_det attention -> per-feature head:
    batch-invariant; with `leak`, a step scales its input when the batch holds more than one row
    (what a batch-dependent kernel does, in one visible op)."""

    def __init__(self, leak=False):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 32)
        self.mlp = torch.nn.Sequential(_Scale(32), torch.nn.GELU())
        self.head = _Scale(32)
        self.leak = leak

    def forward(self, ids, mask, pos):
        import flash_attn_det as fad
        x = self.mlp(self.emb(ids))
        x = x * (1.0001 if self.leak and ids.shape[0] > 1 else 1.0)  # the same op either way
        B, L, _ = x.shape
        q = x.to(torch.bfloat16).view(B, L, 2, 16)
        if mask is not None and not bool(mask.all()):  # padded: varlen on the real tokens
            from flash_attn_det.bert_padding import pad_input, unpad_input
            qu, idx, cu, mx, _ = unpad_input(q, mask)
            a = pad_input(fad.flash_attn_varlen_func(qu, qu, qu, cu, cu, mx, mx, causal=True),
                          idx, B, L)
        elif mask is None:  # packed: sequences restart their positions
            starts = (pos[0] == 0).nonzero().reshape(-1)
            cu = torch.cat((starts, torch.tensor([L], device=pos.device))).to(torch.int32)
            mx = int(cu.diff().max())
            a = fad.flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, mx, mx, causal=True)[None]
        else:
            a = fad.flash_attn_func(q, q, q, causal=True)
        return self.head(a.reshape(B, L, 32).float())  # (B, L, 32)


def _seqs(device):
    g = torch.Generator().manual_seed(5)
    return [torch.randint(1, 50, (n,), generator=g).to(device) for n in (9, 14, 5)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("side", inv.SIDES)
def test_invariant_model_passes(device, side):
    model = _Toy().to(device)
    inv.assert_batch_invariant(model, _seqs(device), side=side)


@pytest.mark.parametrize("side", ["left", "right"])
def test_leaking_model_fails_naming_the_sequence(side):
    with pytest.raises(AssertionError, match="^sequence 0: alone and in the batch"):
        inv.assert_batch_invariant(_Toy(leak=True), _seqs("cpu"), side=side)


def test_finder_names_the_op_that_breaks_it():
    model = _Toy(leak=True)
    found = inv.find_divergence(model, _seqs("cpu"), index=1, side="right", modules=[model])
    assert found and found.op == "mul" and found.phase == "forward", found
    assert "inputs bit-equal" in repr(found)


def test_finder_in_backward_and_none_where_nothing_breaks():
    model = _Toy()
    loss = lambda ids, mask, pos: model(ids, mask, pos)[..., 0].sum()  # noqa: E731
    found = inv.find_divergence(loss, _seqs("cpu"), index=0, side="left", backward=True,
                                modules=[model])
    # the loss itself sums over the batch (an op whose output is not the sequence's own), but no
    # op with comparable inputs and outputs differs
    assert found.compared > 20
    assert not found, found
    leaky = _Toy(leak=True)
    loss = lambda ids, mask, pos: leaky(ids, mask, pos)[..., 0].sum()  # noqa: E731
    found = inv.find_divergence(loss, _seqs("cpu"), index=0, side="left", backward=True,
                                modules=[leaky])
    assert found and found.phase == "forward", found


def test_run_to_run():
    model = _Toy()
    ids = _seqs("cpu")[1][None]
    inv.assert_run_to_run(lambda: model(ids, torch.ones_like(ids), None))
    calls = iter(range(10))
    with pytest.raises(AssertionError, match="^run 1"):
        inv.assert_run_to_run(lambda: torch.tensor([float(next(calls))]))


def test_the_plugin_is_installed_and_gives_the_fixture(request):
    eps = importlib.metadata.entry_points(group="pytest11")
    if not any(ep.value == "flash_attn_det.pytest_plugin" for ep in eps):
        pytest.skip("flash_attn_det is not pip-installed here (the entry point comes with it)")
    assert request.getfixturevalue("invariance") is inv
