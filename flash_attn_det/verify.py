"""Checks an install of flash_attn_det: memory, speed and batch invariance beside torch SDPA.

    python -m flash_attn_det.verify                 # or the console script: flash-attn-det
    python -m flash_attn_det.verify --json verify.json

Three checks, each for flash_attn_det beside torch SDPA on the same inputs, in one run:

  MEMORY       peak extra memory beyond inputs and output (B4 L2048 H32 D64 fp16)
  PERFORMANCE  median CUDA-event time and TFLOP/s = 4*B*H*L*L*D / t
               (B8 L4096 H32 D64 fp16, non-causal)
  INVARIANCE   batch 8 == batch 4 + batch 4, bit for bit (B8 L2048 H32 D64), and a
               decode row (1 query token, 4096 keys) alone == inside a batch of 16

plus a correctness line (max abs error against a float64 SDPA math reference), a
run-to-run determinism check, and a line in words saying which implementation was
faster. Implementations: flash_attn_det in deterministic mode ("fad det") and in
fast mode ("fad fast"); on the GPU torch SDPA's flash, efficient and cuDNN backends
(a backend that errors is reported "unavailable"), on the CPU torch SDPA as it runs there.
Every figure printed is measured in this run.

Exit status: 0 when flash_attn_det's deterministic mode passes the invariance
checks (batch split, decode, run-to-run), 1 otherwise. SDPA and fast-mode
invariance are informational.

Without a usable GPU (torch sees no CUDA device, or this build of flash_attn_det
has no CUDA kernels) the same checks run on the CPU path at a small size (B2 L256 H4
D64, invariance B2 vs 1+1) and the report says so, and how to build the kernels; the
memory check needs CUDA. The table goes to stdout, progress lines to stderr.
"""
import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
import warnings

import torch
import torch.nn.functional as F

import flash_attn_det
from flash_attn_det import flash_attn_func, get_deterministic_mode, get_split_size
from flash_attn_det import set_deterministic_mode

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # torch < 2.3: SDPA rows are reported unavailable
    SDPBackend = sdpa_kernel = None

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}

# Default sizes (B, L, H, D); decode = (batch, keys).
GPU_DEFAULTS = {"memory": (4, 2048, 32, 64), "perf": (8, 4096, 32, 64),
                "invariance": (8, 2048, 32, 64), "decode": (16, 4096), "iters": 30,
                "warmup": 5}
CPU_DEFAULTS = {"memory": None, "perf": (2, 256, 4, 64), "invariance": (2, 256, 4, 64),
                "decode": (4, 1024), "iters": 3, "warmup": 1}

L2_FALLBACK_BYTES = 50 * 2 ** 20  # H100
REF_CHUNK_BYTES = 2 ** 30         # float64 score block per reference chunk


def _log(msg):
    print(f"[verify] {msg}", file=sys.stderr, flush=True)


class ImplError(RuntimeError):
    """An implementation's call failed; the message already names the cause."""


def _short(exc, limit=160):
    """One line, at most limit characters, for an exception or a message."""
    text = " ".join(str(exc).split())
    if isinstance(exc, BaseException) and not isinstance(exc, ImplError):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------
# implementations
# --------------------------------------------------------------------------

@contextlib.contextmanager
def _fad_mode(enabled):
    """flash_attn_det's process-wide mode, restored on exit."""
    saved = (get_deterministic_mode(), get_split_size())
    set_deterministic_mode(enabled, saved[1])
    try:
        yield
    finally:
        set_deterministic_mode(*saved)


class Impl:
    """One attention implementation; call it inside `with impl.context():`.

    Takes and returns flash_attn's layout (B, L, H, D); SDPA gets (B, H, L, D)
    transposed views of the same tensors and its output is viewed back. A contiguous
    SDPA impl is timed on contiguous (B, H, L, D) copies made before the timed calls
    (prepare, then native): SDPA's own layout, which models rarely pass.
    """

    def __init__(self, key, label, det=None, backend=None, contiguous=False):
        self.key, self.label, self.det, self.backend = key, label, det, backend
        self.contiguous = contiguous
        self.error = None  # set when the first call failed: reported "unavailable"

    @property
    def is_fad(self):
        return self.det is not None

    def context(self):
        if self.is_fad:
            return _fad_mode(self.det)
        if self.backend is None:  # (the CPU: SDPA picks its own kernel)
            return contextlib.nullcontext()
        if sdpa_kernel is None:
            raise RuntimeError("torch.nn.attention.sdpa_kernel needs torch >= 2.3")
        return sdpa_kernel(self.backend)

    def __call__(self, q, k, v):
        if self.is_fad:
            return flash_attn_func(q, k, v)
        return self.native(*self.prepare(q, k, v)).transpose(1, 2)

    def prepare(self, q, k, v):
        """The impl's own inputs from flash-layout ones (made outside timed calls)."""
        if self.is_fad:
            return q, k, v
        views = (q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return tuple(t.contiguous() for t in views) if self.contiguous else views

    def native(self, q, k, v):
        """One call on prepare()'s inputs; the output in the impl's own layout."""
        if self.is_fad:
            return flash_attn_func(q, k, v)
        return F.scaled_dot_product_attention(q, k, v)

    def run(self, q, k, v):
        """One call in its own context, SDPA's warnings captured (not printed)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                with self.context():
                    return self(q, k, v)
            except Exception as exc:
                reasons = [str(w.message) for w in caught]
                raise ImplError(_short(exc) + (f" ({_short(reasons[0], 200)})"
                                               if reasons else "")) from None


def make_impls(on_cpu):
    """flash_attn_det's two modes and the SDPA backends that can exist on this device."""
    impls = [Impl("fad_det", "fad det", det=True), Impl("fad_fast", "fad fast", det=False)]
    if on_cpu:  # SDPA's GPU backends cannot run here: one row for SDPA as the CPU runs it
        return impls + [Impl("sdpa", "sdpa (cpu)")]
    names = [("sdpa_flash", "sdpa flash", "FLASH_ATTENTION", False),
             ("sdpa_efficient", "sdpa efficient", "EFFICIENT_ATTENTION", False),
             ("sdpa_cudnn", "sdpa cudnn", "CUDNN_ATTENTION", False),
             ("sdpa_cudnn_bhld", "sdpa cudnn BHLD", "CUDNN_ATTENTION", True)]
    for key, label, attr, contiguous in names:
        impl = Impl(key, label, backend=getattr(SDPBackend, attr, None) if SDPBackend else None,
                    contiguous=contiguous)
        if impl.backend is None:
            impl.error = f"SDPBackend.{attr} not in this torch"
        impls.append(impl)
    return impls


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------

def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _randn(shape, dtype, device, gen):
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _qkv(B, Lq, Lk, H, D, dtype, device, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return (_randn((B, Lq, H, D), dtype, device, gen), _randn((B, Lk, H, D), dtype, device, gen),
            _randn((B, Lk, H, D), dtype, device, gen))


def _max_diff(a, b):
    return (a.float() - b.float()).abs().max().item()


def _l2_bytes(device):
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or L2_FALLBACK_BYTES)


def _time_ms(impl, sets, iters, warmup, device):
    """Median milliseconds of one call, rotating among the input sets."""
    sets = [impl.prepare(*s) for s in sets]  # (untimed)
    with impl.context():
        for i in range(warmup):
            impl.native(*sets[i % len(sets)])
        _sync(device)
        if device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(iters)]
            for i, (start, end) in enumerate(events):
                args = sets[i % len(sets)]
                start.record()
                impl.native(*args)
                end.record()
            torch.cuda.synchronize(device)
            times = [s.elapsed_time(e) for s, e in events]
        else:
            times = []
            for i in range(iters):
                args = sets[i % len(sets)]
                t0 = time.perf_counter()
                impl.native(*args)
                times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _peak_extra_mb(impl, q, k, v, device):
    """Peak memory allocated during one call beyond what was allocated before
    (the inputs) and the output it returns, in MB (2**20 bytes)."""
    q, k, v = impl.prepare(q, k, v)  # (a contiguous impl's copies are inputs, not its cost)
    with impl.context():
        impl.native(q, k, v)  # warm-up: lazy initialisation is not the call's cost
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        out = impl.native(q, k, v)
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
    out_bytes = out.numel() * out.element_size()
    del out
    return (peak - before - out_bytes) / 2 ** 20


def _reference(q, k, v):
    """float64 SDPA math reference in flash layout, chunked over batch and heads."""
    B, Lq, H, D = q.shape
    Lk = k.shape[1]
    per_head = Lq * Lk * 8
    hc = max(1, min(H, REF_CHUNK_BYTES // max(per_head, 1)))
    out = torch.empty(q.shape, dtype=torch.float64, device=q.device)
    ctx = sdpa_kernel(SDPBackend.MATH) if sdpa_kernel is not None else contextlib.nullcontext()
    with ctx:
        for b in range(B):
            for h in range(0, H, hc):
                qs, ks, vs = (t[b:b + 1, :, h:h + hc].double().transpose(1, 2) for t in (q, k, v))
                out[b:b + 1, :, h:h + hc] = F.scaled_dot_product_attention(qs, ks, vs).transpose(1, 2)
    return out


# --------------------------------------------------------------------------
# the checks
# --------------------------------------------------------------------------

def check_memory(impls, shape, dtype, device, res):
    B, L, H, D = shape
    q, k, v = _qkv(B, L, L, H, D, dtype, device, seed=1)
    for impl in impls:
        if impl.error:
            continue
        _log(f"memory: {impl.label}")
        try:
            res[impl.key]["extra_mb"] = _peak_extra_mb(impl, q, k, v, device)
        except Exception as exc:
            res[impl.key]["memory_error"] = _short(exc)
    del q, k, v


def check_perf(impls, shape, dtype, device, iters, warmup, res, correctness):
    B, L, H, D = shape
    q, k, v = _qkv(B, L, L, H, D, dtype, device, seed=2)
    sets = [(q, k, v)]
    if device.type == "cuda":  # keep the timings off the L2 cache when one set fits in it
        set_bytes = 4 * q.numel() * q.element_size()
        l2 = _l2_bytes(device)
        if set_bytes < l2:
            n = min(16, math.ceil(3 * l2 / set_bytes))
            sets += [_qkv(B, L, L, H, D, dtype, device, seed=100 + i) for i in range(n - 1)]
    flops = 4.0 * B * H * L * L * D
    for impl in impls:
        if impl.error:
            continue
        _log(f"performance: {impl.label} ({iters} iterations)")
        try:
            ms = _time_ms(impl, sets, iters, warmup, device)
            res[impl.key].update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12)
        except Exception as exc:
            res[impl.key]["perf_error"] = _short(exc)

    # correctness on the first (up to) two sequences of the same inputs
    nb = min(B, 2)
    _log(f"correctness: float64 math reference on {nb} sequence(s)")
    ref = _reference(q[:nb], k[:nb], v[:nb])
    for impl in impls:
        if impl.error:
            continue
        try:
            out = impl.run(q[:nb], k[:nb], v[:nb])
            correctness[impl.key] = (out.double() - ref).abs().max().item()
        except Exception as exc:
            correctness[impl.key] = None
            res[impl.key]["correctness_error"] = _short(exc)
    correctness["reference_sequences"] = nb


def check_invariance(impls, shape, decode, dtype, device, res):
    B, L, H, D = shape
    half = B // 2
    q, k, v = _qkv(B, L, L, H, D, dtype, device, seed=3)
    Bd, Lk = decode
    qd, kd, vd = _qkv(Bd, 1, Lk, H, D, dtype, device, seed=4)
    for impl in impls:
        if impl.error:
            continue
        r = res[impl.key]
        _log(f"invariance: {impl.label}")
        try:
            full = impl.run(q, k, v)
            parts = torch.cat([impl.run(q[:half], k[:half], v[:half]),
                               impl.run(q[half:], k[half:], v[half:])], 0)
            _sync(device)
            r["batch_equal"] = bool(torch.equal(full, parts))
            r["batch_max_diff"] = _max_diff(full, parts)
            full_d = impl.run(qd, kd, vd)
            equal, diff = True, 0.0
            for b in range(Bd):
                one = impl.run(qd[b:b + 1], kd[b:b + 1], vd[b:b + 1])
                equal &= bool(torch.equal(one, full_d[b:b + 1]))
                diff = max(diff, _max_diff(one, full_d[b:b + 1]))
            r["decode_equal"], r["decode_max_diff"] = equal, diff
            if impl.key == "fad_det":
                reruns = [impl.run(q, k, v) for _ in range(3)]
                r["rerun_equal"] = all(torch.equal(full, x) for x in reruns)
        except Exception as exc:
            r["invariance_error"] = _short(exc)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def _fmt_eq(equal, diff):
    if equal is None:
        return "-"
    return "equal (0)" if equal else f"DIFF ({diff:.1e})"


def _shape_str(shape):
    return "B{} L{} H{} D{}".format(*shape)


def print_report(info, cfg, impls, res, correctness, passed, out=sys.stdout):
    def p(line=""):
        print(line.rstrip(), file=out)

    p(f"flash_attn_det {info['flash_attn_det']} | torch {info['torch']} | {info['device']} | "
      f"{cfg['dtype']}")
    if info["on_cpu"]:
        p(f"RAN ON CPU ({info['cpu_reason']}): small sizes, plain C path; "
          "not the GPU report")
    mem = f"memory {_shape_str(cfg['memory'])}" if cfg["memory"] else "memory n/a on CPU"
    Bi = cfg["invariance"][0]
    p(f"{mem} | perf {_shape_str(cfg['perf'])} non-causal, median of {cfg['iters']} | "
      f"invariance B{Bi} vs {Bi // 2}+{Bi - Bi // 2} L{cfg['invariance'][1]}; decode 1 q x "
      f"{cfg['decode'][1]} keys, B1 vs B{cfg['decode'][0]} | t_det/t = det time / impl time")
    mem_cols = not info["on_cpu"]  # (memory is measured on the GPU only)
    hdr = (f"{'impl':<16}" + (f"{'extra MB':>9}{'vs flash':>9}" if mem_cols else "") +
           f"{'ms':>9}{'TFLOP/s':>9}"
           f"{'t_det/t':>9}  {'batch split':<17}decode B1 in B{cfg['decode'][0]}")
    p(hdr)
    det_ms = res["fad_det"].get("ms")
    flash_mb = res.get("sdpa_flash", {}).get("extra_mb")
    for impl in impls:
        r = res[impl.key]
        if impl.error:
            p(f"{impl.label:<16}unavailable: {_short(impl.error, 75)}")
            continue
        mb = r.get("extra_mb")
        mb_s = f"{mb:9.1f}" if mb is not None else f"{'n/a':>9}"
        ratio = (f"{mb / flash_mb:8.2f}x" if mb is not None and flash_mb and flash_mb > 0
                 else f"{'-':>9}")
        ms = r.get("ms")
        if ms:
            tf = r["tflops"]
            ms_s = f"{ms:9.3f}" + (f"{tf:9.2f}" if tf >= 1 else f"{tf:9.4f}")
        else:
            ms_s = f"{'err':>9}{'-':>9}"
        slow = f"{det_ms / ms:8.2f}x" if ms and det_ms else f"{'-':>9}"
        p(f"{impl.label:<16}{mb_s + ratio if mem_cols else ''}{ms_s}{slow}  "
          f"{_fmt_eq(r.get('batch_equal'), r.get('batch_max_diff')):<17}"
          f"{_fmt_eq(r.get('decode_equal'), r.get('decode_max_diff')):<17}")
    errs = [f"{impl.label}: {k.split('_')[0]} {v}" for impl in impls if not impl.error
            for k, v in res[impl.key].items() if k.endswith("_error")]
    for e in errs:
        p(f"  error {_short(e, 110)}")
    corr = ", ".join(f"{impl.label} {correctness[impl.key]:.1e}" for impl in impls
                     if correctness.get(impl.key) is not None)
    p(f"correctness: max |out - float64 math ref| over {correctness.get('reference_sequences', 0)}"
      f" seq of perf config: {corr or 'n/a'}")
    rerun = res["fad_det"].get("rerun_equal")
    p(f"determinism: fad det 3 reruns bit-identical: {'yes' if rerun else 'NO'}")
    for line in _in_words(impls, res):
        p(line)
    if info["on_cpu"]:
        p(f"build: {info['build']}")
    verdict = "PASS" if passed else "FAIL"
    p(f"RESULT: {verdict}: flash_attn_det deterministic mode "
      f"{'is' if passed else 'is NOT'} batch-invariant and run-to-run identical"
      f"{' (CPU path)' if info['on_cpu'] else ''}")


def _in_words(impls, res):
    """Which implementation was faster (and used less memory), from this run's figures."""
    det = res["fad_det"]
    lines = []
    for impl in impls:
        r = res[impl.key]
        if impl.key == "fad_det" or impl.error:
            continue
        if det.get("ms") and r.get("ms"):
            a, b = det["ms"], r["ms"]
            if a <= b:
                lines.append(f"speed: fad det is {b / a:.2f}x as fast as {impl.label} "
                             f"({a:.3f} ms against {b:.3f} ms)")
            else:
                lines.append(f"speed: {impl.label} is {a / b:.2f}x as fast as fad det "
                             f"({b:.3f} ms against {a:.3f} ms)")
        if det.get("extra_mb") is not None and r.get("extra_mb") is not None:
            lines.append(f"memory: fad det used {det['extra_mb']:.1f} MB beyond inputs and "
                         f"output, {impl.label} {r['extra_mb']:.1f} MB")
    return lines


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def _environment():
    cuda_ok = torch.cuda.is_available()
    fad_cuda = flash_attn_det.has_cuda()
    info = {"flash_attn_det": flash_attn_det.__version__, "torch": torch.__version__,
            "python": platform.python_version(), "on_cpu": not (cuda_ok and fad_cuda)}
    info["build"] = ("CUDA kernels and the CPU path" if fad_cuda else
                     "CPU-only module (no CUDA kernels); to build the kernels, reinstall with "
                     "FLASH_ATTN_DET_CUDA=1 pip install -e . (README, Install)")
    if info["on_cpu"]:
        info["cpu_reason"] = ("no CUDA device visible to torch" if not cuda_ok else
                              "this flash_attn_det build has no CUDA kernels")
        info["device"] = f"CPU {platform.processor() or platform.machine()} " \
                         f"({torch.get_num_threads()} threads)"
    else:
        dev = torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(dev)
        info["device"] = f"{torch.cuda.get_device_name(dev)} (sm_{cap[0]}{cap[1]})"
        info["cuda"] = torch.version.cuda
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            info["cudnn"] = None
    return info


def _config(args, on_cpu):
    d = CPU_DEFAULTS if on_cpu else GPU_DEFAULTS

    def shape(default):
        if default is None:
            return None
        B, L, H, D = default
        return (args.batch or B, args.seqlen or L, args.heads or H, args.headdim or D)

    cfg = {"dtype": args.dtype, "memory": shape(d["memory"]), "perf": shape(d["perf"]),
           "invariance": shape(d["invariance"]),
           "decode": (d["decode"][0], args.seqlen or d["decode"][1]),
           "iters": args.iters or d["iters"], "warmup": d["warmup"]}
    B, L, H, D = cfg["invariance"]
    cfg["invariance"] = (max(B, 2), L, H, D)  # split into two halves needs >= 2 sequences
    return cfg


def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        prog="flash-attn-det",
        description="Check this install of flash_attn_det: memory, speed and batch "
                    "invariance beside torch SDPA, every figure measured in this run. Exit 0 "
                    "when deterministic mode is batch-invariant.")
    ap.add_argument("--batch", type=int, help="batch of every check (defaults: memory 4, "
                    "perf 8, invariance 8; CPU 2)")
    ap.add_argument("--seqlen", type=int, help="seqlen of every check and decode keys "
                    "(defaults: 2048 / 4096 / 2048, decode 4096; CPU 256, decode 1024)")
    ap.add_argument("--heads", type=int, help="heads (default 32; CPU 4)")
    ap.add_argument("--headdim", type=int, help="head dim (default 64)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    ap.add_argument("--iters", type=int, help="timed iterations (default 30; CPU 3)")
    ap.add_argument("--json", metavar="PATH", help="write all results as JSON")
    args = ap.parse_args(argv)
    for name in ("batch", "seqlen", "heads", "headdim", "iters"):
        val = getattr(args, name)
        if val is not None and val < 1:
            ap.error(f"--{name} must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    info = _environment()
    cfg = _config(args, info["on_cpu"])
    device = torch.device("cpu" if info["on_cpu"] else "cuda")
    dtype = DTYPES[args.dtype]
    _log(f"build: {flash_attn_det._C.BUILD}")  # what setup.py built on this machine, and why
    if info["on_cpu"]:
        _log(f"running on CPU: {info['cpu_reason']}")
    _log(f"device: {info['device']}")

    impls = make_impls(info["on_cpu"])
    res = {impl.key: {} for impl in impls}
    correctness = {}
    with torch.no_grad():
        # probe every implementation once on a small input
        q, k, v = _qkv(1, 128, 128, cfg["perf"][2], cfg["perf"][3], dtype, device, seed=0)
        for impl in impls:
            if impl.error:
                continue
            try:
                impl.run(q, k, v)
                _sync(device)
            except Exception as exc:
                impl.error = _short(exc, 300)
                _log(f"{impl.label}: unavailable ({impl.error})")
        del q, k, v
        if cfg["memory"]:
            check_memory(impls, cfg["memory"], dtype, device, res)
        check_perf(impls, cfg["perf"], dtype, device, cfg["iters"], cfg["warmup"], res,
                   correctness)
        check_invariance(impls, cfg["invariance"], cfg["decode"], dtype, device, res)

    det = res["fad_det"]
    passed = bool(det.get("batch_equal") and det.get("decode_equal") and det.get("rerun_equal"))
    print_report(info, cfg, impls, res, correctness, passed)
    if args.json:
        doc = {"env": info, "config": cfg, "passed": passed,
               "impls": {impl.key: dict(res[impl.key], label=impl.label,
                                        unavailable=impl.error) for impl in impls},
               "correctness_max_abs_err": correctness}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=2, default=str)
        _log(f"wrote {args.json}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
