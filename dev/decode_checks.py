# decode_checks.py: What dev/runs_check.py, dev/even_check.py and dev/shares_check.py share: a call against its other schedules and its repeats, and a float64 row. Verdict: tool.
"""Helpers of the decode bit checks (dev/runs_check.py, dev/even_check.py, dev/shares_check.py)."""
import torch


def schedule_faults(run, repeats):
    """run(**extra) -> (o, lse). Calls it once, then with num_splits=1 and `repeats` more times;
    returns (o, lse, faults): each a way the others' bits differ from the first's."""
    o, lse = run()
    faults = []
    o1, lse1 = run(num_splits=1)
    if not (torch.equal(o, o1) and torch.equal(lse, lse1)):
        faults.append("vs num_splits=1")
    for r in range(repeats):
        o2, lse2 = run()
        if not (torch.equal(o, o2) and torch.equal(lse, lse2)):
            faults.append(f"repeat {r}")
            break
    return o, lse, faults


def fp64_row(q_row, k, v, softcap=0.0):
    """Attention of one query row q_row (H, D) over keys k and v (n, Hk, D) in float64, the
    kv heads repeated for their H / Hk query heads; (H, D)."""
    H, D = q_row.shape
    groups = H // k.shape[1]
    k = k.double().repeat_interleave(groups, 1)
    v = v.double().repeat_interleave(groups, 1)
    s = torch.einsum("hd,nhd->hn", q_row.double(), k) / D ** 0.5
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    return torch.einsum("hn,nhd->hd", s.softmax(-1), v)
