"""The pytest plugin (-p fa_compat_plugin) for running flash_attn's test file on flash_attn_det (dev/fa_compat/run.sh).

With FA_SAMPLE=N, keeps a random sample of N of the file's parametrizations (FA_SEED, default
0), so a sample fits in one device call; FA_NO_DROPOUT=1 first deselects those with
dropout_p > 0. The counts are printed."""
import os
import random


def pytest_collection_modifyitems(config, items):
    keep, dropped = [], []
    no_dropout = os.environ.get("FA_NO_DROPOUT", "0") == "1"
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        (dropped if no_dropout and params.get("dropout_p", 0.0) else keep).append(item)
    n = int(os.environ.get("FA_SAMPLE", "0") or 0)
    total = len(keep)
    with_dropout = sum(1 for i in keep
                       if getattr(getattr(i, "callspec", None), "params", {}).get("dropout_p", 0.0))
    if n and n < len(keep):
        keep = sorted(random.Random(int(os.environ.get("FA_SEED", "0"))).sample(keep, n),
                      key=items.index)
    config.hook.pytest_deselected(items=[i for i in items if i not in set(keep)])
    items[:] = keep
    sel_dropout = sum(1 for i in keep
                      if getattr(getattr(i, "callspec", None), "params", {}).get("dropout_p", 0.0))
    print(f"\nfa_compat: {len(dropped)} dropout parametrizations deselected; {total} others "
          f"({with_dropout} with dropout), {len(keep)} selected ({sel_dropout} with dropout)")
