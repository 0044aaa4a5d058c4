"""Build of flash_attn_det._C: C sources with the C compiler, CUDA sources with nvcc.

No torch at build time and none at link time: the module talks to torch through
DLPack only, and links the CUDA runtime statically, so it survives torch upgrades.
What to build on this machine is build_backend/fad_toolchain.py's decision (build_plan);
its one line is printed here and compiled into the module (flash_attn_det._C.BUILD).

Environment:
  FLASH_ATTN_DET_CUDA=1 / 0   CUDA kernels even with no GPU here (build boxes, wheels; an error if
                              no nvcc can be had) / never. Unset: kernels when a GPU is visible.
  FLASH_ATTN_DET_FORCE_CPU=1  the CPU-only module (as FLASH_ATTN_DET_CUDA=0)
  FLASH_ATTN_DET_CUDA_ARCHS   e.g. "90" or "80;86;90" (default: the visible GPUs' archs, else
                              "80;90"), plus PTX of the newest; 90 is built as sm_90a (wgmma)
  FLASH_ATTN_DET_CUDA_WHEELS  the CUDA release of the compiler wheels (default: 13.0, which the
                              driver must support: >= 580)
  FLASH_ATTN_DET_BUILD_JOBS   nvcc jobs at a time (default: the CPU count)
  CUDA_HOME / CUDA_PATH       where to find nvcc (else nvcc on PATH, else the nvidia-cuda-nvcc
                              wheel, which the in-tree backend build_backend/fad_backend.py adds
                              to the build requirements when the kernels are wanted and there is
                              no toolkit)
"""
import glob
import os
import subprocess
import sys
import time

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
import fad_toolchain  # noqa: E402  (shared with the build backend)

CSRC = os.path.join("csrc")
C_SOURCES = ["python/module.c", "python/glue.c", "python/infer.c", "python/blocks.c",
             "fad_core.c", "fad_cpu.c", "fad_bwd_cpu.c", "blocks_cpu.c",
             "cpu/kernels.c", "cpu/threads.c"]
CUDA_C_SOURCES = ["blocks_gemm_cuda.c"]  # C sources of the CUDA build only (cuBLASLt)
CUDA_SOURCES = sorted(os.path.join("cuda", f) for f in os.listdir(os.path.join(ROOT, CSRC, "cuda"))
                      if f.endswith(".cu"))
# The glue uses only the stable ABI of CPython 3.10 (METH_FASTCALL is in it from 3.10), so one
# module (_C.abi3.so) serves every CPython from 3.10 on. FLASH_ATTN_DET_ABI3=0 builds a
# version-specific module instead (_C.cpython-3XY-....so).
ABI3 = os.environ.get("FLASH_ATTN_DET_ABI3", "1") != "0"
ABI3_VERSION = "0x030A0000"


def cudart_dir(nvcc):
    """The directory of libcudart_static.a that goes with nvcc: the toolkit's lib64, or lib in
    the compiler wheels' layout (nvidia/cu13/{bin,lib}); follows a wrapper script or symlink."""
    def lib_in(home):
        for sub in ("lib64", "lib"):
            if os.path.exists(os.path.join(home, sub, "libcudart_static.a")):
                return os.path.join(home, sub)
        return None

    home = os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    found = lib_in(home)
    if found:
        return found
    out = subprocess.run([nvcc, "--dryrun", "--version"], capture_output=True, text=True)
    for line in (out.stdout + out.stderr).splitlines():
        if "TOP=" in line:
            found = lib_in(line.split("TOP=", 1)[1].strip())
            if found:
                return found
    found = lib_in("/usr/local/cuda")
    if found:
        return found
    raise RuntimeError(f"cannot find libcudart_static.a near {nvcc}")


def say(line):
    """A build progress line: on stderr, and on the terminal when stderr is not one -- pip
    captures the backend's output and shows it only with -v or on failure, and a CUDA build
    of minutes must not look hung."""
    print(line, file=sys.stderr, flush=True)
    if not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as tty:
                tty.write(line + "\n")
        except OSError:  # no controlling terminal (CI, a service): stderr alone
            pass


def run_jobs(cmds):
    """Runs the nvcc commands side by side, at most FLASH_ATTN_DET_BUILD_JOBS (default: the
    CPU count) at a time, in the order given (fad_toolchain.compile_order: the longest first):
    each nvcc already compiles its arch targets in parallel (--threads 0), and starting every
    file at once on a small machine only adds contention. One progress line a file
    ("[3/13] nvcc fwd_combine.cu"): a build of every arch takes minutes."""
    limit = int(os.environ.get("FLASH_ATTN_DET_BUILD_JOBS", "0")) or os.cpu_count() or 1
    todo = list(cmds)
    running = []
    started = 0
    while todo or running:
        while todo and len(running) < limit:
            cmd = todo.pop(0)
            started += 1
            say(f"[{started}/{len(cmds)}] nvcc {os.path.basename(cmd[2])}")
            running.append((cmd, subprocess.Popen(cmd)))
        done = [(cmd, job) for cmd, job in running if job.poll() is not None]
        if not done:
            time.sleep(0.1)
        for cmd, job in done:
            running.remove((cmd, job))
            if job.returncode:
                for _, other in running:
                    other.kill()
                raise subprocess.CalledProcessError(job.returncode, cmd)


class BuildExt(build_ext):
    def copy_extensions_to_source(self):
        # --inplace / editable: CPython prefers a _C.cpython-3XY-*.so over _C.abi3.so, so a
        # module of the other kind left beside the new one would shadow it
        for old in glob.glob(os.path.join(ROOT, "flash_attn_det", "_C.*.so")):
            os.remove(old)
        super().copy_extensions_to_source()

    def build_extensions(self):
        # Always relink: a module left in build/ by a build of the other kind (CPU-only vs
        # CUDA) is newer than every source, and setuptools would keep it (its check does not
        # see the CUDA objects or the choice of compiler).
        self.force = True
        # A module of the other ABI kind (_C.abi3.so vs _C.cpython-3XY-*.so) left in build/lib
        # by an earlier build would go into the wheel beside the new one, and CPython prefers
        # the version-specific one: remove them all, the new one is linked below.
        for old in glob.glob(os.path.join(self.build_lib, "flash_attn_det", "_C.*.so")):
            os.remove(old)
        ext = self.extensions[0]
        plan = fad_toolchain.build_plan()
        say(f"flash_attn_det: {plan.line}")
        # the line, compiled in: `python -m flash_attn_det.verify` prints it (pip hides this output)
        quoted = '"' + plan.line.replace("\\", "/").replace('"', "'") + '"'  # (a C string)
        ext.define_macros.append(("FAD_BUILD", quoted))
        if plan.nvcc is None:
            ext.sources.append(os.path.join(CSRC, "fad_nocuda.c"))
        else:
            libdir = cudart_dir(plan.nvcc)
            obj_dir = os.path.join(self.build_temp, "cuda")
            os.makedirs(obj_dir, exist_ok=True)
            t0 = time.time()
            cmds = []
            for src, gencode in fad_toolchain.compile_order(
                    fad_toolchain.cuda_compiles(plan.archs, CUDA_SOURCES)):
                obj = os.path.join(obj_dir, os.path.basename(src) + ".o")
                cmds.append([plan.nvcc, "-c", os.path.join(CSRC, src), "-o", obj, "-O3",
                             "-std=c++17", "--threads", "0", "-Xcompiler", "-fPIC", "-I" + CSRC,
                             "--expt-relaxed-constexpr"] + gencode)
                ext.extra_objects.append(obj)
            run_jobs(cmds)
            say(f"flash_attn_det: nvcc for archs {plan.archs} took {time.time() - t0:.1f} s")
            ext.sources += [os.path.join(CSRC, s) for s in CUDA_C_SOURCES]
            ext.library_dirs.append(libdir)
            ext.libraries += ["cudart_static", "dl", "rt", "pthread", "stdc++"]
        super().build_extensions()


setup(
    ext_modules=[
        Extension(
            "flash_attn_det._C",
            sources=[os.path.join(CSRC, s) for s in C_SOURCES],
            include_dirs=[CSRC],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-ffp-contract=off"],
            define_macros=[("Py_LIMITED_API", ABI3_VERSION)] if ABI3 else [],
            py_limited_api=ABI3,
        )
    ],
    cmdclass={"build_ext": BuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp310"}} if ABI3 else {},
)
