"""Decode benchmark: one query token per sequence over a KV cache, flash_attn_det beside torch
SDPA (flash, cuDNN, efficient) on the same tensors, and the device copy bandwidth measured in
the same run.

    python3 benchmarks/bench_decode.py            # bf16 Hq32/Hkv8 D128, caches 8k/32k/mix, B 1/8/16/64
    python3 benchmarks/bench_decode.py --quick    # 8k and 32k, B 1/8/64, fewer iterations

What is timed, per (impl, config):
- eager: CUDA events around each Python call (warm-up, then `--iters` calls, median). Host
  launch overhead is inside when it is longer than the kernel (B=1).
- graph: the same calls captured in one CUDA graph (one call per rotated input set, repeated to
  at least 16 calls) and replayed; median replay time / calls. Device time without the host.
Bandwidth: bytes of K+V a call must read (sum over sequences of len * Hkv * D * 2 bytes * 2)
divided by the graph time, as a fraction of the copy bandwidth (bytes read + written by a
large device-to-device copy / its time, same run).

flash_attn_det: flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=..., causal=True) in
deterministic mode (fad_det; fad_det_ns1: with num_splits=1, every split of a (sequence, kv
head) in one CTA, the same bits; fad_fast: fast mode). fad_det_func: flash_attn_func(q, k, v,
causal=True) on the cache up to the longest sequence, as a model without per-sequence lengths
calls it (transformers' flash_attention_2 on an unpadded batch): its plan sees every length in
the shapes (on "mix" configs it attends every row of that span, as SDPA does). SDPA:
(B, H, 1, D) q and (B, Hkv, L, D) transposed views of the same cache, enable_gqa=True (no expanded copies), is_causal=False (one
query row sees every key); the `_bhld` impls give SDPA the cache in its own contiguous
(B, Hkv, L, D) layout instead (a copy made before timing), and the report's ratio takes the
faster of each backend's two layouts. SDPA has no per-sequence lengths: on the "mix" configs it attends the
whole cache up to the longest sequence (its bandwidth figure still counts only the bytes the
sequences need, so it is comparable; its output differs on the shorter sequences).
Caches are rotated among several independent sets when one set fits in 3x the L2 cache.
"""
import argparse
import os
import statistics
import sys
import warnings

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import (JsonlWriter, env_info, fad_mode, gpu_usable, l2_cache_bytes, log,  # noqa: E402
                    markdown_table, short_error, sync, timestamp)

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # torch < 2.3
    SDPBackend = sdpa_kernel = None

H, HKV, D = 32, 8, 128
IMPLS = ["fad_det", "fad_det_ns1", "fad_det_func", "fad_fast", "sdpa_flash", "sdpa_cudnn",
         "sdpa_efficient", "sdpa_flash_bhld", "sdpa_cudnn_bhld"]


def lengths(kind, B, gen):
    """(per-sequence cache lengths, cache capacity): a fixed length ("8192"), one in a larger
    cache ("1024@32768": 1k tokens in caches of 32k rows, as a server allocates them), or
    'mix' (uniform in [1k, 32k], seeded)."""
    if kind == "mix":
        lens = [int(x) for x in torch.randint(1024, 32768 + 1, (B,), generator=gen)]
        return lens, max(lens)
    length, _, cap = kind.partition("@")
    return [int(length)] * B, int(cap or length)


def kv_bytes(lens):
    return sum(lens) * HKV * D * 2 * 2  # K and V, bf16


def input_set_count(B, cap, l2):
    """Input sets to rotate among: enough that a pass over them holds 3x the L2 cache (at most 16)."""
    set_bytes = B * cap * HKV * D * 2 * 2
    return 1 if set_bytes >= 3 * l2 else min(16, -(-3 * l2 // set_bytes))


def make_sets(B, cap, lens, n, device, seed):
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device=device, dtype=torch.bfloat16)

    seqlens = torch.tensor(lens, dtype=torch.int32, device=device)
    return [(randn(B, 1, H, D), randn(B, cap, HKV, D), randn(B, cap, HKV, D), seqlens)
            for _ in range(n)]


def fad_call(q, kc, vc, seqlens, num_splits=0):
    import flash_attn_det as fad
    return fad.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=seqlens, causal=True,
                                       num_splits=num_splits)


def fad_func_call(q, kc, vc, lmax):
    import flash_attn_det as fad
    return fad.flash_attn_func(q, kc[:, :lmax], vc[:, :lmax], causal=True)


def sdpa_call(q, kc, vc, seqlens, lmax):
    qt = q.transpose(1, 2)
    kt, vt = kc[:, :lmax].transpose(1, 2), vc[:, :lmax].transpose(1, 2)
    return F.scaled_dot_product_attention(qt, kt, vt, enable_gqa=True).transpose(1, 2)


def sdpa_bhld_call(copies, q, kc, vc, seqlens, lmax):
    """sdpa_call on contiguous (B, Hkv, lmax, D) copies of the cache, made at a set's first call
    (main() calls every set once before timing) and kept in `copies` by the cache's address."""
    key = (kc.data_ptr(), vc.data_ptr())
    if key not in copies:
        copies[key] = tuple(x[:, :lmax].transpose(1, 2).contiguous() for x in (kc, vc))
    kt, vt = copies[key]
    return F.scaled_dot_product_attention(q.transpose(1, 2), kt, vt, enable_gqa=True).transpose(1, 2)


def impl_table(lmax, split_size=None):
    copies = {}

    def sdpa(backend_attr, bhld=False):
        def context():
            backend = getattr(SDPBackend, backend_attr, None) if SDPBackend else None
            if backend is None:
                raise RuntimeError(f"SDPBackend.{backend_attr} not in torch {torch.__version__}")
            return sdpa_kernel(backend)
        if bhld:
            return (lambda q, k, v, s: sdpa_bhld_call(copies, q, k, v, s, lmax)), context
        return (lambda q, k, v, s: sdpa_call(q, k, v, s, lmax)), context

    return {"fad_det": (fad_call, lambda: fad_mode(True, split_size)),
            "fad_det_ns1": (lambda q, k, v, s: fad_call(q, k, v, s, 1), lambda: fad_mode(True, split_size)),
            "fad_det_func": (lambda q, k, v, s: fad_func_call(q, k, v, lmax),
                             lambda: fad_mode(True, split_size)),
            "fad_fast": (fad_call, lambda: fad_mode(False)),
            "sdpa_flash": sdpa("FLASH_ATTENTION"),
            "sdpa_cudnn": sdpa("CUDNN_ATTENTION"),
            "sdpa_efficient": sdpa("EFFICIENT_ATTENTION"),
            "sdpa_flash_bhld": sdpa("FLASH_ATTENTION", bhld=True),
            "sdpa_cudnn_bhld": sdpa("CUDNN_ATTENTION", bhld=True)}


def time_eager(fn, sets, iters, warmup):
    n = len(sets)
    for i in range(warmup):
        fn(*sets[i % n])
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(iters)]
    for i, (a, b) in enumerate(ev):
        a.record()
        fn(*sets[i % n])
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3  # us


def capture_graph(fn, sets, min_calls=16):
    """(graph, calls): a CUDA graph of >= min_calls calls of fn over the rotated input sets,
    warmed up on a side stream first (torch's rule), replayed once."""
    n = len(sets)
    calls = max(min_calls, n)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(n, 3)):
            fn(*sets[i])  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(*sets[i % n])
    graph.replay()
    torch.cuda.synchronize()
    return graph, calls


def replay_times(graph, calls, replays):
    """Device time per call (us) of each of `replays` replays of a captured graph."""
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / calls)
    return times


def time_graph(fn, sets, replays, min_calls=16):
    """Median device time per call (us) of a CUDA graph holding >= min_calls calls."""
    graph, calls = capture_graph(fn, sets, min_calls)
    times = replay_times(graph, calls, replays)
    del graph
    return statistics.median(times)


def copy_bandwidth(device, nbytes=2 << 30, iters=20):
    """Bytes read + written per second by a device-to-device copy of nbytes."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        dst.copy_(src)
        b.record()
        torch.cuda.synchronize()
        ts.append(a.elapsed_time(b) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="8k/32k, B 1/8/64, fewer iterations")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--lens", default=None,
                    help="comma list of lengths (8192), length@capacity (1024@32768), mix")
    ap.add_argument("--batches", default=None, help="comma list of batch sizes")
    ap.add_argument("--iters", type=int, default=None)
    ap.add_argument("--split-size", type=int, default=None,
                    help="flash_attn_det's split_size in deterministic mode (default: the process's, 512)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(common.REPO, "benchmarks", "out"))
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()

    ok, why = gpu_usable()
    if not ok:
        sys.exit(f"bench_decode: {why}")
    device = torch.device("cuda")
    kinds = (args.lens.split(",") if args.lens else
             ["8192", "32768"] if args.quick else ["8192", "32768", "mix"])
    batches = ([int(b) for b in args.batches.split(",")] if args.batches else
               [1, 8, 64] if args.quick else [1, 8, 16, 64])
    iters = args.iters or (30 if args.quick else 50)
    replays = 10 if args.quick else 20
    names = [n for n in args.impls.split(",") if n]
    unknown = set(names) - set(IMPLS)
    if unknown:
        sys.exit(f"unknown impl(s) {sorted(unknown)}; known: {IMPLS}")

    env = env_info(device)
    stem = f"decode_{args.tag or ('quick' if args.quick else 'full')}_{timestamp()}"
    os.makedirs(args.out, exist_ok=True)
    writer = JsonlWriter(os.path.join(args.out, stem + ".jsonl"),
                         {k: env[k] for k in ("device", "torch", "git_commit", "cudnn") if k in env})
    bw = copy_bandwidth(device)
    log(f"{env.get('device')}: device copy bandwidth {bw / 1e12:.2f} TB/s (read + write)")
    writer.write({"kind": "copy_bandwidth", "bytes_per_s": bw})

    gen = torch.Generator()
    gen.manual_seed(0)
    l2 = l2_cache_bytes(device)
    rows = []
    for kind in kinds:
        for B in batches:
            lens, cap = lengths(kind, B, gen)
            lmax = max(lens)
            need = kv_bytes(lens)
            n_sets = input_set_count(B, cap, l2)
            label = f"L{kind} B{B}"
            try:
                sets = make_sets(B, cap, lens, n_sets, device, seed=B)
            except torch.cuda.OutOfMemoryError as exc:
                log(f"{label}: cannot allocate inputs ({short_error(exc)})")
                continue
            table = impl_table(lmax, args.split_size)
            ref, row = None, {"config": label}
            for name in names:
                fn, context = table[name]
                rec = {"kind": "decode", "impl": name, "lens": kind, "B": B, "H": H, "Hkv": HKV,
                       "D": D, "dtype": "bf16", "kv_bytes": need, "input_sets": n_sets,
                       "copy_bw": bw}
                if kind == "mix":
                    rec["cache_lens"] = lens
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        with context():
                            out = fn(*sets[0])
                            for other in sets[1:]:  # (every set once: the _bhld copies, before timing)
                                fn(*other)
                            sync(device)
                            if not torch.isfinite(out).all():
                                rec["warning"] = "non-finite output"
                            if ref is None:
                                ref = out
                            elif kind != "mix":
                                rec["max_abs_diff"] = float((out.float() - ref.float()).abs().max())
                            rec["us_eager"] = time_eager(fn, sets, iters, args.warmup)
                            rec["us_graph"] = time_graph(fn, sets, replays)
                    rec["bw_frac"] = need / (rec["us_graph"] * 1e-6) / bw
                    row[name] = rec
                    log(f"{label:14s} {name:15s} eager {rec['us_eager']:9.1f} us  graph "
                        f"{rec['us_graph']:9.1f} us  {100 * rec['bw_frac']:5.1f}% of copy bw")
                except Exception as exc:  # a backend that refuses the shape, OOM, ...
                    rec["error"] = short_error(exc)
                    log(f"{label:14s} {name:15s} error: {rec['error']}")
                    torch.cuda.empty_cache()
                writer.write(rec)
            rows.append(row)
            del sets, ref, table
            torch.cuda.empty_cache()
    writer.close()

    # each fad_det impl's speed over each SDPA backend's at the faster of its two layouts
    dets = [n for n in ("fad_det", "fad_det_ns1", "fad_det_func") if n in names]
    peers = [b for b in ("sdpa_flash", "sdpa_cudnn") if b in names or b + "_bhld" in names]
    headers = ["config"] + [f"{n} us (graph / eager)" for n in names] + \
              [f"{n} % bw" for n in names] + \
              [f"{d} / {b} (speed, faster layout)" for d in dets for b in peers]
    table_rows = []
    for row in rows:
        cells = [row["config"]]
        for n in names:
            r = row.get(n)
            cells.append(f"{r['us_graph']:.1f} / {r['us_eager']:.1f}" if r else "error")
        for n in names:
            r = row.get(n)
            cells.append(f"{100 * r['bw_frac']:.0f}%" if r else "-")
        for d in dets:
            for b in peers:
                ts = [row[n]["us_graph"] for n in (b, b + "_bhld") if row.get(n)]
                det = row.get(d)
                cells.append(f"{min(ts) / det['us_graph']:.2f}" if ts and det else "-")
        table_rows.append(cells)
    md = [f"# Decode, bf16, Hq {H} / Hkv {HKV}, D {D}, one query token",
          "",
          f"{env.get('device')}, torch {env.get('torch')}, cuDNN {env.get('cudnn')}, "
          f"commit {env.get('git_commit')}, split_size {args.split_size or 512}. Device copy "
          f"bandwidth in this run: {bw / 1e12:.2f} TB/s (read + write).",
          "",
          "Per call: graph = device time in a CUDA graph, eager = CUDA events around each Python "
          "call (includes host overhead when it exceeds the kernel). % bw = bytes of K+V the "
          "sequences need / graph time / copy bandwidth. SDPA: enable_gqa=True on transposed "
          "views of the same cache (`_bhld`: on contiguous (B, Hkv, L, D) copies). "
          "fad_det(_ns1) / peer: the peer's graph time at the faster of its two layouts over "
          "the fad impl's (1.00 = parity, above 1: flash_attn_det is faster; _ns1: num_splits=1). "
          "On 'mix' SDPA attends the whole cache up to the longest sequence (no per-sequence "
          "lengths).",
          "",
          markdown_table(headers, table_rows, ["l"] + ["r"] * (len(headers) - 1))]
    text = "\n".join(md) + "\n"
    with open(os.path.join(args.out, stem + ".md"), "w") as f:
        f.write(text)
    print(text)
    log(f"wrote {os.path.join(args.out, stem)}.jsonl / .md")


if __name__ == "__main__":
    main()
