# ab_inproc.py: Same-process A/B of prebuilt modules on the same tensors, many short alternating turns. Verdict: tool; one build's backward drifts +-4% over tenths of a second, so turns of a whole process (dev/ab_so.sh) mix that drift into the ratios.
"""Backward (or, with --fwd, forward) A/B of several builds of the extension inside one process:

    PYTHONPATH=$PWD python3 dev/ab_inproc.py base new [new2 ...] [--preset dq] [--rounds 8] [--placements 2] [--filter D128]
    PYTHONPATH=$PWD python3 dev/ab_inproc.py base new --fwd [--preset full] [--filter "bf16&L1024|bf16&L4096"]
    PYTHONPATH=$PWD python3 dev/ab_inproc.py base new --fwd --lens 4032,4096 [--dims 128]
    PYTHONPATH=$PWD python3 dev/ab_inproc.py base new --decode [--lens 8192,32768] [--batches 1,8,16]

--decode: bench_decode.py's calls (GQA 32/8 D128 bf16, one query token over a KV cache): each
build and SDPA cuDNN in both layouts captured once in a CUDA graph of >= 16 calls over the config's
input sets, then `rounds` turns of `iters` replays each; device time per call (us), the ratios as
speed (the peer's time / the build's); the bits column compares outputs on every set.

--fwd: bench_fwd.py's configs (its --filter syntax) and input sets (enough that a pass over them
leaves L2), each build's forward and SDPA cuDNN in both layouts taking turns of `iters` calls
over the sets; the bits column compares each build's output with the first build's on every set.

Each build dev/abi/_C_<name>.abi3.so is loaded as its own module (multi-phase init: its own
state, the same deterministic mode set on each), and flash_attn_det's interface is pointed at
one build at a time. For every config of bench_bwd.py's preset and every placement (fresh
inputs, the old ones kept, so that every build and SDPA cuDNN meet the same new addresses),
the builds and cuDNN (both layouts) take `rounds` turns of `iters` timed backward calls, the
order reversed every other round. Prints, per config, each build's median TFLOP/s, its ratio
to the first build and to cuDNN's faster layout, and whether its gradients equal the first
build's bit for bit.

Why: one build's D128 L8k backward read 459-536 TFLOP/s, and cuDNN's 446-520, in
consecutive 15-call medians on the same tensors (dev/probe_bwd_placement.py grid: no
buffer's placement explains it); dev/ab_so.sh's turns are whole processes, seconds apart, so that
drift lands in its ratios. Here a turn is `iters` calls (tens of ms), and every build
meets every placement and every stretch of the drift alike.
"""
import argparse
import importlib.machinery
import importlib.util
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import flash_attn_det as fad  # noqa: E402
from flash_attn_det import interface, mode as fad_mode  # noqa: E402
import bench_bwd  # noqa: E402
import common  # noqa: E402


def load_build(name):
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "abi", f"_C_{name}.abi3.so")
    # (the last name component must be _C: the loader looks for PyInit__C)
    loader = importlib.machinery.ExtensionFileLoader(f"fad_ab_{name}._C", path)
    spec = importlib.util.spec_from_file_location(f"fad_ab_{name}._C", path, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    mod.set_cpu_threads_source(torch.get_num_threads)
    if interface._EXCHANGE_API is not None:  # (as interface.py sets its own: tensors passed as they are)
        mod.set_dlpack_exchange_api(interface._EXCHANGE_API, torch.Tensor, torch.is_grad_enabled)
    mod.set_mode(*fad_mode.current())
    return mod


def print_header(builds):
    """The table's header; with one build, no build-to-build ratio and no bits column."""
    base = builds[0]
    cells = ["row", *builds, "cuDNN", *(f"{b} / {base}" for b in builds[1:]), *(f"{b} / cuDNN" for b in builds)]
    if len(builds) > 1:
        cells.append("bits = " + base)
    print("| " + " | ".join(cells) + " |")
    print("|" + "---|" * len(cells))


def print_row(label, builds, tf, cud, same, fmt="{:.0f}", speed=lambda x: x):
    """One table row: each build's figure (TFLOP/s; decode: us), cuDNN's, the ratios of speed(figure),
    whether the bits equal the first's."""
    v = {b: speed(tf[b]) for b in builds}
    cells = [label, *(fmt.format(tf[b]) for b in builds), fmt.format(cud),
             *(f"{v[b] / v[builds[0]]:.3f}" for b in builds[1:]), *(f"{v[b] / speed(cud):.3f}" for b in builds)]
    if len(builds) > 1:
        cells.append(" ".join("yes" if same[b] else "NO" for b in builds[1:]))
    print("| " + " | ".join(cells) + " |", flush=True)


def use_build(mod):
    """Points flash_attn_det's interface at one build: its _C, and the inference entries that
    interface.py binds once at import (_infer, ...: the no-grad calls take them, not _C.fwd)."""
    interface._C = mod
    if interface._infer is not None:
        interface._infer, interface._infer_varlen, interface._infer_kvcache = (
            mod.infer, mod.infer_varlen, mod.infer_kvcache)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--preset", default="dq")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--placements", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--filter", default="", help="only configs whose label holds this text")
    ap.add_argument("--fwd", action="store_true", help="the forward, on bench_fwd.py's configs")
    ap.add_argument("--decode", action="store_true", help="decode, on bench_decode.py's calls")
    ap.add_argument("--lens", default="", help="--fwd: these lengths (comma-separated) in place of the "
                    "preset, bf16, causal and not, bench_fwd's batch and heads, at --dims; --decode: "
                    "bench_decode.py's --lens (default 8192,32768,131072)")
    ap.add_argument("--batches", default="1,8,16", help="--decode: batch sizes (comma-separated)")
    ap.add_argument("--dims", default="128", help="--fwd --lens: head dims (comma-separated)")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    mods = {b: load_build(b) for b in args.builds}
    if args.fwd:
        return main_fwd(args, mods)
    if args.decode:
        return main_decode(args, mods)
    impls = {i.name: i for i in common.make_impls(names=["fad_det", "sdpa_cudnn", "sdpa_cudnn_bhld"])}
    base = args.builds[0]
    print_header(args.builds)
    for cfg in [c for c in bench_bwd.preset_configs(args.preset) if args.filter in c.label()]:
        flop = bench_bwd.BWD_FLOP_FACTOR * common.attn_flops(cfg)
        times = {b: [] for b in args.builds + ["cudnn", "cudnn_bhld"]}
        same = {b: True for b in args.builds}
        keep = []
        for place in range(args.placements):
            # (bench_bwd's inputs and dout; the builds share fad_det's call, interface._C swapped under it)
            preps = {name: bench_bwd.prepare_bwd(impls[impl], cfg, torch.device("cuda"), seed=place)[1]
                     for name, impl in (("fad", "fad_det"), ("cudnn", "sdpa_cudnn"), ("cudnn_bhld", "sdpa_cudnn_bhld"))}
            if preps["fad"] is None:
                raise RuntimeError(f"fad_det failed on {cfg.label()}")
            peers = {name: (impls["sdpa_" + name], fn) for name, fn in preps.items() if name != "fad" and fn is not None}
            ref = None
            for r in range(args.rounds):
                order = args.builds + list(peers)
                if r % 2:
                    order = order[::-1]
                for b in order:
                    if b in peers:
                        impl, fn = peers[b]
                        with impl.context():
                            fn()
                            times[b] += common.time_ms(fn, [()], args.iters, 0, torch.device("cuda"))
                        continue
                    use_build(mods[b])
                    with impls["fad_det"].context():
                        grads = preps["fad"]()
                        times[b] += common.time_ms(preps["fad"], [()], args.iters, 0, torch.device("cuda"))
                    if r == 0:
                        if b == base:
                            ref = [t.clone() for t in grads]
                        else:
                            same[b] &= all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                                           for x, y in zip(grads, ref))
            keep.append(preps)
        use_build(fad._C)
        tf = {b: flop / (statistics.median(ts) * 1e-3) / 1e12 for b, ts in times.items() if ts}
        cud = max(tf.get("cudnn", 0), tf.get("cudnn_bhld", 0))
        print_row(f"D{cfg.D} L{cfg.Lq} B{cfg.B} H{cfg.H}/{cfg.Hkv}" + (" causal" if cfg.causal else ""),
                  args.builds, tf, cud, same)


def main_fwd(args, mods):
    """The forward: per config, the builds and cuDNN's two layouts take `rounds` turns (the order
    reversed every other round) of `iters` calls over the config's input sets."""
    import bench_fwd
    dev = torch.device("cuda")
    impls = {i.name: i for i in common.make_impls(names=["fad_det", "sdpa_cudnn", "sdpa_cudnn_bhld"])}
    base = args.builds[0]
    print_header(args.builds)
    configs = bench_fwd.preset_configs(args.preset if args.preset != "dq" else "full")
    if args.lens:
        configs = [bench_fwd._std("bf16", int(d), int(L), causal) for d in args.dims.split(",")
                   for L in args.lens.split(",") for causal in (False, True)]
    for cfg in [c for c in configs if not args.filter or bench_fwd.label_matches(args.filter, c.label())]:
        flop = common.attn_flops(cfg)
        sets = common.make_input_sets(cfg, dev)
        runs = {"cudnn": (impls["sdpa_cudnn"], sets), "cudnn_bhld": (impls["sdpa_cudnn_bhld"],
                                                                  impls["sdpa_cudnn_bhld"].inputs(sets))}
        times = {b: [] for b in list(args.builds) + list(runs)}
        same = {b: True for b in args.builds}
        ref = None
        for r in range(args.rounds):
            order = list(args.builds) + list(runs)
            if r % 2:
                order = order[::-1]
            for b in order:
                impl, arg_sets = runs.get(b, (impls["fad_det"], sets))
                if b in mods:
                    use_build(mods[b])
                fn = lambda q, k, v, impl=impl: impl.call(q, k, v, cfg.causal)  # noqa: E731
                with impl.context():
                    if b in mods and r == 0:
                        outs = [fn(*a) for a in arg_sets]
                        if b == base:
                            ref = outs
                        else:
                            same[b] &= all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                                           for x, y in zip(outs, ref))
                        del outs
                    times[b] += common.time_ms(fn, arg_sets, max(args.iters, len(arg_sets)), 2, dev)
        use_build(fad._C)
        tf = {b: flop / (statistics.median(ts) * 1e-3) / 1e12 for b, ts in times.items()}
        cud = max(tf["cudnn"], tf["cudnn_bhld"])
        print_row(cfg.label(), args.builds, tf, cud, same)


def main_decode(args, mods):
    """Decode: per config, each build's call and SDPA cuDNN's (both layouts) captured once in a
    CUDA graph, then `rounds` turns (the order reversed every other round) of `iters` replays."""
    import bench_decode as bd
    dev = torch.device("cuda")
    base = args.builds[0]
    print_header(args.builds)
    gen = torch.Generator()
    gen.manual_seed(0)
    l2 = common.l2_cache_bytes(dev)
    for kind in (args.lens or "8192,32768,131072").split(","):
        for B in [int(x) for x in args.batches.split(",")]:
            lens, cap = bd.lengths(kind, B, gen)
            sets = bd.make_sets(B, cap, lens, bd.input_set_count(B, cap, l2), dev, seed=B)
            table = bd.impl_table(max(lens))
            graphs, same, ref = {}, {b: True for b in args.builds}, None
            for name in list(args.builds) + ["sdpa_cudnn", "sdpa_cudnn_bhld"]:
                fn, context = table["fad_det" if name in mods else name]
                if name in mods:
                    use_build(mods[name])
                with context():
                    outs = [fn(*s) for s in sets]  # (every set once: the _bhld copies, before capture)
                    if name == base:
                        ref = outs
                    elif name in mods:
                        same[name] = all(torch.equal(x.view(torch.int16), y.view(torch.int16))
                                         for x, y in zip(outs, ref))
                    graphs[name] = bd.capture_graph(fn, sets)
            use_build(fad._C)
            times = {name: [] for name in graphs}
            for r in range(args.rounds):
                order = list(graphs)[::-1] if r % 2 else list(graphs)
                for name in order:
                    times[name] += bd.replay_times(*graphs[name], max(args.iters, 1))
            us = {name: statistics.median(ts) for name, ts in times.items()}
            print_row(f"decode L{kind} B{B}", args.builds, us, min(us["sdpa_cudnn"], us["sdpa_cudnn_bhld"]),
                      same, fmt="{:.1f}", speed=lambda t: 1.0 / t)
            del graphs, sets


if __name__ == "__main__":
    main()
