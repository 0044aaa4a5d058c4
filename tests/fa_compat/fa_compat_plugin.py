"""The pytest plugin (-p fa_compat_plugin) that runs flash_attn's test file on flash_attn_det
(tests/fa_compat/run.sh, and a CPU-sized sample in tests/test_fa_compat.py).

The file parametrizes ~509k tests; expanding them costs minutes. So before pytest expands a test
function's parametrize marks, this plugin takes them off and draws FA_PER_FUNCTION (default 50)
combinations uniformly from their product (seed FA_SEED, default a fresh one, printed and handed
to xdist workers through the environment), which pytest then parametrizes as one list: only the
sampled items are ever built. FA_NO_DROPOUT=1 restricts dropout_p to 0; FA_DROPOUT_ONLY=1
restricts it to its nonzero values (a sample of the dropout tests alone). FA_DEVICE=cpu runs the
file on the CPU without touching a line of it: CUDA device arguments of torch calls become the
CPU through a TorchFunctionMode around each test, the file's capability queries answer sm_90,
and the sample keeps sequence lengths <= FA_CPU_MAX_SEQLEN (256) and head dims <= FA_CPU_MAX_D
(128) and leaves out dropout with a single query row (_cpu_row_ok says why). At the end it
prints each function's passed/failed/skipped; FA_LOG=path also appends each finished test's
outcome and node id (and a failure's last line, a skip's reason) to that file as it finishes, so
a run stopped by a time limit still names its failures. FA_COUNTS="name=N,..." gives named
functions their own sample size (the file skips some combinations itself, e.g. about half of
test_flash_attn_kvcache's: a larger sample there still runs 50). FA_RESUME=path (an FA_LOG of an
earlier run, same FA_SEED and counts) leaves out the tests it logged as passed, so a run cut off
by a time limit goes on where it stopped; the two logs together are the sample."""
import collections
import math
import os
import random
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

CPU = os.environ.get("FA_DEVICE", "cuda") == "cpu"
# functions a CPU sample leaves out: batch 60 for its race, or sizes with no length parameter
CPU_SKIP = {"test_flash_attn_race_condition", "test_flash_attn_bwd_varlen_overflow"}
_SEQLEN_NAMES = {"seqlen", "seqlen_q", "seqlen_k"}


def _seed():
    return int(os.environ["FA_SEED"])


class _CudaToCpu(TorchFunctionMode):
    """device='cuda' (str or torch.device) in any torch call, and .cuda(), go to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs["device"] = "cpu"
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.to:
            args = tuple("cpu" if isinstance(a, (str, torch.device)) and torch.device(a).type == "cuda"
                         else a for a in args)
        return func(*args, **kwargs)


class _Props:
    total_memory = 80 * 2 ** 30
    name = "flash_attn_det CPU"


def pytest_configure(config):
    if "FA_SEED" not in os.environ:  # the controller draws it; xdist workers inherit it
        os.environ["FA_SEED"] = str(random.SystemRandom().randrange(1 << 31))
    config._fa_counts = collections.defaultdict(collections.Counter)
    if CPU:  # the file's module level and skips ask the device: answer as an sm_90 GPU
        torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
        torch.cuda.get_device_properties = lambda *a, **k: _Props()
    if not hasattr(config, "workerinput"):
        print(f"fa_compat: FA_SEED={_seed()} FA_PER_FUNCTION="
              f"{os.environ.get('FA_PER_FUNCTION', '50')}" + (" FA_DEVICE=cpu" if CPU else ""),
              file=sys.stderr)


def _counts():
    """FA_COUNTS="name=N,...": per-function sample sizes over FA_PER_FUNCTION."""
    spec = os.environ.get("FA_COUNTS", "").strip()
    return {k.strip(): int(v) for k, v in (kv.split("=") for kv in spec.split(","))} if spec else {}


def _resumed():
    """Node ids FA_RESUME's log records as passed (empty without FA_RESUME)."""
    path = os.environ.get("FA_RESUME")
    if not path:
        return set()
    with open(path) as f:
        return {ln.split()[1] for ln in f if ln.startswith("passed ")}


def pytest_collection_modifyitems(session, config, items):
    done = _resumed()
    if not done:
        return
    keep = [it for it in items if it.nodeid not in done]
    config.hook.pytest_deselected(items=[it for it in items if it.nodeid in done])
    items[:] = keep


def _names(mark):
    names = mark.args[0] if mark.args else mark.kwargs["argnames"]
    return [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)


def _values(mark, names):
    vals = list(mark.args[1] if len(mark.args) > 1 else mark.kwargs["argvalues"])
    return [tuple(v) if len(names) > 1 else (v,) for v in vals]


def _fits(names, value):
    """Whether one mark's value tuple is allowed (FA_NO_DROPOUT; the CPU's sizes)."""
    for n, v in zip(names, value):
        if n == "dropout_p" and v and os.environ.get("FA_NO_DROPOUT", "0") == "1":
            return False
        if n == "dropout_p" and not v and os.environ.get("FA_DROPOUT_ONLY", "0") == "1":
            return False
        if CPU and n in _SEQLEN_NAMES and v > int(os.environ.get("FA_CPU_MAX_SEQLEN", "256")):
            return False
        if CPU and n == "d" and v > int(os.environ.get("FA_CPU_MAX_D", "128")):
            return False
    return True


def _cpu_row_ok(argnames, row):
    """Whether a whole parametrization may enter the CPU sample (per-mark limits: _fits).
    Dropout with seqlen_q = 1 (test_flash_attn_varlen_output's (1, 147)) may not: there the
    file's check abs(dropout_fraction - p) <= 0.01 counts 4 x 6 heads x 1 row x about 137 keys,
    about 3,300 draws, whose binomial sigma is 0.0066, so a fresh mask misses it about one time
    in five (18% of 300 seeds, simulated with flash_attn_det.dropout.keep_mask; 17 of 41 such
    CPU tests at FA_SEED=12345). The CPU path draws each test's seed from the CPU generator,
    whose state the test's own randn calls move, so every test gets a fresh mask. On CUDA the
    seed and offset are the generator's (flash_attn's convention), the same for each of these
    tests, so they share one mask and the GPU sample keeps them."""
    vals = dict(zip(argnames, row))
    return not (vals.get("dropout_p") and vals.get("seqlen_q") == 1)


def _draw(rng, total, n, ok):
    """n distinct indices of range(total), uniformly, among those ok() accepts (every one of
    them where n is 0 or at least total). Without ok, exactly rng.sample's draw, as before
    that rule."""
    if not n or total <= n:
        return [i for i in range(total) if ok is None or ok(i)]
    if ok is None:
        return sorted(rng.sample(range(total), n))
    picks, seen = [], set()
    while len(picks) < n and len(seen) < total:
        i = rng.randrange(total)
        if i not in seen:
            seen.add(i)
            if ok(i):
                picks.append(i)
    return sorted(picks)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    node = metafunc.definition
    marks = [m for m in node.own_markers if m.name == "parametrize"]
    if not marks:
        return
    node.own_markers = [m for m in node.own_markers if m.name != "parametrize"]
    axes = []  # per mark: (names, allowed value tuples)
    for m in marks:
        names = _names(m)
        axes.append((names, [v for v in _values(m, names) if _fits(names, v)]))
    name = metafunc.function.__name__
    total = math.prod(len(vals) for _, vals in axes)
    n = _counts().get(name, int(os.environ.get("FA_PER_FUNCTION", "50")))
    argnames = [a for names, _ in axes for a in names]

    def row_of(idx):  # index -> one value of every mark (mixed radix)
        row = ()
        for _, vals in axes:
            idx, r = divmod(idx, len(vals))
            row += vals[r]
        return row

    if total == 0 or (CPU and name in CPU_SKIP):
        picks = []
    else:
        rng = random.Random(f"{_seed()}:{name}")
        ok = (lambda i: _cpu_row_ok(argnames, row_of(i))) if CPU else None
        picks = _draw(rng, total, n, ok)
    rows = [row_of(idx) for idx in picks]
    if not rows:
        metafunc.parametrize(argnames, [pytest.param(*([None] * len(argnames)), marks=pytest.mark.skip(
            reason="fa_compat: no parametrization in this sample"))])
        return
    metafunc.parametrize(argnames, rows)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if not CPU:
        yield
        return
    with _CudaToCpu():
        yield


def pytest_sessionstart(session):
    global _CONFIG
    _CONFIG = session.config


def pytest_runtest_logreport(report):
    counts = _CONFIG._fa_counts[report.nodeid.split("::")[-1].split("[")[0]]
    if report.when == "call":
        counts[report.outcome] += 1
    elif report.outcome != "passed":  # a skip or an error in setup/teardown
        counts["skipped" if report.skipped else "error"] += 1
    # (under xdist every report reaches the controller too: the log is written there only)
    if os.environ.get("FA_LOG") and not hasattr(_CONFIG, "workerinput") and (
            report.when == "call" or report.outcome != "passed"):
        what = report.outcome if report.when == "call" else f"{report.outcome} in {report.when}"
        line = f"{what} {report.nodeid}"
        if report.failed:  # the exception's last line: OOM, a numeric mismatch, ...
            text = str(report.longrepr).strip().splitlines()
            line += f" :: {text[-1][:300] if text else ''}"
        elif report.skipped and isinstance(report.longrepr, tuple):  # (path, line, reason)
            line += f" :: {report.longrepr[2][:200]} (line {report.longrepr[1]})"
        with open(os.environ["FA_LOG"], "a") as f:
            f.write(line + "\n")


def pytest_terminal_summary(terminalreporter, config):
    counts = config._fa_counts
    if not counts:
        return
    terminalreporter.write_line(f"fa_compat (FA_SEED={_seed()}): per test function")
    for name in sorted(counts):
        c = counts[name]
        terminalreporter.write_line(
            f"  {name}: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"
            + (f", {c['error']} errors" if c["error"] else ""))
