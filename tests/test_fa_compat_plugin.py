"""The plugin that runs flash_attn's test file (tests/fa_compat): it must prune each test
function's parametrizations before pytest builds items, to a seeded random sample of
FA_PER_FUNCTION each (FA_NO_DROPOUT dropping the dropout ones first), and report per-function
counts. Checked on a small stand-in file, in a subprocess (CPU, no flash_attn file needed)."""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

STAND_IN = '''
import pytest

@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("a", list(range(10)))
@pytest.mark.parametrize("b", list(range(6)))
def test_big(a, b, dropout_p):
    assert a != 3 or b != 3 or dropout_p == 0.0

@pytest.mark.parametrize("c", [1, 2])
def test_small(c):
    pass

@pytest.mark.parametrize("e", [1, 2, 3])
def test_skips(e):
    if e == 2:
        pytest.skip("two is skipped")
'''


ROWS_STAND_IN = '''
import pytest

@pytest.mark.parametrize("seqlen_q,seqlen_k", [(1, 147), (113, 203), (300, 300)])
@pytest.mark.parametrize("dropout_p", [0.0, 0.17])
@pytest.mark.parametrize("f", list(range(5)))
def test_rows(f, dropout_p, seqlen_q, seqlen_k):
    pass
'''


def _run(tmp_path, *args, text=STAND_IN, **env):
    (tmp_path / "test_standin.py").write_text(text)
    e = {k: v for k, v in os.environ.items() if not k.startswith("FA_")}
    e.update(env, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "fa_compat"), os.path.dirname(HERE)]))
    return subprocess.run([sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", "-p", "no:randomly", "-p", "fa_compat_plugin",
                           str(tmp_path / "test_standin.py"), *args],
                          capture_output=True, text=True, env=e, cwd=tmp_path, timeout=120)


def _selected(res):
    return sorted(re.findall(r"(test_\w+\[[^\]]*\])", res.stdout))


def test_sample_per_function_seeded_and_reported(tmp_path):
    a = _run(tmp_path, "--collect-only", "-q", FA_SEED="3", FA_PER_FUNCTION="7")
    assert a.returncode == 0, a.stdout + a.stderr
    sel = _selected(a)
    assert sum(s.startswith("test_big[") for s in sel) == 7
    assert sum(s.startswith("test_small[") for s in sel) == 2  # fewer than 7: all kept
    assert "FA_SEED=3" in a.stderr
    assert _selected(_run(tmp_path, "--collect-only", "-q", FA_SEED="3", FA_PER_FUNCTION="7")) == sel
    other = _run(tmp_path, "--collect-only", "-q", FA_SEED="4", FA_PER_FUNCTION="7")
    assert _selected(other) != sel
    fresh = _run(tmp_path, "--collect-only", "-q", FA_PER_FUNCTION="7")
    assert re.search(r"FA_SEED=\d+", fresh.stderr), "a fresh seed is printed"


def test_no_dropout_and_per_function_counts(tmp_path):
    res = _run(tmp_path, "-q", FA_SEED="5", FA_PER_FUNCTION="0", FA_NO_DROPOUT="1")
    assert res.returncode == 0, res.stdout
    assert "test_big: 60 passed, 0 failed, 0 skipped" in res.stdout
    assert "test_small: 2 passed, 0 failed, 0 skipped" in res.stdout
    assert "test_skips: 2 passed, 0 failed, 1 skipped" in res.stdout
    res = _run(tmp_path, "-q", FA_SEED="5", FA_PER_FUNCTION="0")
    assert "test_big: 119 passed, 1 failed, 0 skipped" in res.stdout


def test_log_names_each_outcome_as_it_finishes(tmp_path):
    log = tmp_path / "fa.log"
    res = _run(tmp_path, "-q", FA_SEED="5", FA_PER_FUNCTION="0", FA_LOG=str(log))
    assert res.returncode == 1, res.stdout
    lines = log.read_text().splitlines()
    assert len(lines) == 125  # each outcome once
    failed = [ln for ln in lines if ln.startswith("failed ")]
    assert len(failed) == 1 and "test_big[" in failed[0] and "AssertionError" in failed[0]
    assert sum(ln.startswith("passed ") for ln in lines) == 123
    skipped = [ln for ln in lines if ln.startswith("skipped ")]
    assert len(skipped) == 1 and "test_skips[2]" in skipped[0] and "two is skipped" in skipped[0]


def test_per_function_counts_and_resume(tmp_path):
    log = tmp_path / "first.log"
    res = _run(tmp_path, "-q", FA_SEED="5", FA_PER_FUNCTION="4", FA_COUNTS="test_big=9", FA_LOG=str(log))
    assert "test_big: " in res.stdout
    first = log.read_text().splitlines()
    assert sum("test_big[" in ln for ln in first) == 9
    assert sum("test_small[" in ln for ln in first) == 2
    # a run cut off after its first lines goes on from there: only the rest run
    cut = tmp_path / "cut.log"
    cut.write_text("\n".join(first[:5]) + "\n")
    log2 = tmp_path / "second.log"
    _run(tmp_path, "-q", FA_SEED="5", FA_PER_FUNCTION="4", FA_COUNTS="test_big=9", FA_RESUME=str(cut),
         FA_LOG=str(log2))
    second = log2.read_text().splitlines()
    passed_before = {ln.split()[1] for ln in first[:5] if ln.startswith("passed ")}
    assert passed_before and not passed_before & {ln.split()[1] for ln in second}
    assert sorted(first) == sorted([ln for ln in first[:5] if ln.split()[1] in passed_before] + second)


def test_cpu_sample_rules(tmp_path):
    """FA_DEVICE=cpu: no length above 256, and no dropout with a single query row (the file's
    dropout-fraction check is 1.5 sigma there: fa_compat_plugin._cpu_row_ok); a sample of n
    still has n items. The GPU sample keeps both."""
    cpu = _selected(_run(tmp_path, "--collect-only", "-q", text=ROWS_STAND_IN, FA_SEED="5",
                         FA_PER_FUNCTION="0", FA_DEVICE="cpu"))
    assert len(cpu) == 15 and not any("-300-" in s or s.endswith("-300]") for s in cpu)
    assert not any(s.startswith("test_rows[") and "-0.17-1-147" in s for s in cpu)
    assert sum("-0.0-1-147" in s for s in cpu) == 5  # seqlen_q 1 without dropout stays
    gpu = _selected(_run(tmp_path, "--collect-only", "-q", text=ROWS_STAND_IN, FA_SEED="5",
                         FA_PER_FUNCTION="0"))
    assert len(gpu) == 30 and sum("-0.17-1-147" in s for s in gpu) == 5
    some = _selected(_run(tmp_path, "--collect-only", "-q", text=ROWS_STAND_IN, FA_SEED="6",
                          FA_PER_FUNCTION="8", FA_DEVICE="cpu"))
    assert len(some) == 8 and not any("-0.17-1-147" in s for s in some), some
