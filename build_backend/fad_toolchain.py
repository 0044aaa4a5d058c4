"""What the build makes on this machine, for setup.py and for the in-tree build backend.

One decision (build_plan), read by both:
- FLASH_ATTN_DET_FORCE_CPU=1 or FLASH_ATTN_DET_CUDA=0: the CPU-only module, whatever is installed.
- The CUDA kernels when an NVIDIA GPU is visible (the driver lists one, or /dev/nvidia0 exists) or
  FLASH_ATTN_DET_CUDA=1 (build boxes, wheels); otherwise the CPU-only module even when nvcc is
  present, with one line that says how to get the kernels.
- Architectures: FLASH_ATTN_DET_CUDA_ARCHS, else those of the visible GPUs, else DEFAULT_ARCHS.
- nvcc from CUDA_HOME / CUDA_PATH, else on PATH, else from the CUDA compiler wheels (nvidia-cuda-nvcc
  and friends, installed as build requirements by fad_backend.py), whose release follows the
  driver. A compiler whose CUDA major release is newer than the driver's is refused before
  compiling (its kernels could not load), unless FLASH_ATTN_DET_CUDA=1 asks for them anyway.
The decision is compiled into the module as one line (flash_attn_det._C.BUILD), which
`python -m flash_attn_det.verify` prints: pip shows no build output unless the build fails.
"""
import ctypes
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from typing import NamedTuple, Optional

# Built when no GPU says otherwise: sm_80 cubins also run on sm_86 and sm_89; 90 is built as
# sm_90a (the wgmma kernels); PTX of the newest lets later GPUs JIT the mma.sync kernels.
DEFAULT_ARCHS = "80;90"
# Kernel files that hold only sm_90a code (wgmma, TMA, warp specialization). The host launches
# them only from an sm_90a build (FAD_SM90A), so they are compiled for sm_90a alone, and left
# out of a build without 90.
SM90A_SOURCES = ("bwd_dkdv_wgmma.cu", "bwd_dq_wgmma.cu", "fwd_prefill_ws.cu")

# The compiler wheels a build without a CUDA toolkit takes. The runtime is linked statically,
# so the driver must support their release: 13.0 needs driver >= 580. PyPI has no CUDA 12
# compiler wheel (nvidia-cuda-nvcc-cu12 holds ptxas and libnvvm but no nvcc: 12.8.93 and
# 12.9.86 looked at), so a driver below 580 needs a CUDA 12 toolkit.
# FLASH_ATTN_DET_CUDA_WHEELS picks another release.
DEFAULT_WHEELS_RELEASE = "13.0"
WHEEL_PACKAGES = ("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-nvvm",
                  "nvidia-cuda-cccl")
# The oldest driver of each CUDA major release: a build with any minor release of it runs on
# that driver (CUDA minor version compatibility), the kernels being cubins for the GPU.
MIN_DRIVER = {12: 525, 13: 580}
OLDEST_NVCC = (12, 5)  # tma.cuh asks the runtime for cudaGetDriverEntryPointByVersion (12.5)
OLDEST_CC = 8  # mma.sync bf16 and cp.async: sm_80 on


class Plan(NamedTuple):
    nvcc: Optional[str]  # None: the CPU-only module
    archs: Optional[str]  # e.g. "90" or "80;90"
    line: str  # what was chosen and why, in one line


def env_flag(name):
    """'1', '0' or None (unset or empty) for an environment switch."""
    value = os.environ.get(name, "").strip()
    if value in ("", "auto"):
        return None
    if value not in ("0", "1"):
        raise ValueError(f"{name}: expected 0 or 1, got {value!r}")
    return value


def cuda_switched_off():
    """FLASH_ATTN_DET_FORCE_CPU=1 or FLASH_ATTN_DET_CUDA=0: the CPU-only module, whatever is
    installed."""
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


def _output(cmd):
    """stdout of cmd, or '' when it cannot run or fails (a machine fact that is not there)."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout if r.returncode == 0 else ""


def _libcuda():
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def driver_cuda():
    """(major, minor): the newest CUDA release the NVIDIA driver supports (libcuda's
    cuDriverGetVersion, else nvidia-smi's header), or None where no driver is found."""
    lib = _libcuda()
    version = ctypes.c_int(0)
    if lib is not None and lib.cuDriverGetVersion(ctypes.byref(version)) == 0 and version.value:
        return version.value // 1000, version.value % 1000 // 10
    m = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", _output(["nvidia-smi"]))
    return (int(m.group(1)), int(m.group(2))) if m else None


def visible_gpus():
    """[(name, (major, minor))] of the GPUs the driver lists: libcuda, else nvidia-smi."""
    lib = _libcuda()
    gpus = []
    count = ctypes.c_int(0)
    if lib is not None and lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(count)) == 0:
        for i in range(count.value):
            dev, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
            name = ctypes.create_string_buffer(128)
            if (lib.cuDeviceGet(ctypes.byref(dev), i) or lib.cuDeviceGetName(name, 128, dev)
                    or lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # CC major
                    or lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)):  # CC minor
                continue
            gpus.append((name.value.decode(errors="replace"), (major.value, minor.value)))
    if gpus:
        return gpus
    for row in _output(["nvidia-smi", "--query-gpu=name,compute_cap",
                        "--format=csv,noheader"]).splitlines():
        m = re.match(r"\s*(.+?),\s*(\d+)\.(\d+)\s*$", row)
        if m:
            gpus.append((m.group(1), (int(m.group(2)), int(m.group(3)))))
    return gpus


def has_device_node():
    """/dev/nvidia0: a GPU the driver has, even where its details cannot be read here."""
    return os.path.exists("/dev/nvidia0")


def nvcc_release(nvcc):
    """(major, minor) of `nvcc --version` ("release 13.0"), or None."""
    m = re.search(r"release (\d+)\.(\d+)", _output([nvcc, "--version"]))
    return (int(m.group(1)), int(m.group(2))) if m else None


def _arch_of(cc):
    """The arch a GPU of compute capability cc runs: its family's (8.x runs sm_80 cubins, whose
    bits docs/design.md's contract names), PTX of sm_90 past Hopper, None below sm_80."""
    major = cc[0]
    return None if major < OLDEST_CC else "80" if major == 8 else "90"


def choose_archs(gpus):
    """(archs, why); archs None when no visible GPU can run the kernels."""
    env = os.environ.get("FLASH_ATTN_DET_CUDA_ARCHS", "").strip()
    if env:
        return env, f"FLASH_ATTN_DET_CUDA_ARCHS={env}"
    if not gpus:
        return DEFAULT_ARCHS, "no GPU to read the architecture from: the default archs"
    names = ", ".join(sorted({f"{n} (sm_{c[0]}{c[1]})" for n, c in gpus}))
    archs = sorted({a for a in (_arch_of(c) for _, c in gpus) if a}, key=int)
    if not archs:
        return None, (f"the GPU here, {names}, is older than sm_{OLDEST_CC}0, the oldest the "
                      "kernels run on (FLASH_ATTN_DET_CUDA_ARCHS=80 FLASH_ATTN_DET_CUDA=1 builds "
                      "them anyway)")
    return ";".join(archs), f"the GPU here: {names}"


def arch_list(archs):
    """["80", "90"] from "80;90" / "80,90a" (90 is always built as sm_90a)."""
    return [a.strip().rstrip("a") for a in archs.replace(",", ";").split(";") if a.strip()]


def gencode_flags(archs):
    """nvcc flags for archs like "80;90". sm_90 code is built for sm_90a, the target with wgmma
    (FAD_SM90A tells the host it may launch those kernels). PTX of the newest arch, without the
    "a" (arch-specific PTX does not run on later GPUs), lets newer GPUs JIT the rest."""
    archs = arch_list(archs)
    flags = []
    for a in archs:
        sm = a + "a" if a == "90" else a
        flags.append(f"-gencode=arch=compute_{sm},code=sm_{sm}")
    if "90" in archs:
        flags.append("-DFAD_SM90A=1")
    newest = max(archs, key=int)
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")  # PTX for newer GPUs
    return flags


def cuda_compiles(archs, sources):
    """[(source, gencode flags)] of the kernel files a build for archs compiles: each for every
    arch, except SM90A_SOURCES, compiled for sm_90a alone and only when 90 is among archs."""
    out = []
    for src in sources:
        if os.path.basename(src) in SM90A_SOURCES:
            if "90" in arch_list(archs):
                out.append((src, ["-gencode=arch=compute_90a,code=sm_90a", "-DFAD_SM90A=1"]))
        else:
            out.append((src, gencode_flags(archs)))
    return out


# Seconds of nvcc for each kernel file: (sm_80, sm_90a; None where not built), each with its
# build's PTX; for compile_order, which needs only their ranks. Measured in one build of archs 80
# and one of 90, setup.py's commands two at a time on a 2-core machine (nvcc 13.0). A file's size
# is no guide: the prefill kernel's variants live in small files, its template in a header.
NVCC_SECONDS = {
    "fwd_prefill.cu": (49.5, 92.5),
    "fwd_combine.cu": (29.4, 62.0),
    "fwd_prefill_groups.cu": (45.7, 57.0),
    "fwd_decode.cu": (29.5, 45.7),
    "fwd_prefill_ws.cu": (None, 38.4),
    "bwd_dkdv_wgmma.cu": (None, 30.7),
    "bwd_dkdv.cu": (15.7, 20.4),
    "bwd_dq.cu": (11.5, 15.3),
    "bwd_dq_wgmma.cu": (None, 12.6),
    "rows.cu": (4.0, 5.1),
    "fwd_launch.cu": (1.5, 2.1),
    "bwd_dsum.cu": (1.5, 2.0),
    "bwd_launch.cu": (1.6, 1.9),
    "append.cu": (1.5, 1.8),
    "bwd_dq_post.cu": (1.5, 1.8),
    "device.cu": (1.3, 1.7),
}


def compile_order(compiles):
    """cuda_compiles' list, longest compile first: setup.py runs the files a few at a time, and
    the build lasts as long as its busiest job, so the long files must not start last (longest
    processing time first). A file missing from NVCC_SECONDS goes first, as if the longest."""
    def seconds(item):
        src, gencode = item
        cost = NVCC_SECONDS.get(os.path.basename(src))
        if cost is None:
            return float("inf")
        cubins = [f for f in gencode if ",code=sm_" in f]
        return sum(cost[1] if f.endswith("sm_90a") else cost[0] for f in cubins)
    return sorted(compiles, key=seconds, reverse=True)


def describe_archs(archs):
    """"sm_80, sm_90a + PTX compute_90": what the cubins and the PTX are for."""
    a = arch_list(archs)
    cubins = ", ".join(f"sm_{x}a" if x == "90" else f"sm_{x}" for x in a)
    return f"{cubins} + PTX compute_{max(a, key=int)}"


def _cuda12_message(driver):
    return (f"this machine's NVIDIA driver supports CUDA {driver[0]}.{driver[1]}, and the CUDA "
            f"compiler wheels start at CUDA 13.0, which needs driver >= {MIN_DRIVER[13]} (PyPI has "
            "no CUDA 12 nvcc wheel). To build the kernels: point CUDA_HOME at a CUDA 12 toolkit "
            f"(12.{OLDEST_NVCC[1]} or newer, e.g. `module load cuda/12.x` on a cluster), or upgrade "
            f"the driver to >= {MIN_DRIVER[13]}; or FLASH_ATTN_DET_CUDA=0 for the CPU-only module")


def wheels_release():
    """The CUDA release of the compiler wheels: FLASH_ATTN_DET_CUDA_WHEELS, else the one the
    driver runs (13.0; a driver of the CUDA 12 series is an error naming the fix, since no
    CUDA 12 nvcc wheel exists)."""
    release = os.environ.get("FLASH_ATTN_DET_CUDA_WHEELS", "").strip()
    if release:
        if not release.replace(".", "").isdigit() or release.count(".") != 1:
            raise ValueError("FLASH_ATTN_DET_CUDA_WHEELS: expected a release like 13.0, got "
                             f"{release!r}")
        return release
    driver = driver_cuda()
    if driver is not None and driver < (13, 0):
        raise RuntimeError("flash_attn_det: " + _cuda12_message(driver))
    return DEFAULT_WHEELS_RELEASE


def _wants_kernels():
    """(wanted, asked, gpus): the kernels are wanted when asked (FLASH_ATTN_DET_CUDA=1) or when
    a GPU is visible; never when switched off."""
    if cuda_switched_off():
        return False, False, []
    asked = env_flag("FLASH_ATTN_DET_CUDA") == "1"
    gpus = visible_gpus()
    return asked or bool(gpus) or has_device_node(), asked, gpus


def wants_cuda_wheels():
    """True when the build must take its compiler from the CUDA compiler wheels."""
    wanted, asked, gpus = _wants_kernels()
    if not wanted or system_nvcc():
        return False
    return asked or choose_archs(gpus)[0] is not None


def cuda_wheel_requirements():
    """The build requirements that bring nvcc, its headers and the static runtime."""
    release = wheels_release()
    return [f"{name}=={release}.*" for name in WHEEL_PACKAGES]


def build_plan():
    """The one decision: which nvcc (None: the CPU-only module), which archs, and the line that
    says so and why. Raises (before anything compiles) where the kernels were asked for and
    cannot be had, or would be made by a compiler newer than the driver."""
    if env_flag("FLASH_ATTN_DET_FORCE_CPU") == "1":
        return Plan(None, None, "CPU-only module: FLASH_ATTN_DET_FORCE_CPU=1")
    if env_flag("FLASH_ATTN_DET_CUDA") == "0":
        return Plan(None, None, "CPU-only module: FLASH_ATTN_DET_CUDA=0")
    wanted, asked, gpus = _wants_kernels()
    found = system_nvcc()
    if not wanted:
        unused = f" (nvcc at {found} left unused)" if found else ""
        return Plan(None, None, f"CPU-only module: no NVIDIA GPU visible{unused}; for the CUDA "
                                "kernels: FLASH_ATTN_DET_CUDA=1 pip install -e .")
    archs, why = choose_archs(gpus)
    if archs is None and not asked:
        return Plan(None, None, f"CPU-only module: {why}")
    archs = archs or DEFAULT_ARCHS
    if asked and not gpus:
        why = "FLASH_ATTN_DET_CUDA=1, " + why
    nvcc = found or wheel_nvcc()
    if nvcc is None:
        if asked:
            raise RuntimeError(
                "FLASH_ATTN_DET_CUDA=1 but no nvcc was found: set CUDA_HOME, put nvcc on PATH, or "
                "install with build isolation on (plain `pip install .`), which fetches the CUDA "
                "compiler wheels (" + ", ".join(cuda_wheel_requirements()) + ")")
        driver = driver_cuda()
        if driver is not None and driver < (13, 0):
            raise RuntimeError("flash_attn_det: " + _cuda12_message(driver))
        return Plan(None, None, "CPU-only module: this machine has an NVIDIA GPU but no nvcc, and "
                                "no CUDA compiler wheels in the build environment (build isolation "
                                "off?): set CUDA_HOME, or pip install without --no-build-isolation")
    release, driver = nvcc_release(nvcc), driver_cuda()
    rel = f"{release[0]}.{release[1]}" if release else "(release unknown)"
    if release is not None and release < OLDEST_NVCC:
        raise RuntimeError(f"flash_attn_det: nvcc {rel} ({nvcc}) is older than CUDA "
                           f"{OLDEST_NVCC[0]}.{OLDEST_NVCC[1]}, the oldest the kernels build with: "
                           "point CUDA_HOME at a newer toolkit")
    if release is not None and driver is not None and release[0] > driver[0]:
        msg = (f"flash_attn_det: nvcc {rel} ({nvcc}) makes kernels that need an NVIDIA driver "
               f">= {MIN_DRIVER.get(release[0], '?')} (CUDA {release[0]}), and this machine's "
               f"driver supports CUDA {driver[0]}.{driver[1]}, so they would not load: point "
               f"CUDA_HOME at a CUDA {driver[0]} toolkit (12.{OLDEST_NVCC[1]} or newer), or "
               f"upgrade the driver")
        if not asked:
            raise RuntimeError(msg + "; FLASH_ATTN_DET_CUDA=1 builds them anyway (for another "
                                     "machine)")
        print(msg + " (building anyway: FLASH_ATTN_DET_CUDA=1)", file=sys.stderr, flush=True)
    source = "compiler wheels" if nvcc != found else nvcc
    need = MIN_DRIVER.get(release[0]) if release else None
    line = (f"CUDA kernels for {describe_archs(archs)} ({why}); nvcc {rel} from {source}"
            + (f"; they need an NVIDIA driver >= {need}" if need else ""))
    return Plan(nvcc, archs, line)
