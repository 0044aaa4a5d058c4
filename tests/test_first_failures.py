"""The first things a new user passes, and what they get: an fp32 transformers model (runs, its
attention in bf16, with one warning naming how to choose), a head dim past 256 (an error that
says the limit), int64 index tensors (what torch.tensor([0, 3, 8]) gives: converted, same bits
as int32), token lists and a tokenizer's output in the invariance helpers (accepted)."""
import warnings

import pytest
import torch

from flash_attn_det import (flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache,
                            invariance)

from conftest import DEVICES


def _randn(g, shape, device, dtype=torch.bfloat16):
    return torch.randn(shape, generator=g).to(device=device, dtype=dtype)


# --- head dim past 256 ---------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("D", [257, 264, 300])
def test_head_dim_past_256_names_the_limit(device, D):
    g = torch.Generator().manual_seed(D)
    q = _randn(g, (1, 8, 2, D), device)
    with pytest.raises(ValueError, match=rf"^head_dim: must be at most 256 \(got {D}\)"):
        flash_attn_func(q, q, q)
    with pytest.raises(ValueError, match=r"^head_dim: must be at most 256"):
        cu = torch.tensor([0, 8], dtype=torch.int32, device=device)
        flash_attn_varlen_func(q[0], q[0], q[0], cu, cu, 8, 8)
    with pytest.raises(ValueError, match=r"^head_dim: must be at most 256"):
        flash_attn_with_kvcache(q[:, :1], q, q, cache_seqlens=8)


# --- int64 index tensors -----------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("grad", [False, True])
def test_int64_cu_seqlens_and_seqused_k_give_the_int32_bits(device, grad):
    g = torch.Generator().manual_seed(1)
    q, k, v = (_randn(g, (13, 4, 64), device) for _ in range(3))
    cu = [0, 5, 13]
    used = [4, 8]

    def run(idx_dtype):
        qq, kk, vv = (t.clone().requires_grad_(grad) for t in (q, k, v))
        out = flash_attn_varlen_func(
            qq, kk, vv, torch.tensor(cu, dtype=idx_dtype, device=device),
            torch.tensor(cu, dtype=idx_dtype, device=device), 8, 8, causal=True,
            seqused_k=torch.tensor(used, dtype=idx_dtype, device=device))
        if grad:
            out.float().square().sum().backward()
            return out, qq.grad, kk.grad, vv.grad
        return (out,)

    got, want = run(torch.int64), run(torch.int32)
    assert (got[0][:5] != 0).any()
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_int64_kvcache_indices_give_the_int32_bits(device):
    g = torch.Generator().manual_seed(2)
    q = _randn(g, (2, 1, 4, 64), device)
    pages = _randn(g, (6, 16, 2, 64), device), _randn(g, (6, 16, 2, 64), device)
    k_new, v_new = _randn(g, (2, 1, 2, 64), device), _randn(g, (2, 1, 2, 64), device)

    def run(idx_dtype):
        kc, vc = pages[0].clone(), pages[1].clone()
        idx = dict(cache_seqlens=torch.tensor([17, 3], dtype=idx_dtype, device=device),
                   block_table=torch.tensor([[4, 1], [0, 5]], dtype=idx_dtype, device=device))
        out = flash_attn_with_kvcache(q, kc, vc, k_new, v_new, causal=True, **idx)
        return out, kc, vc

    got, want = run(torch.int64), run(torch.int32)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not torch.equal(got[1], pages[0])  # the new keys were appended


def test_int64_cu_seqlens_under_torch_compile_fullgraph():
    g = torch.Generator().manual_seed(6)
    q = _randn(g, (8, 2, 64), "cpu")
    cu = torch.tensor([0, 3, 8])
    f = torch.compile(lambda q, cu: flash_attn_varlen_func(q, q, q, cu, cu, 5, 5, causal=True),
                      fullgraph=True)
    assert torch.equal(f(q, cu), flash_attn_varlen_func(q, q, q, cu.int(), cu.int(), 5, 5,
                                                        causal=True))


def test_int64_past_int32_is_refused_naming_the_argument():
    g = torch.Generator().manual_seed(3)
    q = _randn(g, (8, 2, 64), "cpu")
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(ValueError, match="^cu_seqlens_k: int64 values past int32"):
        flash_attn_varlen_func(q, q, q, cu, torch.tensor([0, 2 ** 32]), 8, 8)
    with pytest.raises(TypeError, match="^cu_seqlens_q: expected dtype int32, got float32"):
        flash_attn_varlen_func(q, q, q, cu.float(), cu, 8, 8)  # other dtypes: refused as before


# --- an fp32 transformers model --------------------------------------------------------------

def test_fp32_transformers_model_runs_in_bf16_with_one_warning(monkeypatch):
    transformers = pytest.importorskip("transformers")
    from flash_attn_det.integrations import transformers as fad_tf
    monkeypatch.setattr(fad_tf, "_warned_fp32", False)
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation=fad_tf.NAME)
    model.eval()
    assert next(model.parameters()).dtype == torch.float32  # from_config's default
    ids = torch.randint(3, 101, (2, 11), generator=torch.Generator().manual_seed(5))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            logits = model(ids).logits
            again = model(ids).logits
    # (batch invariance is not asserted: an fp32 model's matmuls are its own, outside ours)
    assert torch.equal(logits, again)
    ours = [w for w in caught if "flash_attn_det" in str(w.message)]
    assert len(ours) == 1 and "dtype=torch.bfloat16" in str(ours[0].message)
    assert logits.dtype == torch.float32
    model.set_attn_implementation("eager")
    with torch.no_grad():
        ref = model(ids).logits
    err = (logits - ref).abs().max().item()
    assert 0 < err <= 0.02 * ref.abs().max().item(), err  # bf16 attention, not fp32's bits


# --- token lists in the invariance helpers ---------------------------------------------------

def _embed_fn():
    """A batch-invariant fn of token ids: a fixed embedding, per token."""
    table = torch.randn(50, 3, generator=torch.Generator().manual_seed(4))
    return lambda ids, mask, pos: table[ids] * (pos[..., None] + 1)


@pytest.mark.parametrize("side", ["right", "left", "packed"])
def test_invariance_helpers_take_token_lists(side):
    fn = _embed_fn()
    lists = [[5, 7, 9, 11], [3, 4], [8]]
    invariance.assert_batch_invariant(fn, lists, side=side)
    assert not invariance.find_divergence(fn, lists, index=1, side=side)
    as_tensors = invariance.as_sequences(lists)
    assert [t.tolist() for t in as_tensors] == lists and as_tensors[0].dtype == torch.long


def test_invariance_helpers_take_a_tokenizers_output():
    fn = _embed_fn()
    plain = {"input_ids": [[5, 7, 9], [3, 4]], "attention_mask": [[1, 1, 1], [1, 1]]}
    padded = {"input_ids": torch.tensor([[0, 5, 7, 9], [0, 0, 3, 4]]),  # return_tensors="pt"
              "attention_mask": torch.tensor([[0, 1, 1, 1], [0, 0, 1, 1]])}
    for enc in (plain, padded):
        assert [t.tolist() for t in invariance.as_sequences(enc)] == [[5, 7, 9], [3, 4]]
        invariance.assert_batch_invariant(fn, enc)


def test_invariance_helpers_refuse_what_is_no_batch():
    fn = _embed_fn()
    with pytest.raises(TypeError, match=r"^sequences: got one list of ints.*tokenizer\(prompts\)"):
        invariance.assert_batch_invariant(fn, [5, 7, 9])
    for bad in ("5 7 9", [], None):
        with pytest.raises(TypeError, match="^sequences: expected a non-empty list"):
            invariance.assert_batch_invariant(fn, bad)
    with pytest.raises(TypeError, match=r"^sequences\[1\]: expected a tensor or a list of ints"):
        invariance.assert_batch_invariant(fn, [[5, 7], ["a"]])
