"""The bit-equality of the mma.sync and wgmma paths rests on one fact of the hardware: a wgmma
chain rounds every fp32 result exactly as the mma.sync chain it replaces. tests/wgmma_probe.cu
checks that fact directly (random Q, K, V tiles; S = Q K^T and O += P V by both instructions, every
fp32 result compared bit for bit, fp16 and bf16, D 64 and 128). Needs an sm_90 GPU and nvcc."""
import os
import re
import shutil
import subprocess

import pytest
import torch

from conftest import requires_cuda

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@requires_cuda
def test_wgmma_rounds_like_mma_sync(tmp_path):
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 GPU")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not found")
    exe = str(tmp_path / "wgmma_probe")
    subprocess.run([nvcc, "-std=c++17", "-O3", "-gencode=arch=compute_90a,code=sm_90a",
                    "-I" + os.path.join(ROOT, "csrc"), "-I" + os.path.join(ROOT, "csrc", "cuda"),
                    os.path.join(ROOT, "tests", "wgmma_probe.cu"), "-o", exe], check=True,
                   timeout=600)
    proc = subprocess.run([exe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "RESULT: wgmma bits EQUAL mma.sync" in proc.stdout, proc.stdout
    counts = re.findall(r"mismatches (\d+) / (\d+)", proc.stdout)
    assert len(counts) >= 8, proc.stdout  # every dtype, head dim and operand form ran
    assert all(bad == "0" and int(total) > 0 for bad, total in counts), proc.stdout
