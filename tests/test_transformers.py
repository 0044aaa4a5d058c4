"""flash_attn_det inside Hugging Face transformers through the one-line integration
(flash_attn_det.integrations.transformers, attn_implementation="deterministic"), on tiny random
models of two families built from configs (no downloads): Llama (GQA) and Gemma 2 (softcap,
sliding window, a query scale of its own). Checked: logits against eager; a prompt's logits alone
and inside a left- or right-padded batch and a packed row are the same bits; batched greedy
generation gives each prompt the tokens and logits it gets alone; decoding token by token from the
cache gives the bits of the full forward; gradients against eager, and bit-identical run to run.
Needs transformers (CI installs it); the CUDA cases run on the device."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from flash_attn_det.integrations import transformers as fad_tf  # noqa: E402

from conftest import DEVICES  # noqa: E402

NAME = fad_tf.NAME
VOCAB = 101


def _model(family, device, seed=0):
    common = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  attention_dropout=0.0)
    if family == "llama":
        cfg = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    else:  # softcap on the logits and scores, every other layer a sliding window of 8
        cfg = transformers.Gemma2Config(**common, head_dim=16, attn_logit_softcapping=30.0,
                                        final_logit_softcapping=20.0, sliding_window=8,
                                        query_pre_attn_scalar=24)
        cls = transformers.Gemma2ForCausalLM
    torch.manual_seed(seed)
    model = cls(cfg).to(device=device, dtype=torch.bfloat16).eval()
    model.set_attn_implementation(NAME)
    return model


def _batch(device, lens, L, side, seed=1):
    """(input_ids (B, L), attention_mask, position_ids) with prompts of `lens` padded to L."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lens), L), generator=g)
    mask = torch.zeros(len(lens), L, dtype=torch.long)
    for b, n in enumerate(lens):
        if side == "left":
            mask[b, L - n:] = 1
        else:
            mask[b, :n] = 1
    ids = ids.masked_fill(mask == 0, 0)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), pos.to(device)


def _rows(b, n, L, side):
    return slice(L - n, L) if side == "left" else slice(0, n)


FAMILIES = ["llama", "gemma2"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_logits_match_eager(device, family):
    model = _model(family, device)
    ids, mask, pos = _batch(device, [23, 17, 9], 23, "left")
    with torch.no_grad():
        out = model(ids, attention_mask=mask, position_ids=pos).logits.float()
        model.set_attn_implementation("eager")
        ref = model(ids, attention_mask=mask, position_ids=pos).logits.float()
    valid = mask.bool()
    err = (out - ref)[valid].abs().max().item()
    assert err <= 0.02 * ref[valid].abs().max().item(), err


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("side", ["left", "right"])
def test_prompt_alone_equals_in_padded_batch(device, family, side):
    model = _model(family, device)
    lens, L = [21, 13, 6], 21
    ids, mask, pos = _batch(device, lens, L, side)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=pos).logits
        for b, n in enumerate(lens):
            rows = _rows(b, n, L, side)
            alone = model(ids[b:b + 1, rows]).logits
            assert torch.equal(alone[0], batch[b, rows]), f"prompt {b}: bits differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_packed_row_equals_prompts_alone(device, family):
    model = _model(family, device)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(3, VOCAB, (1, n), generator=g).to(device) for n in (11, 16, 5)]
    packed = torch.cat(prompts, 1)
    pos = torch.cat([torch.arange(p.shape[1]) for p in prompts])[None].to(device)
    with torch.no_grad():
        out = model(packed, position_ids=pos).logits
        start = 0
        for p in prompts:
            n = p.shape[1]
            assert torch.equal(model(p).logits[0], out[0, start:start + n])
            start += n


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_batched_generate_equals_alone(device, family):
    model = _model(family, device)
    lens, L = [14, 9, 4], 14
    ids, mask, _ = _batch(device, lens, L, "left")
    kw = dict(max_new_tokens=8, do_sample=False, output_logits=True, return_dict_in_generate=True,
              pad_token_id=0)
    with torch.no_grad():
        batch = model.generate(ids, attention_mask=mask, **kw)
        for b, n in enumerate(lens):
            alone = model.generate(ids[b:b + 1, L - n:], **kw)
            assert torch.equal(alone.sequences[0, n:], batch.sequences[b, L:]), f"prompt {b}: tokens"
            for t, (la, lb) in enumerate(zip(alone.logits, batch.logits)):
                assert torch.equal(la[0], lb[b]), f"prompt {b}, step {t}: logits differ"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_decode_from_cache_equals_full_forward(device, family):
    model = _model(family, device)
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(3, VOCAB, (1, 20), generator=g).to(device)
    with torch.no_grad():
        full = model(ids).logits
        prefix = model(ids[:, :12], use_cache=True)
        assert torch.equal(prefix.logits[0], full[0, :12])
        cache = prefix.past_key_values
        for t in range(12, 20):
            step = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            cache = step.past_key_values
            assert torch.equal(step.logits[0, 0], full[0, t]), f"token {t}: bits differ"


def _grads(model, ids, mask, pos):
    model.zero_grad(set_to_none=True)
    logits = model(ids, attention_mask=mask, position_ids=pos).logits.float()
    loss = torch.nn.functional.cross_entropy(logits[mask.bool()][:-1],
                                             ids[mask.bool()][1:].clamp(max=VOCAB - 1))
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_match_eager_and_repeat_bitwise(device, family):
    model = _model(family, device).train()
    ids, mask, pos = _batch(device, [19, 12], 19, "right")
    g1, g2 = _grads(model, ids, mask, pos), _grads(model, ids, mask, pos)
    assert g1.keys() == g2.keys() and all(torch.equal(g1[n], g2[n]) for n in g1)
    model.set_attn_implementation("eager")
    ref = _grads(model, ids, mask, pos)
    for n, g in g1.items():
        err = (g.float() - ref[n].float()).norm() / ref[n].float().norm().clamp(min=1e-12)
        assert err < 0.05, f"{n}: relative error {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_dropout_in_training_is_seeded_and_batch_invariant(device, compiled, monkeypatch):
    """attention_dropout in training reaches flash_attn_det's dropout: torch.manual_seed
    reproduces the logits bit for bit, a new seed changes them, and a prompt gets the same
    bits alone as in a right-padded batch (the keep mask is keyed by positions, not rows).
    The same under torch.compile, whose attention ops draw as eager calls do: on the CPU the
    compiled logits are the eager ones (and frames that graph breaks or the recompile limit
    leave eager draw the masks the compiled frames would)."""
    model = _model("llama", device).train()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.25
    run = model
    if compiled:
        run = torch.compile(model, backend="aot_eager" if device == "cpu" else "inductor")
        # (room for every frame's recompiles: a frame past the limit runs eager, whose
        # non-attention ops round unlike inductor's, and the bits would compare those)
        monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 64)
        monkeypatch.setattr(torch._dynamo.config, "accumulated_recompile_limit", 1024)
    ids, mask, pos = _batch(device, [12, 7], 12, "right")

    def logits(seed, ids, mask, pos):
        torch.manual_seed(seed)
        with torch.no_grad():
            return run(ids, attention_mask=mask, position_ids=pos).logits

    a, b, c = logits(5, ids, mask, pos), logits(5, ids, mask, pos), logits(6, ids, mask, pos)
    assert torch.equal(a, b) and not torch.equal(a, c)
    if compiled and device == "cpu":  # (aot_eager keeps eager's math: the masks are shared)
        torch.manual_seed(5)
        with torch.no_grad():
            assert torch.equal(a, model(ids, attention_mask=mask, position_ids=pos).logits)
    model.eval()
    with torch.no_grad():
        no_drop = model(ids, attention_mask=mask, position_ids=pos).logits
    model.train()
    assert not torch.equal(a, no_drop)
    for i, n in enumerate([12, 7]):
        alone = logits(5, ids[i:i + 1, :n], mask[i:i + 1, :n], pos[i:i + 1, :n])
        assert torch.equal(alone[0], a[i, :n]), f"prompt {i}: alone != in the batch"


def test_register_refuses_a_name_with_flash():
    with pytest.raises(ValueError, match="^name:"):
        fad_tf.register("my_flash_det")
    assert fad_tf.register("det_attention_test") == "det_attention_test"
