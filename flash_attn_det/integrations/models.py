"""A whole transformers model on batch-invariant blocks: every logit of a sequence the same
bits alone, in any batch, in a prefill, in chunks or token by token from the KV cache.

    from flash_attn_det.integrations.transformers import make_invariant
    model = make_invariant(AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16))

make_invariant puts, in place, the attention on flash_attn_det ("deterministic"), every
nn.Linear on flash_attn_det.blocks.linear and every RMSNorm of a known kind on
flash_attn_det.blocks.rms_norm. A module that owns parameters and is none of these (a
LayerNorm, a fused mixture-of-experts layer, a quantized linear) is refused by name before
anything changes: its kernels would break the promise silently.
The remaining ops of a decoder (embedding, rotary tables, activations, residual adds) are
elementwise or gathers: invariant as they are. For logprobs, use
flash_attn_det.blocks.token_logprobs / log_softmax / cross_entropy on the logits.
"""
import torch

from .. import blocks

# RMSNorm classes whose forward is weight * (x.float() * rsqrt(mean(x^2) + eps)).to(x.dtype)
# with the epsilon in variance_epsilon (transformers' Llama family).
_RMSNORM_KINDS = frozenset({
    "LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "MixtralRMSNorm",
    "Qwen2MoeRMSNorm", "Qwen3MoeRMSNorm", "Phi3RMSNorm", "GraniteRMSNorm", "OlmoRMSNorm",
    "Olmo2RMSNorm", "SmolLM3RMSNorm", "Ministral3RMSNorm",
})
_CLASSES = {}


def _linear_forward(self, x):
    return blocks.linear(x, self.weight, self.bias)


def _rmsnorm_forward(self, x):
    return blocks.rms_norm(x, self.weight, self.variance_epsilon)


def _invariant_class(cls, forward):
    """A subclass of cls whose forward is forward (one per class), so that state dicts,
    parameters, hooks and isinstance checks stay as they were."""
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Invariant{cls.__name__}", (cls,), {"forward": forward,
                                                                  "_fad_invariant": True})
    return _CLASSES[cls]


def _kind(mod):
    if getattr(type(mod), "_fad_invariant", False):
        return "done"
    if isinstance(mod, torch.nn.Linear):
        return "linear"
    if type(mod).__name__ in _RMSNORM_KINDS and hasattr(mod, "variance_epsilon"):
        return "rmsnorm"
    if isinstance(mod, torch.nn.Embedding) or not any(True for _ in mod.parameters(recurse=False)):
        return "as is"
    return None


def make_invariant(model):
    """Puts model (a transformers PreTrainedModel) on batch-invariant blocks, in place, and
    returns it. Raises ValueError naming every module it cannot make invariant (nothing is
    changed then)."""
    from . import transformers as _tf
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "set_attn_implementation"):
        raise TypeError("model: expected a transformers PreTrainedModel")
    kinds = [(name, mod, _kind(mod)) for name, mod in model.named_modules()]
    refused = [f"{name or '(the model)'} ({type(mod).__name__})" for name, mod, k in kinds if k is None]
    if refused:
        raise ValueError("model: these modules own parameters and have no batch-invariant "
                         f"version here: {', '.join(refused[:8])}"
                         + (f" and {len(refused) - 8} more" if len(refused) > 8 else ""))
    model.set_attn_implementation(_tf.NAME)
    for _, mod, k in kinds:
        if k == "linear":
            mod.__class__ = _invariant_class(type(mod), _linear_forward)
        elif k == "rmsnorm":
            mod.__class__ = _invariant_class(type(mod), _rmsnorm_forward)
    return model
