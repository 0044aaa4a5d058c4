"""The pytest plugin (-p fa_compat_plugin) for running flash_attn's test file on flash_attn_det (dev/fa_compat/run.sh).

Deselects the parametrizations that use dropout (dropout_p > 0: not implemented by
flash_attn_det yet, issue 22 item 4) and, with FA_SAMPLE=N, keeps a random sample of N of the
rest (FA_SEED, default 0), so a sample fits in one device call. The counts are printed."""
import os
import random


def pytest_collection_modifyitems(config, items):
    keep, dropped = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        (dropped if params.get("dropout_p", 0.0) else keep).append(item)
    n = int(os.environ.get("FA_SAMPLE", "0") or 0)
    total = len(keep)
    if n and n < len(keep):
        keep = sorted(random.Random(int(os.environ.get("FA_SEED", "0"))).sample(keep, n),
                      key=items.index)
    config.hook.pytest_deselected(items=[i for i in items if i not in set(keep)])
    items[:] = keep
    print(f"\nfa_compat: {len(dropped)} dropout parametrizations deselected; "
          f"{total} others, {len(keep)} selected")
