"""flash_attn_det as a Hugging Face transformers (5.x) attention implementation.

    import flash_attn_det.integrations.transformers   # registers "deterministic"
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="deterministic")

(or `register(name)` for another name). The name holds no "flash": transformers reads any
implementation name containing "flash" as a kernels-hub repository and tries to download it
(`is_flash_attention_requested` is a substring test).

What it registers, through transformers' public interfaces:
- `AttentionInterface`: `attention_forward`, transformers' flash_attention_2 path on
  flash_attn_det. A 2D padding mask unpads q/k/v into flash_attn_varlen_func (right and
  left padding, KV-cache decode); packed sequences (`position_ids` restarting, or
  `cu_seq_lens_q/k` + `max_length_q/k` kwargs) run varlen with no padding; otherwise
  flash_attn_func. Sliding window, softcap, scaling, GQA, causal or not; autograd.
- `AttentionMaskInterface`: transformers' own `flash_attention_mask` (the 2D padding mask,
  or None), the mask the flash_attention_2 path gets.

So a sequence gets the bits flash_attn_det gives it alone, inside a padded or packed batch,
and from a prefill or token by token from the cache (deterministic mode). Attention dropout
(the `dropout` transformers passes, 0 outside training) is flash_attn_det's batch-invariant
dropout: a sequence is dropped the same way alone and in a batch (flash_attn_det.dropout).
"""
import warnings

import torch

import flash_attn_det as _fad
from flash_attn_det.bert_padding import index_first_axis, pad_input, unpad_input

NAME = "deterministic"


_HALF = (torch.float16, torch.bfloat16)
_warned_fp32 = False


def _target_dtype(query, module):
    """The half dtype to run an fp32 query in: the autocast dtype, else the dtype of the
    module's first Linear weight when it is half (PEFT casts layer norms to fp32), as
    transformers' flash-attention path picks it; None when query is half. An fp32 model (the
    default of from_config and from_pretrained) runs its attention in bf16, with one warning
    naming how to choose: the kernels are fp16/bf16 only, and a model that does not run at all
    helps no one; the bits still obey the batch-invariance contract. Returns (dtype, the dtype
    to give the output back in: fp32 for an fp32 model's o_proj, else None)."""
    global _warned_fp32
    if query.dtype != torch.float32:
        return None, None
    if torch.is_autocast_enabled(query.device.type):
        return torch.get_autocast_dtype(query.device.type), None
    weight = next((m.weight.dtype for m in module.modules() if isinstance(m, torch.nn.Linear)),
                  None)
    if weight in _HALF:
        return weight, None
    if not _warned_fp32:
        _warned_fp32 = True
        warnings.warn(
            "flash_attn_det: this model is fp32 and its attention runs in bf16 (the kernels take "
            "fp16/bf16; the rest of the model stays fp32). Load it in half precision "
            "(from_pretrained(..., dtype=torch.bfloat16), or model.to(torch.bfloat16)) or run it "
            "under torch.autocast to choose the dtype yourself", UserWarning, stacklevel=3)
    return torch.bfloat16, torch.float32


def _unpad(q, k, v, mask, Lq):
    """transformers' _upad_input on flash_attn_det's bert_padding: q/k/v rows of the tokens the
    2D mask keeps (query rows: the last Lq positions, which assumes left padding when
    1 < Lq < Lk). Returns (q, k, v, indices_q, cu_q, cu_k, max_q, max_k)."""
    if k.shape[1] > mask.shape[-1]:  # a static cache longer than the mask
        k, v = k[:, :mask.shape[-1]], v[:, :mask.shape[-1]]
    B, Lk = k.shape[:2]
    k, indices_k, cu_k, max_k, _ = unpad_input(k, mask)
    v = index_first_axis(v.reshape(B * Lk, *v.shape[2:]), indices_k)
    if Lq == Lk:
        q = index_first_axis(q.reshape(B * Lq, *q.shape[2:]), indices_k)
        return q, k, v, indices_k, cu_k, cu_k, max_k, max_k
    if Lq == 1:
        cu_q = torch.arange(B + 1, dtype=torch.int32, device=q.device)
        return q.squeeze(1), k, v, cu_q[:-1], cu_q, cu_k, 1, max_k
    q, indices_q, cu_q, max_q, _ = unpad_input(q, mask[:, -Lq:])
    return q, k, v, indices_q, cu_q, cu_k, max_q, max_k


def _packed_cu_seqlens(position_ids):
    """cu_seqlens of sequences packed into one row, each restarting at the smallest position
    id; None unless position_ids (1, L) restart somewhere (transformers' _is_packed_sequence)."""
    if position_ids is None or position_ids.dim() != 2 or position_ids.shape[0] != 1:
        return None
    pos = position_ids.reshape(-1)
    starts = (pos == pos.min()).nonzero().reshape(-1)
    if starts.numel() <= 1:
        return None
    return torch.cat((starts, torch.tensor([pos.numel()], device=pos.device))).to(torch.int32)


def attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                      sliding_window=None, softcap=None, is_causal=None, **kwargs):
    """transformers' attention function: query (B, H, Lq, D), key/value (B, Hkv, Lk, D),
    attention_mask the 2D padding mask or None. Returns (out (B, Lq, H, D), None)."""
    if any(d == 0 for d in query.shape):
        raise ValueError(f"query: a zero dimension in shape {tuple(query.shape)}")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    dtype, out_dtype = _target_dtype(q, module)
    if dtype is not None:
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    D, Dv = q.shape[-1], v.shape[-1]
    if Dv != D:  # (MLA: a value head dim below the query's, padded as transformers' FA path does)
        v = torch.nn.functional.pad(v, (0, D - Dv))
    B, Lq = q.shape[:2]
    causal = module.is_causal if is_causal is None else is_causal
    kw = dict(softmax_scale=scaling, causal=causal, dropout_p=float(dropout or 0.0))
    if sliding_window is not None and k.shape[1] > sliding_window:
        kw["window_size"] = (sliding_window - 1, sliding_window - 1)  # (transformers' convention)
    if softcap is not None:
        kw["softcap"] = softcap
    cu_q, cu_k = kwargs.get("cu_seq_lens_q"), kwargs.get("cu_seq_lens_k")
    max_q, max_k = kwargs.get("max_length_q"), kwargs.get("max_length_k")
    if attention_mask is not None:
        qu, ku, vu, idx, cu_q, cu_k, max_q, max_k = _unpad(q, k, v, attention_mask, Lq)
        out = _fad.flash_attn_varlen_func(qu, ku, vu, cu_q, cu_k, int(max_q), int(max_k), **kw)
        out = pad_input(out, idx, B, Lq)
    else:
        if cu_q is None or cu_k is None or max_q is None or max_k is None:
            cu_q = cu_k = _packed_cu_seqlens(kwargs.get("position_ids")) if B == 1 else None
            if cu_q is not None:
                max_q = max_k = int(cu_q.diff().max())
        if cu_q is not None:  # packed: sequences flattened into one row, none attends another
            out = _fad.flash_attn_varlen_func(q.reshape(-1, *q.shape[2:]),
                                              k.reshape(-1, *k.shape[2:]),
                                              v.reshape(-1, *v.shape[2:]), cu_q.to(torch.int32),
                                              cu_k.to(torch.int32), int(max_q), int(max_k), **kw)
            out = out.view(B, -1, *out.shape[-2:])
        else:
            out = _fad.flash_attn_func(q, k, v, **kw)
    if out_dtype is not None:
        out = out.to(out_dtype)
    return (out[..., :Dv] if Dv != D else out), None


def register(name=NAME):
    """Registers flash_attn_det under `name` in transformers' AttentionInterface and
    AttentionMaskInterface; returns the name (pass it as attn_implementation)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import flash_attention_mask
    if "flash" in name:
        raise ValueError(f"name: {name!r} holds 'flash', which transformers reads as a kernels-hub "
                         "repository to download; pick a name without it")
    AttentionInterface.register(name, attention_forward)
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


register()


def make_invariant(model):
    """The whole model on batch-invariant blocks: flash_attn_det.integrations.models."""
    from .models import make_invariant as _make_invariant
    return _make_invariant(model)
