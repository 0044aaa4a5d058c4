"""Reusable pieces of the flash_attn_det benchmarks (forward now, decode later).

    Config            one attention problem (dtype, B, Lq, Lk, H, Hkv, D, causal)
    make_impls()      flash_attn_det det/fast, torch SDPA flash/cuDNN/efficient,
                      flash_attn (FA2) and flash_attn_interface (FA3) when importable
    make_input_sets() fresh random inputs, rotated when one set fits in L2
    time_ms()         CUDA-event timing (perf_counter on CPU): warm-up, iterations, median
    peak_extra_mb()   peak memory of one call beyond its inputs and output
    measure()         all of the above for one (impl, config) -> one JSON-able record
    measure_rounds()  measure() for every impl of a config, the impls taking turns
    attn_flops()      4*B*H*Lq*Lk*D, halved for causal when Lq == Lk
    env_info(), JsonlWriter, markdown_table(), log()

Layout: every impl takes flash_attn's (B, L, H, D) tensors. SDPA is measured twice per
backend: on (B, H, L, D) transposed views of those tensors (sdpa_flash, sdpa_cudnn: what
HF-style models pass) and on contiguous (B, H, L, D) copies made before the timed calls
(sdpa_flash_bhld, sdpa_cudnn_bhld: SDPA's own layout); a report's ratio against a backend is
against the faster of its two layouts (best_of). enable_gqa=True when Hkv < H. Causal means
bottom-right aligned (flash_attn's rule); for Lq != Lk SDPA is given
torch.nn.attention.bias.causal_lower_right instead of is_causal (top-left).
"""
import contextlib
import dataclasses
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # torch < 2.3
    SDPBackend = sdpa_kernel = None

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, REPO)

DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
L2_FALLBACK_BYTES = 50 * 2 ** 20  # H100's L2
MB = 2 ** 20


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def short_error(exc, limit=300):
    text = " ".join(str(exc).split())
    if isinstance(exc, BaseException):
        text = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --------------------------------------------------------------------------
# environment
# --------------------------------------------------------------------------

def git_commit():
    """Short commit of the checkout, '+dirty' when it has uncommitted changes; None if no git.
    FLASH_ATTN_DET_COMMIT overrides it: a copy of a commit made with `git archive` (what
    dev/device_all.sh runs on a GPU machine) has no .git of its own."""
    if os.environ.get("FLASH_ATTN_DET_COMMIT"):
        return os.environ["FLASH_ATTN_DET_COMMIT"]
    try:
        sha = subprocess.run(["git", "-C", REPO, "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if sha.returncode:
            return None
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
        return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def gpu_usable():
    """(ok, reason): a CUDA device visible to torch and a flash_attn_det build with CUDA."""
    if not torch.cuda.is_available():
        return False, "no CUDA device visible to torch (torch.cuda.is_available() is False)"
    try:
        import flash_attn_det
    except ImportError as exc:
        return False, f"cannot import flash_attn_det ({exc}); build it with " \
                      "`python3 setup.py build_ext --inplace`"
    if not flash_attn_det.has_cuda():
        return False, "this flash_attn_det build has no CUDA path (built without nvcc)"
    return True, ""


def env_info(device):
    info = {"torch": torch.__version__, "python": platform.python_version(),
            "git_commit": git_commit(), "host": platform.node()}
    try:
        import flash_attn_det
        info["flash_attn_det"] = flash_attn_det.__version__
    except ImportError:
        info["flash_attn_det"] = None
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        cap = torch.cuda.get_device_capability(idx)
        info.update(device=torch.cuda.get_device_name(idx), sm=f"{cap[0]}{cap[1]}",
                    cuda=torch.version.cuda, l2_bytes=l2_cache_bytes(device))
        try:
            info["cudnn"] = torch.backends.cudnn.version()
        except Exception:
            info["cudnn"] = None
    else:
        info["device"] = f"CPU {platform.processor() or platform.machine()} " \
                         f"({torch.get_num_threads()} threads)"
    return info


def l2_cache_bytes(device):
    if device.type != "cuda":
        return L2_FALLBACK_BYTES
    props = torch.cuda.get_device_properties(device)
    return int(getattr(props, "L2_cache_size", 0) or L2_FALLBACK_BYTES)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------
# problems
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Config:
    dtype: str   # "fp16" | "bf16"
    B: int
    Lq: int
    Lk: int
    H: int
    Hkv: int
    D: int
    causal: bool

    def label(self):
        gqa = f" GQA{self.H}/{self.Hkv}" if self.Hkv != self.H else ""
        L = f"L{self.Lq}" if self.Lq == self.Lk else f"Lq{self.Lq} Lk{self.Lk}"
        return (f"{self.dtype} D{self.D} {L} B{self.B} H{self.H}{gqa} "
                f"{'causal' if self.causal else 'non-causal'}")

    def fields(self):
        return {"dtype": self.dtype, "B": self.B, "L": self.Lq, "Lk": self.Lk, "H": self.H,
                "Hkv": self.Hkv, "D": self.D, "causal": self.causal}


def visible_pairs(Lq, Lk, causal):
    """(query, key) pairs one head computes. Causal with Lq == Lk counts half of Lq*Lk
    (the usual convention); with Lq != Lk the exact bottom-right-aligned count."""
    if not causal:
        return Lq * Lk
    if Lq == Lk:
        return Lq * Lk / 2
    off = Lk - Lq  # row i sees keys j <= i + off
    return sum(min(Lk, max(0, i + off + 1)) for i in range(Lq))


def attn_flops(cfg):
    """Forward FLOPs: 2 matmuls of 2*D flops per visible (query, key) pair per head."""
    return 4.0 * cfg.B * cfg.H * visible_pairs(cfg.Lq, cfg.Lk, cfg.causal) * cfg.D


def set_bytes(cfg):
    """Bytes touched by one call: q, k, v and out."""
    elt = torch.finfo(DTYPES[cfg.dtype]).bits // 8
    return elt * cfg.B * cfg.D * (2 * cfg.Lq * cfg.H + 2 * cfg.Lk * cfg.Hkv)


def num_input_sets(cfg, device, max_sets=256, max_bytes=4 << 30):
    """1 when one input set is larger than L2; else enough sets that one pass over
    them moves >= 3x the L2 size (bounded by max_sets and max_bytes)."""
    if device.type != "cuda":
        return 1
    nbytes, l2 = set_bytes(cfg), l2_cache_bytes(device)
    if nbytes >= l2:
        return 1
    return max(1, min(max_sets, math.ceil(3 * l2 / nbytes), max_bytes // nbytes))


def make_input_sets(cfg, device, n=None, seed=0):
    """n fresh standard-normal (q, k, v) sets in (B, L, H, D) layout (never zeros)."""
    n = n or num_input_sets(cfg, device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    dtype = DTYPES[cfg.dtype]

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return [(randn(cfg.B, cfg.Lq, cfg.H, cfg.D), randn(cfg.B, cfg.Lk, cfg.Hkv, cfg.D),
             randn(cfg.B, cfg.Lk, cfg.Hkv, cfg.D)) for _ in range(n)]


# --------------------------------------------------------------------------
# implementations
# --------------------------------------------------------------------------

@dataclasses.dataclass
class Impl:
    """call(q, k, v, causal) -> output, in flash layout in, native layout out.
    context() wraps warm-up, timing and memory measurement (mode switches, SDPA
    backend selection), so none of that is inside the timed calls."""
    name: str
    call: object
    context: object = contextlib.nullcontext
    layout: str = "bshd"  # output layout: "bshd" (flash) or "bhsd" (SDPA)
    note: str = ""
    # prepare(q, k, v) -> the impl's own inputs, made once per input set before any
    # timed call (the contiguous-layout SDPA impls); None: the flash-layout set as is
    prepare: object = None

    def to_bshd(self, out):
        return out.transpose(1, 2) if self.layout == "bhsd" else out

    def inputs(self, arg_sets):
        return arg_sets if self.prepare is None else [self.prepare(*a) for a in arg_sets]


@contextlib.contextmanager
def fad_mode(enabled, split_size=None):
    """flash_attn_det's process-wide mode, restored on exit."""
    import flash_attn_det as fad
    saved = (fad.get_deterministic_mode(), fad.get_split_size())
    fad.set_deterministic_mode(enabled, split_size or saved[1])
    try:
        yield
    finally:
        fad.set_deterministic_mode(*saved)


def _fad_impl(name, det, split_size):
    from flash_attn_det import flash_attn_func

    def call(q, k, v, causal):
        return flash_attn_func(q, k, v, causal=causal)

    return Impl(name, call, lambda: fad_mode(det, split_size))


def _torch_at_least(major, minor):
    try:
        parts = torch.__version__.split("+")[0].split(".")
        return (int(parts[0]), int(parts[1])) >= (major, minor)
    except (ValueError, IndexError):
        return True


def sdpa_call(q, k, v, causal):
    """torch SDPA on (B, H, L, D) views of flash-layout tensors; output (B, H, Lq, D)."""
    return sdpa_call_bhld(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal)


def to_bhld(q, k, v):
    """Contiguous (B, H, L, D) copies of flash-layout tensors: SDPA's own layout."""
    return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))


def sdpa_call_bhld(qt, kt, vt, causal):
    """torch SDPA on (B, H, L, D) tensors (views or contiguous); output (B, H, Lq, D)."""
    kw = {}
    if qt.shape[1] != kt.shape[1]:
        if not _torch_at_least(2, 5):
            raise RuntimeError("GQA through SDPA needs enable_gqa (torch >= 2.5)")
        kw["enable_gqa"] = True
    if causal and qt.shape[2] != kt.shape[2]:
        from torch.nn.attention.bias import causal_lower_right
        return F.scaled_dot_product_attention(
            qt, kt, vt, attn_mask=causal_lower_right(qt.shape[2], kt.shape[2]), **kw)
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, **kw)


def _sdpa_impl(name, backend_attr, contiguous=False):
    backend = getattr(SDPBackend, backend_attr, None) if SDPBackend is not None else None

    def context():
        if backend is None:
            raise RuntimeError(f"SDPBackend.{backend_attr} is not in torch {torch.__version__}")
        return sdpa_kernel(backend)

    if contiguous:
        return Impl(name, sdpa_call_bhld, context, layout="bhsd", prepare=to_bhld,
                    note="contiguous (B, H, L, D) inputs")
    return Impl(name, sdpa_call, context, layout="bhsd")


def _flash_attn_impls():
    """flash_attn (FA2) and flash_attn_interface (FA3, Hopper) when importable."""
    impls = []
    try:
        from flash_attn import flash_attn_func as fa2
        import flash_attn
        impls.append(Impl("flash_attn", lambda q, k, v, causal: fa2(q, k, v, causal=causal),
                          note=f"flash_attn {getattr(flash_attn, '__version__', '?')}"))
    except Exception:
        pass
    try:
        from flash_attn_interface import flash_attn_func as fa3

        def call3(q, k, v, causal):
            out = fa3(q, k, v, causal=causal)
            return out[0] if isinstance(out, tuple) else out  # older FA3 returns (out, lse)

        impls.append(Impl("flash_attn3", call3, note="flash_attn_interface (FA3)"))
    except Exception:
        pass
    return impls


IMPL_ORDER = ["fad_det", "fad_fast", "sdpa_flash", "sdpa_flash_bhld", "sdpa_cudnn",
              "sdpa_cudnn_bhld", "sdpa_efficient", "flash_attn", "flash_attn3"]
# A peer measured in both layouts: its ratios are against the faster (best_of).
PEER_LAYOUTS = {"sdpa_flash": ("sdpa_flash", "sdpa_flash_bhld"),
                "sdpa_cudnn": ("sdpa_cudnn", "sdpa_cudnn_bhld")}


def best_of(per_impl, peer):
    """The record of `peer` ("sdpa_flash", "sdpa_cudnn") in its faster layout, from a
    {impl name: record} dict of one config; None when neither layout has a time."""
    recs = [per_impl.get(n) for n in PEER_LAYOUTS.get(peer, (peer,))]
    recs = [r for r in recs if r is not None and "error" not in r and r.get("tflops")]
    return max(recs, key=lambda r: r["tflops"]) if recs else None


def make_impls(split_size=None, names=None):
    """The implementations to compare, in IMPL_ORDER, optionally filtered by name."""
    impls = [_fad_impl("fad_det", True, split_size), _fad_impl("fad_fast", False, split_size),
             _sdpa_impl("sdpa_flash", "FLASH_ATTENTION"),
             _sdpa_impl("sdpa_flash_bhld", "FLASH_ATTENTION", contiguous=True),
             _sdpa_impl("sdpa_cudnn", "CUDNN_ATTENTION"),
             _sdpa_impl("sdpa_cudnn_bhld", "CUDNN_ATTENTION", contiguous=True),
             _sdpa_impl("sdpa_efficient", "EFFICIENT_ATTENTION")] + _flash_attn_impls()
    if names:
        unknown = set(names) - set(IMPL_ORDER)
        if unknown:
            raise ValueError(f"unknown impl(s) {sorted(unknown)}; known: {IMPL_ORDER}")
        impls = [i for i in impls if i.name in names]
    return impls


# --------------------------------------------------------------------------
# measurement
# --------------------------------------------------------------------------

def time_ms(fn, arg_sets, iters, warmup, device):
    """Per-call times in ms of fn(*arg_sets[i % n]): warm-up first, then `iters` calls
    timed one by one (CUDA events on GPU, perf_counter on CPU). Returns the list."""
    n = len(arg_sets)
    for i in range(warmup):
        fn(*arg_sets[i % n])
    sync(device)
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(iters)]
        for i, (start, end) in enumerate(events):
            args = arg_sets[i % n]
            start.record()
            fn(*args)
            end.record()
        torch.cuda.synchronize(device)
        return [s.elapsed_time(e) for s, e in events]
    times = []
    for i in range(iters):
        args = arg_sets[i % n]
        t0 = time.perf_counter()
        fn(*args)
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def summarize_ms(times):
    ts = sorted(times)
    q = lambda f: ts[min(len(ts) - 1, int(f * len(ts)))]  # noqa: E731
    return {"ms": statistics.median(ts), "ms_min": ts[0], "ms_p20": q(0.2), "ms_p80": q(0.8),
            "iters": len(ts)}


def peak_extra_mb(fn, args, device):
    """Peak memory allocated during one call of fn(*args) beyond what was allocated
    before it (the inputs) and the output it returns, in MB (2**20 bytes). Call it
    after a warm-up so that one-time initialisation is not counted. None on CPU."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    out = fn(*args)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    outs = out if isinstance(out, (tuple, list)) else (out,)
    out_bytes = sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))
    del out, outs
    return (peak - before - out_bytes) / MB


def _set_times(rec, times):
    """rec's timing fields from all of its per-call times (kept in rec['_times']
    for measure_rounds; JsonlWriter drops fields that start with '_')."""
    rec["_times"] = list(times)
    rec.update(summarize_ms(times))
    rec["tflops"] = rec["flops"] / (rec["ms"] * 1e-3) / 1e12


def turn_order(items, r):
    """The order of the impls' turns in round r: as given in even rounds, reversed in odd
    ones, so that no impl always follows the same one. The H200 runs at its power limit,
    and the clock an impl meets depends on what ran just before it (in one fixed order, D128
    L2k's backward read 0.92-0.94x cuDNN on a build that alternating turns read at 1.00x:
    benchmarks/results/2026-11-30_h200_bwd_final_c16ed00.md, section 4)."""
    items = list(items)
    return items if r % 2 == 0 else items[::-1]


def measure_rounds(impls, cfg, arg_sets, device, iters, warmup, rounds=1):
    """measure() for each impl of one config, then rounds - 1 more turns in which
    each impl that worked gets the same warm-up and iters more timed calls; the
    median is over all of an impl's calls. Taking turns (in turn_order) puts every impl
    under the same drift of clocks and temperature during the config, so a ratio between
    two of them (det vs fast: a few percent) is not set by which one ran first.
    Records carry max_abs_diff against the first impl that produced an output."""
    recs, ref = [], None
    for impl in impls:
        rec, out = measure(impl, cfg, arg_sets, device, iters, warmup, ref)
        if ref is None and out is not None:
            ref = out  # later impls report max_abs_diff against the first that ran
            rec["reference_of_diffs"] = True
        del out
        recs.append(rec)
    for r in range(1, rounds):
        for impl, rec in turn_order(zip(impls, recs), r):
            if "error" in rec:
                continue
            try:
                sets = impl.inputs(arg_sets)
                with impl.context():
                    fn = lambda q, k, v: impl.call(q, k, v, cfg.causal)  # noqa: E731
                    _set_times(rec, rec["_times"] + time_ms(fn, sets, iters, warmup, device))
                del sets
            except Exception as exc:  # recorded, as in measure(); the other impls go on
                rec["error"] = "later round: " + short_error(exc)
    for rec in recs:
        rec["rounds"] = rounds
    return recs


def measure(impl, cfg, arg_sets, device, iters, warmup, ref=None):
    """One (impl, config) record. Errors are caught and recorded, never raised.
    ref: an output in (B, L, H, D) of arg_sets[0] to report max_abs_diff against.
    Returns (record, output of arg_sets[0] in (B, L, H, D) or None)."""
    rec = dict(impl=impl.name, **cfg.fields(), flops=attn_flops(cfg),
               input_sets=len(arg_sets), warmup=warmup)
    if impl.note:
        rec["note"] = impl.note
    out0 = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            arg_sets = impl.inputs(arg_sets)  # (untimed: the contiguous-layout copies)
            with impl.context():
                fn = lambda q, k, v: impl.call(q, k, v, cfg.causal)  # noqa: E731
                out0 = impl.to_bshd(fn(*arg_sets[0]))  # probe: errors surface here
                sync(device)
                times = time_ms(fn, arg_sets, iters, warmup, device)
                _set_times(rec, times)
                rec["peak_extra_mb"] = peak_extra_mb(fn, arg_sets[0], device)
            if not torch.isfinite(out0).all():
                rec["warning"] = "output has non-finite values"
            if ref is not None:
                rec["max_abs_diff"] = (out0.float() - ref.float()).abs().max().item()
        except Exception as exc:
            rec["error"] = short_error(exc)
            reasons = [str(w.message) for w in caught]
            if reasons:
                rec["error"] += " | " + short_error(reasons[0], 300)
            out0 = None
            if device.type == "cuda":
                try:
                    torch.cuda.synchronize(device)
                except Exception as sync_exc:  # a sticky CUDA error: nothing after works
                    rec["error"] += " | CUDA context broken: " + short_error(sync_exc, 200)
    return rec, out0


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------

class JsonlWriter:
    """Appends one JSON record per line and flushes, so a crash keeps what was measured."""

    def __init__(self, path, common=None):
        self.path, self.common = path, dict(common or {})
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._f = open(path, "a")

    def write(self, rec):
        rec = {k: v for k, v in rec.items() if not k.startswith("_")}  # (raw times)
        self._f.write(json.dumps({**rec, **self.common}, default=str) + "\n")
        self._f.flush()

    def close(self):
        self._f.close()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def fmt_num(x):
    """312.4, 3.14, 0.00123: one decimal from 10 up, two from 0.1, else 3 significant digits."""
    if x == 0 or abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}" if abs(x) >= 0.1 else f"{x:.3g}"


def markdown_table(headers, rows, align=None):
    """headers: list of str; rows: lists of cells (str/number/None); align: 'l'/'r' per column."""
    align = align or ["l"] + ["r"] * (len(headers) - 1)

    def cell(x):
        return "-" if x is None else fmt_num(x) if isinstance(x, float) else str(x)

    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(":---" if a == "l" else "---:" for a in align) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def timestamp():
    return datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
