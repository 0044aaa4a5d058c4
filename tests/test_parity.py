"""A whole transformers model on batch-invariant blocks (make_invariant): the sampler's
logprobs (generate: left-padded batch, KV cache, chunked prefill) equal the trainer's bit for
bit (each sequence alone, a right-padded batch, packed), and per-sequence input gradients do
not depend on the batch. Modules with no invariant version are refused by name."""
import pytest
import torch

transformers = pytest.importorskip("transformers")

from flash_attn_det.integrations.transformers import make_invariant  # noqa: E402
from flash_attn_det.parity import gradient_check, parity_check, random_prompts  # noqa: E402

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _model(kind, device):
    if kind == "llama":
        cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2)
    else:  # Qwen2: biases on q, k, v; tied embeddings
        cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256,
                                       num_hidden_layers=2, num_attention_heads=4,
                                       num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return make_invariant(model.to(device).eval())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("chunk", [None, 16])
def test_sampler_trainer_parity(device, kind, chunk):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _model(kind, device)
    prompts = random_prompts(6 if device == "cpu" else 16, 3, 40, 512)
    report = parity_check(model, prompts, max_new_tokens=5, prefill_chunk_size=chunk)
    assert report["tokens"] == len(prompts) * 5
    assert report["mismatches"] == {"alone": 0, "padded_batch": 0, "padded_with_grad": 0,
                                    "packed": 0}, report


@pytest.mark.parametrize("device", DEVICES)
def test_gradients_per_sequence(device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model = _model("llama", device)
    ids = torch.randint(1, 512, (4, 24), generator=torch.Generator().manual_seed(4)).to(device)
    r = gradient_check(model, ids)
    assert r["grad_abs_max"] > 0
    assert r["differ_split"] == 0 and r["differ_alone"] == 0, r


def test_make_invariant_refuses_unknown_modules_by_name():
    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    model = transformers.GPT2LMHeadModel(cfg)
    before = {n: type(m) for n, m in model.named_modules()}
    with pytest.raises(ValueError, match=r"ln_1 \(LayerNorm\)"):
        make_invariant(model)
    assert before == {n: type(m) for n, m in model.named_modules()}  # nothing changed
    with pytest.raises(TypeError, match="model"):
        make_invariant(torch.nn.Linear(2, 2))


def test_make_invariant_keeps_weights_and_is_idempotent():
    model = _model("llama", "cpu")
    sd = {k: v.clone() for k, v in model.state_dict().items()}
    make_invariant(model)
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items())
    assert type(model.model.layers[0].mlp.up_proj).__name__ == "InvariantLinear"
    assert isinstance(model.model.layers[0].mlp.up_proj, torch.nn.Linear)
