"""The attention score rule in torch ops (scale, softcap, ALiBi, window mask), shared by the
product's S_dmask and the float64 reference in flash_attn_det.testing."""
import torch


def masked_scores(qd, kd, scale, softcap, slopes, pos, j, left, right):
    """Scores of rows at key positions pos ((rows, 1)) against keys j ((1, Sk)), as
    flash_attn_det defines them: q.k * scale, softcap * tanh(. / softcap) when softcap > 0,
    minus slopes * |pos - j| (ALiBi, slopes broadcastable to (B, H, 1, 1) or None), and -inf
    where the window (left, right; -1 unbounded) hides the key. qd (..., rows, D), kd
    (..., Sk, D), in the dtype the scores are computed in. The one torch copy of the rule:
    S_dmask (interface._s_dmask) and testing.attention_ref both use it."""
    s = torch.matmul(qd, kd.transpose(-1, -2)) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    if slopes is not None:
        s = s - slopes * (pos - j).abs().to(s.dtype)
    mask = torch.zeros((pos.shape[0], j.shape[1]), dtype=torch.bool, device=s.device)
    if left >= 0:
        mask |= j < pos - left
    if right >= 0:
        mask |= j > pos + right
    return s.masked_fill(mask, float("-inf"))
