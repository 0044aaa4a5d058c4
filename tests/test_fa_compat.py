"""flash_attn v2.8.3's own test file, unmodified, on flash_attn_det's CPU path: a
CPU-sized random sample of its parametrizations (tests/fa_compat/fa_compat_plugin.py,
FA_DEVICE=cpu), run in a subprocess. The file is fetched from the flash-attn 2.8.3 sdist into
tests/fa_compat/.cache/ (tests/fa_compat/fetch.py); without network and without a cached copy
this test skips and says so. The GPU run is tests/fa_compat/run.sh on the device."""
import importlib.util
import os
import random
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
COMPAT = os.path.join(HERE, "fa_compat")


def test_flash_attn_test_file_on_cpu():
    if importlib.util.find_spec("einops") is None:
        pytest.skip("flash_attn's test file needs einops (pip install einops)")
    got = subprocess.run([sys.executable, os.path.join(COMPAT, "fetch.py")], capture_output=True,
                         text=True, timeout=300)
    if got.returncode != 0:
        pytest.skip(got.stderr.strip())
    path = got.stdout.strip()
    seed = os.environ.get("FA_SEED") or str(random.SystemRandom().randrange(1 << 31))
    env = dict(os.environ, FA_DEVICE="cpu", FA_SEED=seed,
               FA_PER_FUNCTION=os.environ.get("FA_PER_FUNCTION", "2"),
               PYTHONPATH=os.pathsep.join([os.path.join(COMPAT, "shim"), COMPAT, os.path.dirname(HERE)]))
    res = subprocess.run([sys.executable, "-m", "pytest", "-c", os.devnull, "--rootdir",
                          os.path.dirname(path), "-p", "no:cacheprovider", "-p", "no:randomly",
                          "-p", "fa_compat_plugin", "-q", "-rf", "-W", "ignore", path],
                         capture_output=True, text=True, env=env, cwd=os.path.dirname(path),
                         timeout=1200)
    tail = res.stdout[-6000:]
    print(f"FA_SEED={seed}\n{tail}")
    assert "per test function" in res.stdout, tail + res.stderr[-3000:]
    assert res.returncode == 0, f"FA_SEED={seed}: flash_attn's tests failed on the CPU path\n{tail}"
