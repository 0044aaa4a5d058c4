"""The build's choice of CUDA compiler (build_backend/fad_toolchain.py, read by setup.py and by
the in-tree PEP 517 backend): a system toolkit first, else the CUDA compiler wheels as build
requirements when there is a GPU or FLASH_ATTN_DET_CUDA=1, else the CPU-only module with a
one-line reason. CPU only: every machine fact is monkeypatched."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
import fad_backend  # noqa: E402
import fad_toolchain as tc  # noqa: E402

ENV = ("FLASH_ATTN_DET_FORCE_CPU", "FLASH_ATTN_DET_CUDA", "FLASH_ATTN_DET_CUDA_WHEELS",
       "CUDA_HOME", "CUDA_PATH")


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A machine with no toolkit, no wheel and no GPU; the test adds what it needs. setuptools'
    own hook is stubbed: it would run egg_info in the working directory."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fad_backend._orig, "get_requires_for_build_wheel", lambda cs=None: ["st"])
    monkeypatch.setattr(fad_backend._orig, "get_requires_for_build_editable", lambda cs=None: ["st"])
    state = {"gpu": False, "which": None, "wheel": None}
    monkeypatch.setattr(tc.shutil, "which", lambda cmd: state["which"] if cmd == "nvcc" else None)
    monkeypatch.setattr(tc, "has_nvidia_gpu", lambda: state["gpu"])
    monkeypatch.setattr(tc, "wheel_nvcc", lambda: state["wheel"])
    return state


def test_no_toolkit_no_gpu_builds_cpu_only(machine):
    assert not tc.wants_cuda_wheels()
    assert tc.find_nvcc() is None
    assert "FLASH_ATTN_DET_CUDA=1 pip install ." in tc.cpu_only_reason()
    assert fad_backend.get_requires_for_build_wheel() == ["st"]


def test_gpu_without_toolkit_asks_for_the_wheels(machine):
    machine["gpu"] = True
    assert tc.wants_cuda_wheels()
    reqs = fad_backend.get_requires_for_build_wheel()
    assert reqs[0] == "st"  # setuptools' own requirements first
    for name in tc.WHEEL_PACKAGES:
        assert f"{name}=={tc.DEFAULT_WHEELS_RELEASE}.*" in reqs
    assert set(tc.cuda_wheel_requirements()) <= set(fad_backend.get_requires_for_build_editable())
    # the build environment then has the wheel's nvcc, and setup.py takes it
    machine["wheel"] = "/env/site-packages/nvidia/cu13/bin/nvcc"
    assert tc.find_nvcc() == machine["wheel"]


def test_cuda_1_asks_for_the_wheels_without_a_gpu(machine, monkeypatch):
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA", "1")
    assert tc.wants_cuda_wheels()
    with pytest.raises(RuntimeError, match="FLASH_ATTN_DET_CUDA=1 but no nvcc"):
        tc.find_nvcc()  # build isolation off: no wheel, so an error, never a silent CPU build


def test_system_toolkit_wins(machine, monkeypatch, tmp_path):
    machine["gpu"] = True
    machine["wheel"] = "/env/nvidia/cu13/bin/nvcc"
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert not tc.wants_cuda_wheels()
    assert tc.find_nvcc() == str(tmp_path / "bin" / "nvcc")
    monkeypatch.delenv("CUDA_HOME")
    machine["which"] = "/usr/local/bin/nvcc"
    assert not tc.wants_cuda_wheels() and tc.find_nvcc() == "/usr/local/bin/nvcc"


@pytest.mark.parametrize("var,value,reason", [("FLASH_ATTN_DET_FORCE_CPU", "1", "FORCE_CPU=1"),
                                              ("FLASH_ATTN_DET_CUDA", "0", "CUDA=0")])
def test_switches_off(machine, monkeypatch, var, value, reason):
    machine["gpu"] = True
    machine["which"] = "/usr/local/bin/nvcc"
    monkeypatch.setenv(var, value)
    assert not tc.wants_cuda_wheels()
    assert tc.find_nvcc() is None
    assert reason in tc.cpu_only_reason()


def test_gpu_but_no_compiler_reason(machine):
    machine["gpu"] = True  # e.g. --no-build-isolation: the wheels were never installed
    assert tc.find_nvcc() is None
    assert "no-build-isolation" in tc.cpu_only_reason()


def test_wheel_release_and_bad_values(machine, monkeypatch):
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA_WHEELS", "13.2")
    assert "nvidia-cuda-nvcc==13.2.*" in tc.cuda_wheel_requirements()
    for bad in ("13", "13.x", "13.0.1", "latest"):
        monkeypatch.setenv("FLASH_ATTN_DET_CUDA_WHEELS", bad)
        with pytest.raises(ValueError, match="^FLASH_ATTN_DET_CUDA_WHEELS"):
            tc.cuda_wheel_requirements()
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA", "yes")
    with pytest.raises(ValueError, match="^FLASH_ATTN_DET_CUDA"):
        tc.wants_cuda_wheels()


def test_wheel_nvcc_finds_the_wheel_layout(monkeypatch, tmp_path):
    """nvidia/cu13/bin/nvcc under a namespace package `nvidia` on sys.path."""
    nvcc = tmp_path / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, mod)
    assert tc.wheel_nvcc() == str(nvcc)
