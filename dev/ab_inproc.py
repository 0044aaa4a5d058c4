# ab_inproc.py: Same-process A/B of prebuilt modules on the same tensors, many short alternating turns. Verdict: tool; one build's backward drifts +-4% over tenths of a second, so turns of a whole process (dev/ab_so.sh) mix that drift into the ratios.
"""Backward A/B of several builds of the extension inside one process:

    PYTHONPATH=$PWD python3 dev/ab_inproc.py base new [new2 ...] [--preset dq] [--rounds 8] [--placements 2] [--filter D128]

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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("builds", nargs="+")
    ap.add_argument("--preset", default="dq")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--placements", type=int, default=2)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--filter", default="", help="only configs whose label holds this text")
    args = ap.parse_args()
    fad.set_deterministic_mode(True)
    mods = {b: load_build(b) for b in args.builds}
    impls = {i.name: i for i in common.make_impls(names=["fad_det", "sdpa_cudnn", "sdpa_cudnn_bhld"])}
    base = args.builds[0]
    print(f"| row | {' | '.join(args.builds)} | cuDNN | "
          + " | ".join(f"{b} / {base}" for b in args.builds[1:]) + " | "
          + " | ".join(f"{b} / cuDNN" for b in args.builds) + " | bits = " + base + " |")
    print("|" + "---|" * (3 + 2 * len(args.builds)))
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
                    interface._C = mods[b]
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
        interface._C = fad._C
        tf = {b: flop / (statistics.median(ts) * 1e-3) / 1e12 for b, ts in times.items() if ts}
        cud = max(tf.get("cudnn", 0), tf.get("cudnn_bhld", 0))
        row = f"D{cfg.D} L{cfg.Lq} B{cfg.B} H{cfg.H}/{cfg.Hkv}" + (" causal" if cfg.causal else "")
        print(f"| {row} | " + " | ".join(f"{tf[b]:.0f}" for b in args.builds) + f" | {cud:.0f} | "
              + " | ".join(f"{tf[b] / tf[base]:.3f}" for b in args.builds[1:]) + " | "
              + " | ".join(f"{tf[b] / cud:.3f}" for b in args.builds) + " | "
              + " ".join("yes" if same[b] else "NO" for b in args.builds[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
