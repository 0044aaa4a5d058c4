"""Test helpers for flash_attn_det: a float64 reference attention, a schedule override and a
batch-invariance assertion for users' own tests.

``attention_ref`` is the plain-math definition of what ``flash_attn_func``
computes (same masking, softcap, ALiBi and GQA rules), evaluated in float64 on
the inputs' device; the kernels are checked against it. ``force_schedule``
pins the CUDA split schedule so that tests can show it never changes bits.
"""
import contextlib

import torch

from . import _C
from . import dropout as _dropout
from . import mode as _mode
from .scores import masked_scores

_SCHEDULES = {
    "auto": _C.SCHEDULE_AUTO,
    "one_cta": _C.SCHEDULE_ONE_CTA,
    "cta_per_split": _C.SCHEDULE_CTA_PER_SPLIT,
}

# Bound on the float64 score block one chunk of query rows may hold (elements).
_MAX_SCORE_ELEMS = 1 << 25


def attention_ref(q, k, v, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                  alibi_slopes=None, upcast=True, dropout_p=0.0, dropout_mask=None):
    """Float64 attention with flash_attn's semantics.

    q (B, Sq, H, D), k/v (B, Sk, Hkv, D) with H % Hkv == 0. Causal and window
    masks are bottom-right aligned: row i sits at key position i + Sk - Sq and
    sees keys j in [pos - left, pos + right] (-1 unbounded; causal is right 0).
    score = q.k * softmax_scale; softcap > 0 -> softcap * tanh(score / softcap);
    then ALiBi adds -slope * |pos - j| (slopes (H,) or (B, H)).

    Returns (out float64 (B, Sq, H, D), lse float64 (B, H, Sq), natural log).
    Rows that see no key get out 0 and lse -inf. Long inputs are processed in
    chunks of query rows so the float64 score block stays bounded.
    upcast=False does the same math in q's dtype: what plain torch code computes,
    the peer that error bounds are measured against (results still float64).
    dropout_mask (bool, broadcastable to (B, H, Sq, Sk), True = kept) with dropout_p:
    the probabilities are masked and scaled by 1 / (1 - dropout_p) before P V (lse is
    that of the undropped scores); dropout_mask_of gives flash_attn_det's mask of a call.
    """
    B, Sq, H, D = q.shape
    Sk, Hk = k.shape[1], k.shape[2]
    if H % Hk:
        raise ValueError(f"attention_ref: {H} query heads are not a multiple of {Hk} kv heads")
    scale = D ** -0.5 if softmax_scale is None else float(softmax_scale)
    left, right = window_size
    if causal:
        right = 0
    dev = q.device
    ct = torch.float64 if upcast else q.dtype  # compute dtype
    kd = k.to(ct).transpose(1, 2).repeat_interleave(H // Hk, dim=1)  # (B, H, Sk, D)
    vd = v.to(ct).transpose(1, 2).repeat_interleave(H // Hk, dim=1)
    slopes = None
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(device=dev, dtype=ct)
        slopes = slopes.reshape(1, H) if slopes.dim() == 1 else slopes.reshape(B, H)
        slopes = slopes[:, :, None, None]
    out = torch.zeros((B, H, Sq, D), dtype=torch.float64, device=dev)
    lse = torch.full((B, H, Sq), float("-inf"), dtype=torch.float64, device=dev)
    if B == 0 or Sq == 0 or Sk == 0:
        return out.transpose(1, 2).contiguous(), lse
    j = torch.arange(Sk, device=dev)[None, :]
    chunk = max(1, _MAX_SCORE_ELEMS // max(1, B * H * Sk))
    for r0 in range(0, Sq, chunk):
        r1 = min(Sq, r0 + chunk)
        qd = q[:, r0:r1].to(ct).transpose(1, 2)  # (B, H, rows, D)
        pos = torch.arange(r0, r1, device=dev)[:, None] + (Sk - Sq)
        s = masked_scores(qd, kd, scale, softcap, slopes, pos, j, left, right)
        m = torch.logsumexp(s, dim=-1)  # -inf for rows that see nothing
        seen = torch.isfinite(m)
        p = torch.exp(s - torch.where(seen, m, torch.zeros_like(m))[..., None])
        p = torch.where(seen[..., None], p, torch.zeros_like(p))
        if dropout_mask is not None:
            keep = dropout_mask.expand(B, H, Sq, Sk)[:, :, r0:r1]
            p = torch.where(keep, p / (1.0 - dropout_p), torch.zeros_like(p))
        out[:, :, r0:r1] = torch.matmul(p, vd)
        lse[:, :, r0:r1] = m
    return out.transpose(1, 2).contiguous(), lse


def dropout_mask_of(dropout, H, Sq, Sk, device="cpu", seq_ids=None):
    """flash_attn_det's keep mask of a padded call with dropout = (dropout_p, seed, offset)
    or the tuple _C takes, (dropout_p, seed, offset, seq_ids, seed_offset), whose int64 (2,)
    seed_offset tensor (a captured call's pair, dropout.draw_captured) then gives them:
    bool (1, H, Sq, Sk), the same for every sequence of the batch, or with seq_ids (the
    call's dropout_seq_ids, one int per sequence) (B, H, Sq, Sk), sequence b's by its id.
    Take (seed, offset) from flash_attn_det.dropout.draw(q, dropout_p) just before the
    call: it reads them without advancing the generator."""
    p = dropout[0]
    seed, offset = _dropout.seed_offset(dropout)
    rows = torch.arange(Sq, device=device) + (Sk - Sq)
    heads, keys = torch.arange(H, device=device), torch.arange(Sk, device=device)
    return torch.stack([_dropout.keep_mask(p, seed, offset, heads, rows, keys, int(i))
                        for i in ([0] if seq_ids is None else seq_ids)])


@contextlib.contextmanager
def force_schedule(name):
    """Within the block, every CUDA call uses schedule ``name``.

    name: "auto" (chosen from the grid and the SM count), "one_cta" (every
    split of a row in one CTA) or "cta_per_split" (one CTA per split plus a
    combine kernel). The previous schedule is restored on exit.
    """
    try:
        value = _SCHEDULES[name]
    except KeyError:
        raise ValueError(f"force_schedule: unknown schedule {name!r}; "
                         f"expected one of {sorted(_SCHEDULES)}") from None
    saved = _mode.set_schedule(value)
    try:
        yield
    finally:
        _mode.set_schedule(saved)


def assert_batch_invariant(fn, *batched, splits=None):
    """Asserts that fn's output for each batch element is bit-identical whether the element
    runs alone, inside the full batch, or inside smaller batches.

    fn(*tensors) -> tensor (or tuple of tensors), batch on dim 0 of every input and output.
    splits: batch sizes to cut the batch into (default: each element alone).
    For a model's attention layer in a pytest:

        assert_batch_invariant(lambda q, k, v: flash_attn_func(q, k, v, causal=True), q, k, v)
    """
    def as_tuple(x):
        return x if isinstance(x, tuple) else (x,)

    full = as_tuple(fn(*batched))
    B = batched[0].shape[0]
    sizes = splits or [1] * B
    if sum(sizes) != B:
        raise ValueError(f"splits: must add up to the batch size {B}, got {sizes}")
    start = 0
    for n in sizes:
        part = as_tuple(fn(*(t[start:start + n] for t in batched)))
        for idx, (f, p) in enumerate(zip(full, part)):
            if not torch.equal(f[start:start + n], p):
                diff = (f[start:start + n].float() - p.float()).abs().max().item()
                raise AssertionError(
                    f"output {idx}: batch elements [{start}, {start + n}) differ between the full "
                    f"batch and a batch of {n} (max abs diff {diff:.3g})")
        start += n
