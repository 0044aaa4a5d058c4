"""What the build makes on a machine (build_backend/fad_toolchain.py, read by setup.py and by the
in-tree PEP 517 backend): the CUDA kernels when a GPU is visible or FLASH_ATTN_DET_CUDA=1, for
the visible GPUs' archs; else the CPU-only module, even with nvcc present; the compiler wheels'
release follows the driver; a compiler newer than the driver is refused before compiling. CPU
only: every machine fact is monkeypatched."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
import fad_backend  # noqa: E402
import fad_toolchain as tc  # noqa: E402

ENV = ("FLASH_ATTN_DET_FORCE_CPU", "FLASH_ATTN_DET_CUDA", "FLASH_ATTN_DET_CUDA_WHEELS",
       "FLASH_ATTN_DET_CUDA_ARCHS", "CUDA_HOME", "CUDA_PATH")
H200 = ("NVIDIA H200", (9, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
L4 = ("NVIDIA L4", (8, 9))
B200 = ("NVIDIA B200", (10, 0))
T4 = ("Tesla T4", (7, 5))


@pytest.fixture
def machine(monkeypatch):
    """A machine with no toolkit, no wheel, no GPU and no driver; the test adds what it needs.
    setuptools' own hook is stubbed: it would run egg_info in the working directory."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(fad_backend._orig, "get_requires_for_build_wheel", lambda cs=None: ["st"])
    monkeypatch.setattr(fad_backend._orig, "get_requires_for_build_editable", lambda cs=None: ["st"])
    state = {"gpus": [], "node": False, "driver": None, "which": None, "wheel": None,
             "release": (13, 0)}
    monkeypatch.setattr(tc.shutil, "which", lambda cmd: state["which"] if cmd == "nvcc" else None)
    monkeypatch.setattr(tc, "visible_gpus", lambda: list(state["gpus"]))
    monkeypatch.setattr(tc, "has_device_node", lambda: state["node"])
    monkeypatch.setattr(tc, "driver_cuda", lambda: state["driver"])
    monkeypatch.setattr(tc, "wheel_nvcc", lambda: state["wheel"])
    monkeypatch.setattr(tc, "nvcc_release", lambda nvcc: state["release"])
    return state


def test_no_gpu_builds_cpu_only_even_with_nvcc(machine):
    machine["which"] = "/usr/local/bin/nvcc"
    plan = tc.build_plan()
    assert plan.nvcc is None and plan.archs is None
    assert plan.line.startswith("CPU-only module: no NVIDIA GPU visible")
    assert "/usr/local/bin/nvcc left unused" in plan.line
    assert "FLASH_ATTN_DET_CUDA=1 pip install" in plan.line
    assert not tc.wants_cuda_wheels()
    assert fad_backend.get_requires_for_build_wheel() == ["st"]


def test_no_gpu_no_nvcc_builds_cpu_only(machine):
    plan = tc.build_plan()
    assert plan.nvcc is None and "left unused" not in plan.line
    assert "FLASH_ATTN_DET_CUDA=1 pip install" in plan.line
    assert fad_backend.get_requires_for_build_editable() == ["st"]


def test_visible_gpu_builds_its_arch(machine):
    machine.update(gpus=[H200], driver=(13, 0), which="/usr/local/bin/nvcc")
    plan = tc.build_plan()
    assert plan.nvcc == "/usr/local/bin/nvcc" and plan.archs == "90"
    assert plan.line.startswith("CUDA kernels for sm_90a + PTX compute_90 (the GPU here: NVIDIA H200")
    assert "nvcc 13.0 from /usr/local/bin/nvcc" in plan.line and ">= 580" in plan.line


@pytest.mark.parametrize("gpus,archs", [([A100], "80"), ([L4], "80"), ([A100, H200], "80;90"),
                                        ([B200], "90"), ([T4, H200], "90")])
def test_archs_follow_the_gpus(machine, gpus, archs):
    """8.x runs sm_80 cubins (the family whose bits the contract names), Blackwell the PTX of
    sm_90, a GPU older than sm_80 none."""
    machine.update(gpus=gpus, driver=(13, 0), which="/usr/local/bin/nvcc")
    assert tc.build_plan().archs == archs


def test_archs_variable_wins(machine, monkeypatch):
    machine.update(gpus=[H200], driver=(13, 0), which="/usr/local/bin/nvcc")
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA_ARCHS", "80;90")
    plan = tc.build_plan()
    assert plan.archs == "80;90" and "(FLASH_ATTN_DET_CUDA_ARCHS=80;90)" in plan.line


def test_gpu_older_than_sm80_gets_cpu_only_unless_asked(machine, monkeypatch):
    machine.update(gpus=[T4], driver=(13, 0), which="/usr/local/bin/nvcc")
    plan = tc.build_plan()
    assert plan.nvcc is None and "Tesla T4 (sm_75)" in plan.line and "older than sm_80" in plan.line
    assert not tc.wants_cuda_wheels()
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA", "1")
    assert tc.build_plan().archs == tc.DEFAULT_ARCHS


def test_device_node_without_details_builds_default_archs(machine):
    machine.update(node=True, driver=(13, 0), which="/usr/local/bin/nvcc")
    plan = tc.build_plan()
    assert plan.archs == tc.DEFAULT_ARCHS and "default archs" in plan.line


def test_gpu_without_toolkit_asks_for_the_wheels_of_its_driver(machine):
    machine.update(gpus=[H200], driver=(13, 0))
    assert tc.wants_cuda_wheels()
    reqs = fad_backend.get_requires_for_build_wheel()
    assert reqs[0] == "st"  # setuptools' own requirements first
    for name in tc.WHEEL_PACKAGES:
        assert f"{name}=={tc.DEFAULT_WHEELS_RELEASE}.*" in reqs
    assert set(tc.cuda_wheel_requirements()) <= set(fad_backend.get_requires_for_build_editable())
    # the build environment then has the wheel's nvcc, and setup.py takes it
    machine["wheel"] = "/env/site-packages/nvidia/cu13/bin/nvcc"
    plan = tc.build_plan()
    assert plan.nvcc == machine["wheel"] and "from compiler wheels" in plan.line


def test_cuda12_driver_without_toolkit_names_the_fix(machine, monkeypatch):
    """No CUDA 12 nvcc wheel exists, and 13.0's need driver >= 580: an error before any
    download, naming the ways out."""
    machine.update(gpus=[H200], driver=(12, 4))
    for hook in (fad_backend.get_requires_for_build_wheel, tc.build_plan):
        with pytest.raises(RuntimeError) as err:
            hook()
        msg = str(err.value)
        assert "supports CUDA 12.4" in msg and ">= 580" in msg
        assert "CUDA_HOME" in msg and "FLASH_ATTN_DET_CUDA=0" in msg
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA_WHEELS", "13.0")  # asked for by name: taken
    assert "nvidia-cuda-nvcc==13.0.*" in fad_backend.get_requires_for_build_wheel()


def test_nvcc_newer_than_the_driver_is_refused_before_compiling(machine, monkeypatch, capsys):
    machine.update(gpus=[H200], driver=(12, 8), which="/usr/local/bin/nvcc", release=(13, 0))
    with pytest.raises(RuntimeError, match="would not load") as err:
        tc.build_plan()
    assert "supports CUDA 12.8" in str(err.value) and "CUDA 12 toolkit" in str(err.value)
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA", "1")  # for another machine: built, with the warning
    assert tc.build_plan().nvcc == "/usr/local/bin/nvcc"
    assert "would not load" in capsys.readouterr().err


def test_older_nvcc_same_major_is_fine_but_not_below_the_oldest(machine):
    machine.update(gpus=[H200], driver=(13, 0), which="/usr/local/bin/nvcc", release=(12, 8))
    plan = tc.build_plan()
    assert plan.nvcc and "nvcc 12.8" in plan.line and ">= 525" in plan.line
    machine["release"] = (12, 4)
    with pytest.raises(RuntimeError, match="older than CUDA 12.5"):
        tc.build_plan()


def test_cuda_1_without_gpu(machine, monkeypatch):
    monkeypatch.setenv("FLASH_ATTN_DET_CUDA", "1")
    assert tc.wants_cuda_wheels()
    assert "nvidia-cuda-nvcc==13.0.*" in fad_backend.get_requires_for_build_wheel()
    with pytest.raises(RuntimeError, match="FLASH_ATTN_DET_CUDA=1 but no nvcc"):
        tc.build_plan()  # build isolation off: no wheel, so an error, never a silent CPU build
    machine["which"] = "/usr/local/bin/nvcc"
    plan = tc.build_plan()
    assert plan.archs == tc.DEFAULT_ARCHS and "FLASH_ATTN_DET_CUDA=1" in plan.line


def test_system_toolkit_wins(machine, monkeypatch, tmp_path):
    machine.update(gpus=[H200], driver=(13, 0), wheel="/env/nvidia/cu13/bin/nvcc")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    assert not tc.wants_cuda_wheels()
    assert tc.build_plan().nvcc == str(tmp_path / "bin" / "nvcc")
    monkeypatch.delenv("CUDA_HOME")
    machine["which"] = "/usr/local/bin/nvcc"
    assert not tc.wants_cuda_wheels() and tc.build_plan().nvcc == "/usr/local/bin/nvcc"


@pytest.mark.parametrize("var,value", [("FLASH_ATTN_DET_FORCE_CPU", "1"), ("FLASH_ATTN_DET_CUDA", "0")])
def test_switches_off(machine, monkeypatch, var, value):
    machine.update(gpus=[H200], driver=(13, 0), which="/usr/local/bin/nvcc")
    monkeypatch.setenv(var, value)
    assert not tc.wants_cuda_wheels()
    plan = tc.build_plan()
    assert plan.nvcc is None and plan.line == f"CPU-only module: {var}={value}"


def test_gpu_but_no_compiler(machine):
    machine.update(gpus=[H200], driver=(13, 0))  # e.g. --no-build-isolation: no wheels
    plan = tc.build_plan()
    assert plan.nvcc is None and "no-build-isolation" in plan.line


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


def test_only_what_the_archs_use_is_compiled():
    """The sm_90a-only kernel files: compiled for sm_90a alone, and only when 90 is built (the
    host references them only from an sm_90a build, FAD_SM90A); every other file for every arch."""
    cuda_dir = os.path.join(ROOT, "csrc", "cuda")
    sources = sorted(f for f in os.listdir(cuda_dir) if f.endswith(".cu"))
    assert set(tc.SM90A_SOURCES) <= set(sources)
    for src in tc.SM90A_SOURCES:  # (what makes them sm_90a-only)
        assert "wgmma" in src or "_ws" in src
    only80 = dict(tc.cuda_compiles("80", sources))
    assert set(only80) == set(sources) - set(tc.SM90A_SOURCES)
    assert all("-DFAD_SM90A=1" not in f and "-gencode=arch=compute_80,code=sm_80" in f
               for f in only80.values())
    both = dict(tc.cuda_compiles("80;90", sources))
    assert set(both) == set(sources)
    for src, flags in both.items():
        assert "-DFAD_SM90A=1" in flags
        if src in tc.SM90A_SOURCES:
            assert flags == ["-gencode=arch=compute_90a,code=sm_90a", "-DFAD_SM90A=1"]
        else:
            assert "-gencode=arch=compute_80,code=sm_80" in flags
            assert "-gencode=arch=compute_90a,code=sm_90a" in flags
            assert "-gencode=arch=compute_90,code=compute_90" in flags  # PTX for newer GPUs
    assert tc.describe_archs("80;90") == "sm_80, sm_90a + PTX compute_90"


def test_compile_order_longest_first():
    """setup.py starts the kernel files longest first: every file has its figures (a new file
    without them would go first, as if the longest), and the order follows them, per build."""
    cuda_dir = os.path.join(ROOT, "csrc", "cuda")
    sources = sorted(f for f in os.listdir(cuda_dir) if f.endswith(".cu"))
    assert set(tc.NVCC_SECONDS) == set(sources)
    for src, (s80, s90) in tc.NVCC_SECONDS.items():
        assert s90 > 0 and ((s80 is None) == (src in tc.SM90A_SOURCES)), src
    for archs, cost in [("80", lambda c: c[0]), ("90", lambda c: c[1]), ("80;90", lambda c: (c[0] or 0) + c[1])]:
        compiles = tc.cuda_compiles(archs, sources)
        ordered = tc.compile_order(compiles)
        assert sorted(ordered) == sorted(compiles)  # the same compiles, reordered
        costs = [cost(tc.NVCC_SECONDS[src]) for src, _ in ordered]
        assert costs == sorted(costs, reverse=True), archs
    assert tc.compile_order([("new.cu", ["-gencode=arch=compute_80,code=sm_80"])] + compiles)[0][0] == "new.cu"


def test_machine_facts_from_nvidia_smi(monkeypatch):
    """Without libcuda the driver's CUDA release and the GPUs come from nvidia-smi."""
    monkeypatch.setattr(tc, "_libcuda", lambda: None)
    outputs = {
        "nvidia-smi": "| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4  |\n",
        "--query-gpu=name,compute_cap": "NVIDIA H100 80GB HBM3, 9.0\nNVIDIA A10, 8.6\n",
    }
    monkeypatch.setattr(tc, "_output", lambda cmd: outputs.get(cmd[-1] if len(cmd) == 1 else cmd[1], ""))
    assert tc.driver_cuda() == (12, 4)
    assert tc.visible_gpus() == [("NVIDIA H100 80GB HBM3", (9, 0)), ("NVIDIA A10", (8, 6))]
    monkeypatch.setattr(tc, "_output", lambda cmd: "")  # no driver at all
    assert tc.driver_cuda() is None and tc.visible_gpus() == []


def test_wheel_nvcc_finds_the_wheel_layout(monkeypatch, tmp_path):
    """nvidia/cu13/bin/nvcc under a namespace package `nvidia` on sys.path."""
    nvcc = tmp_path / "nvidia" / "cu13" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for mod in [m for m in sys.modules if m == "nvidia" or m.startswith("nvidia.")]:
        monkeypatch.delitem(sys.modules, mod)
    assert tc.wheel_nvcc() == str(nvcc)


def test_the_module_records_its_build():
    """The line verify prints: what this module was built as."""
    from flash_attn_det import _C
    assert _C.BUILD.startswith("CUDA kernels for" if _C.has_cuda() else "CPU-only module")


def test_wheel_lists_every_subpackage():
    """pyproject's package list names every package folder: a `pip install .` (not -e) installs
    only those, and a missing one (flash_attn_det.integrations once) is an ImportError for
    users only, since an editable install and the checkout see every folder."""
    tomllib = pytest.importorskip("tomllib")
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {os.path.relpath(d, ROOT).replace(os.sep, ".")
             for d, _, files in os.walk(os.path.join(ROOT, "flash_attn_det"))
             if "__init__.py" in files}
    assert listed == found
