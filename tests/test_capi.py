"""The public C API (csrc/fad.h) used from a plain C program, tests/capi_demo.c.

The CPU variant is compiled with gcc against the C core (no Python, no torch)
and runs everywhere gcc is present. The CUDA variant links the kernel files
of csrc/cuda/ built by nvcc, the files and flags setup.py's build takes for the
GPU's arch; it is built and run only where a GPU and nvcc are (a build that
could not run is minutes of nvcc for nothing).
"""
import math
import os
import shutil
import subprocess
import sys

import pytest
import torch

from flash_attn_det import flash_attn_func, set_deterministic_mode

from conftest import HAS_CUDA

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
sys.path.insert(0, os.path.join(ROOT, "build_backend"))
from fad_toolchain import cuda_compiles, system_nvcc  # noqa: E402  (the build's own rules)
DEMO = os.path.join(ROOT, "tests", "capi_demo.c")
# the C core and the CPU path (setup.py's C_SOURCES without the CPython glue)
CPU_SOURCES = ("fad_core.c", "fad_cpu.c", "cpu/kernels.c", "cpu/threads.c")
CFLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-ffp-contract=off", "-I" + CSRC]

NCONFIGS = 3
COMMON_CHECKS = ["has_cuda", "check_good_params"] + [
    f"check_bad_{f}_{i}" for i, f in enumerate(
        ["head_dim", "head_dim", "split_size", "split_size", "num_heads_k", "window_size", "dtype",
         "softmax_scale", "softcap", "causal", "schedule", "alibi_slopes", "batch", "num_heads"])
] + ["check_null_msg", "check_short_msg_terminated", "init_defaults", "default_scale_accepted",
     "status_string"]
CPU_CHECKS = COMMON_CHECKS + ["nocuda_entries"] + [
    f"cpu_{what}_{i}" for i in range(NCONFIGS)
    for what in ("reference", "run_to_run", "refused_writes_nothing")
] + [f"cpu_batch_invariance_{i}" for i in (0, 1)] + [  # config 2 has batch 1
    "cpu_dropout_seed_offset_pointer"]
CUDA_CHECKS = COMMON_CHECKS + [
    f"cuda_{what}_{i}" for i in range(NCONFIGS)
    for what in ("reference", "schedules_equal", "auto_equal")
]

# config 0 of the demo, for the bit comparison with the Python API
CFG0 = dict(B=2, Sq=37, Sk=300, H=4, Hk=2, D=64, split_size=128)


def _parse(stdout):
    checks = {}
    for line in stdout.splitlines():
        if line.startswith("CHECK "):
            _, name, verdict = (line.split(" ", 2) + [""])[:3]
            assert name not in checks, f"check {name} printed twice"
            checks[name] = verdict
    return checks


class Demo:
    def __init__(self, exe, workdir):
        self.dump = os.path.join(workdir, "dump")
        os.makedirs(self.dump, exist_ok=True)
        self.proc = subprocess.run([exe, self.dump], capture_output=True, text=True, timeout=300)
        self.stdout = self.proc.stdout
        self.checks = _parse(self.stdout)

    def verdict(self, name):
        assert name in self.checks, f"the demo printed no CHECK {name}:\n{self.stdout}"
        return self.checks[name]


def _compile_c(sources, out, extra=()):
    cmd = ["gcc"] + CFLAGS + list(extra) + sources + ["-lm", "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stderr}"


@pytest.fixture(scope="module")
def cpu_demo(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("gcc not found")
    d = str(tmp_path_factory.mktemp("capi_cpu"))
    exe = os.path.join(d, "demo")
    _compile_c([DEMO] + [os.path.join(CSRC, s) for s in CPU_SOURCES + ("fad_nocuda.c",)], exe,
               ["-pthread"])
    return Demo(exe, d)


def _cuda_arch():
    """The family arch of this GPU, as the build picks it (8.x: 80; 9.0 on: 90)."""
    major, _ = torch.cuda.get_device_capability()
    return "80" if major == 8 else "90"


@pytest.fixture(scope="module")
def cuda_demo_exe(tmp_path_factory):
    if not HAS_CUDA:
        pytest.skip("no CUDA GPU: the CUDA demo is built only where it can run")
    nvcc = system_nvcc()
    if nvcc is None or shutil.which("gcc") is None:
        pytest.skip("nvcc or gcc not found")
    d = str(tmp_path_factory.mktemp("capi_cuda"))
    arch = _cuda_arch()
    objs = []
    for src in CPU_SOURCES + ("blocks_cpu.c",):  # (blocks_cpu.c: cuda/rows.cu's checks)
        obj = os.path.join(d, os.path.basename(src) + ".o")
        r = subprocess.run(["gcc", "-c"] + CFLAGS + [os.path.join(CSRC, src), "-o", obj],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        objs.append(obj)
    cuda_dir = os.path.join(CSRC, "cuda")
    plan = cuda_compiles(arch, sorted(f for f in os.listdir(cuda_dir) if f.endswith(".cu")))
    cuda_objs = [os.path.join(d, src + ".o") for src, _ in plan]
    compiles = [  # the kernel files compile side by side
        subprocess.Popen([nvcc, "-c", "-O2", "-std=c++17", os.path.join(cuda_dir, src), "-I" + CSRC,
                          "--expt-relaxed-constexpr", *gencode, "-o", obj],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for (src, gencode), obj in zip(plan, cuda_objs)
    ]
    for job in compiles:
        out, err = job.communicate(timeout=900)
        assert job.returncode == 0, f"{' '.join(job.args)}\n{out}\n{err}"
    steps = [
        [nvcc, "-c", "-O2", "-x", "c", "-DFAD_DEMO_CUDA", "-I" + CSRC, DEMO,
         "-o", os.path.join(d, "demo.o"), "-Xcompiler", "-std=c11"],
        [nvcc, "-o", os.path.join(d, "demo"), os.path.join(d, "demo.o")] + cuda_objs + objs +
        ["-lm", "-lpthread"],
    ]
    for cmd in steps:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{' '.join(cmd)}\n{r.stdout}\n{r.stderr}"
    return os.path.join(d, "demo"), d


def _load_dump(dump, device):
    B, Sq, Sk, H, Hk, D = (CFG0[n] for n in ("B", "Sq", "Sk", "H", "Hk", "D"))

    def read(name, dtype, shape):
        with open(os.path.join(dump, name), "rb") as f:
            raw = torch.frombuffer(bytearray(f.read()), dtype=dtype)
        assert raw.numel() == math.prod(shape), f"{name}: {raw.numel()} elements"
        return raw.reshape(shape).to(device)

    def bf16(name, shape):
        return read(name, torch.bfloat16, shape)

    q = bf16("q.bin", (B, Sq, H, D))
    k = bf16("k.bin", (B, Sk, Hk, D))
    v = bf16("v.bin", (B, Sk, Hk, D))
    out = bf16("out.bin", (B, Sq, H, D))
    lse = read("lse.bin", torch.float32, (B, H, Sq))
    return q, k, v, out, lse


def _check_exit_status(demo):
    failed = [n for n, v in demo.checks.items() if v != "ok"]
    last = demo.stdout.strip().splitlines()[-1] if demo.stdout.strip() else ""
    if failed:
        assert demo.proc.returncode == 1 and last == f"FAILED {len(failed)}", demo.stdout
    else:
        assert demo.proc.returncode == 0 and last == "OK", demo.stdout + demo.proc.stderr


# --- CPU ----------------------------------------------------------------------

def test_cpu_demo_exit_status_matches_checks(cpu_demo):
    assert cpu_demo.proc.returncode in (0, 1), cpu_demo.proc.stderr
    _check_exit_status(cpu_demo)
    assert set(cpu_demo.checks) == set(CPU_CHECKS), sorted(set(cpu_demo.checks) ^ set(CPU_CHECKS))


@pytest.mark.parametrize("name", CPU_CHECKS)
def test_cpu_demo_check(cpu_demo, name):
    assert cpu_demo.verdict(name) == "ok", cpu_demo.verdict(name)


def test_cpu_demo_reports_errors(cpu_demo):
    for i in range(NCONFIGS):
        assert f"config {i}:" in cpu_demo.stdout
    errs = [float(line.split("max_abs_err=")[1].split()[0])
            for line in cpu_demo.stdout.splitlines() if "max_abs_err=" in line]
    assert len(errs) == NCONFIGS and all(0 < e < 0.01 for e in errs), errs


def test_cpu_demo_bits_equal_python_api(cpu_demo):
    """The C API and flash_attn_func are one implementation: same inputs, same bits."""
    q, k, v, out_c, lse_c = _load_dump(cpu_demo.dump, "cpu")
    assert (q != 0).all() and (k != 0).all() and (v != 0).all()
    set_deterministic_mode(True, split_size=CFG0["split_size"])
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, out_c)
    assert torch.equal(lse, lse_c)


def test_cpu_demo_default_scale_bits_equal_python_api(cpu_demo):
    """softmax_scale 0 in the C API and softmax_scale=None in Python are one scale: the
    same bits of out and lse at every head dim the C API takes (one row, three keys, so
    lse carries the scale's every bit)."""
    import flash_attn_det
    set_deterministic_mode(True, split_size=512)
    for D in range(8, 257, 8):
        with open(os.path.join(cpu_demo.dump, f"scale_D{D}.bin"), "rb") as f:
            raw = bytearray(f.read())
        sizes = [D, 3 * D, 3 * D, D]  # q, k, v, out (bf16); then lse (one fp32)
        assert len(raw) == 2 * sum(sizes) + 4, (D, len(raw))
        parts, off = [], 0
        for n in sizes:
            parts.append(torch.frombuffer(raw, dtype=torch.bfloat16, count=n, offset=off))
            off += 2 * n
        lse_c = torch.frombuffer(raw, dtype=torch.float32, count=1, offset=off)
        q, k, v, out_c = (t.reshape(1, -1, 1, D) for t in parts)
        out, lse, _ = flash_attn_det.flash_attn_func(q, k, v, return_attn_probs=True)
        assert torch.equal(out, out_c), D
        assert torch.equal(lse.reshape(1), lse_c), (D, lse.item(), lse_c.item())


# --- CUDA ---------------------------------------------------------------------

def test_cuda_demo_builds(cuda_demo_exe):
    exe, _ = cuda_demo_exe
    assert os.access(exe, os.X_OK)


@pytest.fixture(scope="module")
def cuda_demo(cuda_demo_exe):
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    exe, d = cuda_demo_exe
    return Demo(exe, d)


def test_cuda_demo_exit_status_matches_checks(cuda_demo):
    assert cuda_demo.proc.returncode in (0, 1), cuda_demo.stdout + cuda_demo.proc.stderr
    _check_exit_status(cuda_demo)
    assert set(cuda_demo.checks) == set(CUDA_CHECKS), sorted(set(cuda_demo.checks)
                                                             ^ set(CUDA_CHECKS))


@pytest.mark.parametrize("name", CUDA_CHECKS)
def test_cuda_demo_check(cuda_demo, name):
    assert cuda_demo.verdict(name) == "ok", cuda_demo.verdict(name)


def test_cuda_demo_bits_equal_python_api(cuda_demo):
    q, k, v, out_c, lse_c = _load_dump(cuda_demo.dump, "cuda")
    set_deterministic_mode(True, split_size=CFG0["split_size"])
    out, lse, _ = flash_attn_func(q, k, v, causal=True, return_attn_probs=True)
    assert torch.equal(out, out_c)
    assert torch.equal(lse, lse_c)
