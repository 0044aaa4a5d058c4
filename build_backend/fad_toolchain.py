"""Where the CUDA compiler comes from, for setup.py and for the in-tree build backend.

One decision, read by both:
- FLASH_ATTN_DET_FORCE_CPU=1: no CUDA, whatever is installed.
- nvcc from CUDA_HOME / CUDA_PATH, else on PATH, else from the CUDA compiler wheels
  (nvidia-cuda-nvcc and friends, installed as build requirements: see fad_backend.py).
- The wheels are asked for only when no system nvcc exists and CUDA is wanted: an NVIDIA GPU
  on this machine, or FLASH_ATTN_DET_CUDA=1 (e.g. to build on a machine without one).
  FLASH_ATTN_DET_CUDA=0 never asks for them.
"""
import glob
import importlib.util
import os
import shutil

# The CUDA release whose compiler wheels a build without a system toolkit takes: the
# runtime is linked statically, so the driver must support it (13.0: driver >= 580, as
# torch's cu130 builds need). FLASH_ATTN_DET_CUDA_WHEELS picks another ("13.2").
DEFAULT_WHEELS_RELEASE = "13.0"
WHEEL_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-nvvm",
                  "nvidia-cuda-cccl")


def env_flag(name):
    """'1', '0' or None (unset or empty) for an environment switch."""
    value = os.environ.get(name, "").strip()
    if value in ("", "auto"):
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    return value


def cuda_switched_off():
    """FLASH_ATTN_DET_FORCE_CPU=1 or FLASH_ATTN_DET_CUDA=0: the CPU-only module, whatever is installed."""
    return env_flag("FLASH_ATTN_DET_FORCE_CPU") == "1" or env_flag("FLASH_ATTN_DET_CUDA") == "0"


def system_nvcc():
    """nvcc of a CUDA toolkit: CUDA_HOME, CUDA_PATH, then PATH; None if there is none."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = os.environ.get(var)
        if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
            return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def wheel_nvcc():
    """nvcc of the nvidia-cuda-nvcc wheel in this environment (nvidia/cu*/bin/nvcc), or None."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return None
    for root in (spec.submodule_search_locations or []) if spec else []:
        found = sorted(glob.glob(os.path.join(root, "cu*", "bin", "nvcc")))
        if found:
            return found[-1]
    return None


def has_nvidia_gpu():
    """An NVIDIA driver is loaded (Linux) or nvidia-smi exists: CUDA kernels would be used."""
    return (os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidia0")
            or shutil.which("nvidia-smi") is not None)


def wants_cuda_wheels():
    """True when the build must take its compiler from the CUDA compiler wheels."""
    if cuda_switched_off():
        return False
    if system_nvcc():
        return False
    return env_flag("FLASH_ATTN_DET_CUDA") == "1" or has_nvidia_gpu()


def cuda_wheel_requirements():
    """The build requirements that bring nvcc, its headers and the static runtime."""
    release = os.environ.get("FLASH_ATTN_DET_CUDA_WHEELS", "").strip() or DEFAULT_WHEELS_RELEASE
    if not release.replace(".", "").isdigit() or release.count(".") != 1:
        raise ValueError(f"FLASH_ATTN_DET_CUDA_WHEELS: expected a release like 13.0, got {release!r}")
    return [f"{name}=={release}.*" for name in WHEEL_PACKAGES]


def cpu_only_reason():
    """Why find_nvcc() gave None, in one line that says how to get the CUDA kernels."""
    if env_flag("FLASH_ATTN_DET_FORCE_CPU") == "1":
        return "FLASH_ATTN_DET_FORCE_CPU=1"
    if env_flag("FLASH_ATTN_DET_CUDA") == "0":
        return "FLASH_ATTN_DET_CUDA=0"
    if has_nvidia_gpu():
        return ("this machine has an NVIDIA GPU but no nvcc, and no CUDA compiler wheels in the "
                "build environment (build isolation off?): set CUDA_HOME, or pip install without "
                "--no-build-isolation")
    return ("no nvcc and no NVIDIA GPU here; for the CUDA kernels anyway: "
            "FLASH_ATTN_DET_CUDA=1 pip install .")


def find_nvcc():
    """The nvcc this build uses, or None for the CPU-only module. FLASH_ATTN_DET_CUDA=1 with no
    compiler anywhere is an error, not a silent CPU build."""
    if cuda_switched_off():
        return None
    nvcc = system_nvcc() or wheel_nvcc()
    if nvcc is None and env_flag("FLASH_ATTN_DET_CUDA") == "1":
        raise RuntimeError(
            "FLASH_ATTN_DET_CUDA=1 but no nvcc was found: set CUDA_HOME, put nvcc on PATH, or "
            "install with build isolation on (plain `pip install .`), which fetches the CUDA "
            "compiler wheels (" + ", ".join(cuda_wheel_requirements()) + ")")
    return nvcc
