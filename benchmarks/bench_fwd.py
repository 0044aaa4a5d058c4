"""Forward benchmark: flash_attn_det (deterministic and fast mode) beside torch SDPA.

Exact commands (from the repository root, after
`FLASH_ATTN_DET_CUDA_ARCHS=90 python3 setup.py build_ext --inplace`):

    python3 benchmarks/bench_fwd.py --preset quick   # bf16, D64/128, L 1k/4k/16k (~1-3 min)
    python3 benchmarks/bench_fwd.py --preset full    # the whole matrix, 96 configs
    python3 benchmarks/bench_fwd.py --preset verify  # flash_attn_det.verify's two configs, fp16

Writes under benchmarks/out/ (--out; ignored by git): <tag>.jsonl (one record per (impl, config)),
<tag>.md (tables) and <tag>.png (TFLOP/s vs seqlen; skipped without matplotlib);
tag = fwd_<preset>_<timestamp> unless --tag. `--from-jsonl FILE` redraws the table
and plot of an earlier run without measuring. `--cpu-smoke` runs a tiny matrix on
the CPU to exercise the harness on a machine without a GPU (timings meaningless).

Protocol (benchmarks/METHOD.md): fresh torch.randn inputs, the same for
every impl of a config; rotation among several input sets when one set fits in L2;
per impl, warm-up, then --iters calls timed one by one with CUDA events, and the
impls of a config take --rounds such turns one after the other; the median of
all of an impl's calls is reported (min, p20, p80 also in the JSONL).
TFLOP/s = 4*B*H*Lq*Lk*D / t, halved for causal (Lq == Lk). Peak extra memory:
max_memory_allocated during one call minus memory allocated before it (inputs)
minus the output. SDPA's flash and cuDNN backends are measured on (B, H, L, D)
transposed views of the same tensors (sdpa_flash, sdpa_cudnn: what models pass) and on
contiguous (B, H, L, D) copies made before timing (..._bhld); det/flash and det/cuDNN
are against the faster of the two. enable_gqa=True for GQA. An (impl, config) that
errors is recorded with its error and skipped.

Impls: fad_det, fad_fast (flash_attn_det in deterministic / fast mode),
sdpa_flash, sdpa_flash_bhld, sdpa_cudnn, sdpa_cudnn_bhld, sdpa_efficient (torch SDPA
backends), flash_attn (FA2) and flash_attn3 (flash_attn_interface) when importable.
"""
import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import Config, log  # noqa: E402

SEQLENS = [512, 1024, 2048, 4096, 8192, 16384]
TOKENS = 32768      # batch = TOKENS // seqlen
HIDDEN = 2048       # heads = HIDDEN // head dim


def _std(dtype, D, L, causal, H=None, Hkv=None):
    H = H or HIDDEN // D
    return Config(dtype, max(1, TOKENS // L), L, L, H, Hkv or H, D, causal)


def preset_configs(name):
    if name == "full":
        out = []
        for dtype in ("bf16", "fp16"):
            for D, H, Hkv in ((64, None, None), (128, None, None), (256, None, None),
                              (128, 32, 8)):
                for L in SEQLENS:
                    for causal in (False, True):
                        out.append(_std(dtype, D, L, causal, H, Hkv))
        return out
    if name == "quick":
        return [_std("bf16", D, L, causal) for D in (64, 128) for L in (1024, 4096, 16384)
                for causal in (False, True)]
    if name == "verify":  # flash_attn_det.verify's memory config and performance config
        return [Config("fp16", 4, 2048, 2048, 32, 32, 64, False),
                Config("fp16", 8, 4096, 4096, 32, 32, 64, False)]
    if name == "cpu-smoke":
        return [Config("fp16", 2, 128, 128, 2, 2, 64, False),
                Config("fp16", 2, 128, 128, 2, 2, 64, True),
                Config("fp16", 1, 256, 256, 2, 2, 64, False),
                Config("bf16", 2, 128, 128, 4, 2, 64, True),
                Config("fp16", 1, 128, 128, 2, 2, 128, False)]
    raise ValueError(name)


# --------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------

def _group_key(rec):
    """Panel of the plot: head dim, with GQA set apart."""
    gqa = f" GQA{rec['H']}/{rec['Hkv']}" if rec["Hkv"] != rec["H"] else ""
    return f"D{rec['D']}{gqa}"


def _config_key(rec):
    return (rec["dtype"], rec["D"], rec["H"], rec["Hkv"], rec["L"], rec["Lk"], rec["B"],
            rec["causal"])


def _by_config(records):
    table = collections.OrderedDict()
    for r in records:
        table.setdefault(_config_key(r), {})[r["impl"]] = r
    return table


def _impls_present(records):
    names = {r["impl"] for r in records}
    return [n for n in common.IMPL_ORDER if n in names] + sorted(names - set(common.IMPL_ORDER))


def markdown_report(records, env, title):
    impls = _impls_present(records)
    by_cfg = _by_config(records)

    def ok(r):
        return r is not None and "error" not in r and r.get("tflops")

    rows, mem_rows = [], []
    errors = collections.OrderedDict()  # (impl, error) -> config labels
    for key, per in by_cfg.items():
        dtype, D, H, Hkv, L, Lk, B, causal = key
        lbl = f"{dtype} D{D} L{L}" + (f"/{Lk}" if Lk != L else "") + (" causal" if causal else "")
        heads = f"{H}" if H == Hkv else f"{H}/{Hkv}"
        tf = [per[i]["tflops"] if ok(per.get(i)) else None for i in impls]
        det, fast = per.get("fad_det"), per.get("fad_fast")
        flash, cudnn = common.best_of(per, "sdpa_flash"), common.best_of(per, "sdpa_cudnn")
        ratio = lambda a, b: (common.fmt_num(a["tflops"] / b["tflops"])  # noqa: E731
                              if ok(a) and ok(b) else None)
        slow = f"{(det['ms'] / fast['ms'] - 1) * 100:+.1f}%" if ok(det) and ok(fast) else None
        rows.append([lbl, B, heads] + tf + [ratio(det, flash), ratio(det, cudnn), slow])
        mem_rows.append([lbl, B, heads] + [per[i].get("peak_extra_mb") if ok(per.get(i))
                                           else None for i in impls])
        for i in impls:
            if per.get(i) and "error" in per[i]:
                errors.setdefault((i, per[i]["error"]), []).append(f"{lbl} B{B} H{heads}")

    lines = [f"# {title}", "",
             f"{env.get('device')} | torch {env.get('torch')} | flash_attn_det "
             f"{env.get('flash_attn_det')} | commit {env.get('git_commit')} | "
             f"{env.get('date', '')}", "",
             "TFLOP/s = 4*B*H*Lq*Lk*D / median time (halved for causal); CUDA-event timings "
             "(perf_counter on CPU), the impls of a config taking turns "
             f"({records[0].get('rounds', 1) if records else 1} rounds). "
             "det/flash, det/cuDNN: fad_det TFLOP/s / SDPA-flash (cuDNN) TFLOP/s, the faster of its "
             "two layouts (transposed views, contiguous (B, H, L, D)) "
             "(1.00 = parity, 0.50 = 2x slower). det vs fast: fad_det time / fad_fast time - 1.",
             "",
             common.markdown_table(["config", "B", "H"] + impls +
                                   ["det/flash", "det/cuDNN", "det vs fast"], rows),
             "", "Peak extra memory (MB) beyond inputs and output, one call:", "",
             common.markdown_table(["config", "B", "H"] + impls, mem_rows)]
    if errors:
        lines += ["", "Errors (impl skipped for that config):", ""]
        for (impl, err), cfgs in errors.items():
            where = ", ".join(cfgs) if len(cfgs) <= 4 else \
                f"{len(cfgs)} configs ({', '.join(cfgs[:3])}, ...)"
            lines.append(f"- `{impl}` on {where}: {err}")
    return "\n".join(lines) + "\n"


def plot(records, path, title):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib is not installed: skipping the plot (pip install matplotlib)")
        return False
    good = [r for r in records if "error" not in r and r.get("tflops")]
    if not good:
        log("no successful measurement: no plot")
        return False
    impls = _impls_present(good)
    groups = sorted({_group_key(r) for r in good},
                    key=lambda g: (int(g.split()[0][1:]), g))
    variants = sorted({(r["dtype"], r["causal"]) for r in good})
    colors = {name: f"C{i}" for i, name in enumerate(impls)}  # one colour per impl everywhere
    xs = sorted({r["L"] for r in good})
    fig, axes = plt.subplots(len(variants), len(groups), squeeze=False, sharex=True,
                             figsize=(4.2 * len(groups), 3.2 * len(variants)))
    for row, (dtype, causal) in enumerate(variants):
        for col, group in enumerate(groups):
            ax = axes[row][col]
            for impl in impls:
                pts = sorted((r["L"], r["tflops"]) for r in good if r["impl"] == impl
                             and r["dtype"] == dtype and r["causal"] == causal
                             and _group_key(r) == group)
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                            label=impl, color=colors[impl],
                            linestyle="--" if impl.startswith("sdpa") else "-")
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x)
                                for x in xs], fontsize=8)
            ax.minorticks_off()
            ax.set_title(f"{dtype} {group} {'causal' if causal else 'non-causal'}", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.set_ylim(bottom=0)
            if col == 0:
                ax.set_ylabel("TFLOP/s")
            if row == len(variants) - 1:
                ax.set_xlabel("seqlen")
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    inch = 1 / fig.get_figheight()  # figure fraction of one inch: title, legend, then panels
    fig.suptitle(title, fontsize=10, y=1 - 0.08 * inch, va="top")
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.3 * inch),
               ncol=len(labels), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 * inch))
    tmp = path + ".tmp"
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return True


def write_reports(records, env, base, title, do_plot=True):
    md = base + ".md"
    with open(md, "w") as f:
        f.write(markdown_report(records, env, title))
    log(f"wrote {md}")
    if do_plot and plot(records, base + ".png", title):
        log(f"wrote {base}.png")


# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------

def parse_args(argv=None):
    ap = argparse.ArgumentParser(
        description="Forward benchmark of flash_attn_det (deterministic and fast mode) beside "
                    "torch SDPA flash/cuDNN/efficient (and flash_attn when importable). "
                    "Writes JSONL, a Markdown table and a PNG plot.")
    ap.add_argument("--preset", choices=["quick", "full", "verify"], default="quick",
                    help="config matrix (default quick)")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "out"),
                    help="output folder (default benchmarks/out, ignored by git; copy a run that "
                         "the docs cite to benchmarks/results/ and index it there)")
    ap.add_argument("--tag", help="output file name without extension "
                                  "(default fwd_<preset>_<timestamp>)")
    ap.add_argument("--iters", type=int, default=10,
                    help="timed calls per impl and round (default 10)")
    ap.add_argument("--warmup", type=int, default=5,
                    help="warm-up calls per impl and round (default 5)")
    ap.add_argument("--rounds", type=int, default=5,
                    help="turns the impls of a config take, one after the other; the median "
                         "is over all rounds' calls (default 5)")
    ap.add_argument("--impls", help="comma-separated subset of: " + ",".join(common.IMPL_ORDER))
    ap.add_argument("--filter", help="only configs whose label contains this text, "
                                     "e.g. 'D128' or 'L4096 B8'; '&' joins texts that must "
                                     "all appear, '|' joins alternatives: 'bf16&D256|bf16&GQA'")
    ap.add_argument("--split-size", type=int, help="flash_attn_det split_size for both modes "
                                                   "(default: the library's, 512)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the inputs")
    ap.add_argument("--no-plot", action="store_true", help="skip the PNG")
    ap.add_argument("--from-jsonl", metavar="FILE",
                    help="no measuring: rewrite the table and plot from FILE")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny matrix on the CPU to test the harness without a GPU "
                         "(timings meaningless)")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or args.rounds < 1:
        ap.error("--iters and --rounds must be >= 1 and --warmup >= 0")
    return args


def label_matches(spec, label):
    """--filter: any '|' alternative whose '&'-joined texts all appear in the label."""
    return any(all(t in label for t in alt.split("&")) for alt in spec.split("|"))


def main(argv=None):
    args = parse_args(argv)
    if args.from_jsonl:
        records = common.read_jsonl(args.from_jsonl)
        if not records:
            log(f"{args.from_jsonl}: no records")
            return 1
        base = os.path.splitext(args.from_jsonl)[0]
        env = {k: records[0].get(k) for k in ("device", "torch", "flash_attn_det",
                                              "git_commit", "date")}
        write_reports(records, env, base, f"forward: {os.path.basename(base)}",
                      not args.no_plot)
        return 0

    ok, reason = common.gpu_usable()
    if args.cpu_smoke:
        device, preset = torch.device("cpu"), "cpu-smoke"
        log("--cpu-smoke: tiny matrix on the CPU path; the timings say nothing about the GPU")
    elif not ok:
        log(f"bench_fwd: cannot benchmark: {reason}.\n"
            "bench_fwd measures the CUDA kernels and needs an NVIDIA GPU. On this machine, "
            "`python3 -m flash_attn_det.verify` runs the CPU checks, and "
            "`python3 benchmarks/bench_fwd.py --cpu-smoke` exercises the harness.")
        return 2
    else:
        device, preset = torch.device("cuda", torch.cuda.current_device()), args.preset

    configs = preset_configs(preset)
    if args.filter:
        configs = [c for c in configs if label_matches(args.filter, c.label())]
        if not configs:
            log(f"--filter {args.filter!r} matches no config of preset {preset}")
            return 2
    names = [n.strip() for n in args.impls.split(",") if n.strip()] if args.impls else None
    try:
        impls = common.make_impls(args.split_size, names)
    except ValueError as exc:
        log(str(exc))
        return 2

    env = common.env_info(device)
    env["date"] = common.timestamp()
    tag = args.tag or f"fwd_{preset}_{env['date']}"
    base = os.path.join(args.out, tag)
    meta = {"device": env["device"], "torch": env["torch"],
            "flash_attn_det": env["flash_attn_det"], "git_commit": env["git_commit"],
            "date": env["date"], "preset": preset, "split_size": args.split_size or 512,
            "iters_per_round": args.iters, "warmup_per_round": args.warmup}
    writer = common.JsonlWriter(base + ".jsonl", meta)
    log(f"bench_fwd: {len(configs)} configs x {len(impls)} impls "
        f"({', '.join(i.name for i in impls)}) on {env['device']}, torch {env['torch']}, "
        f"commit {env['git_commit']}; {args.rounds} rounds of {args.warmup} warm-up and "
        f"{args.iters} timed calls per impl")
    log(f"writing {base}.jsonl")

    records, logged = [], set()
    with torch.no_grad():
        for n, cfg in enumerate(configs, 1):
            log(f"[{n}/{len(configs)}] {cfg.label()} ...")
            try:
                sets = common.make_input_sets(cfg, device, seed=args.seed + n)
            except Exception as exc:  # e.g. out of memory
                for impl in impls:
                    rec = dict(impl=impl.name, **cfg.fields(),
                               error="inputs: " + common.short_error(exc))
                    writer.write(rec)
                    records.append({**rec, **meta})
                log(f"    inputs failed: {common.short_error(exc)}")
                continue
            parts = []
            recs = common.measure_rounds(impls, cfg, sets, device, args.iters, args.warmup,
                                         args.rounds)
            for impl, rec in zip(impls, recs):
                writer.write(rec)
                rec.pop("_times", None)
                records.append({**rec, **meta})
                parts.append(f"{impl.name} {common.fmt_num(rec['tflops'])}" if "tflops" in rec
                             else f"{impl.name} ERR")
                if "error" in rec and (impl.name, rec["error"]) not in logged:
                    logged.add((impl.name, rec["error"]))
                    log(f"    {impl.name}: {rec['error'][:200]} (not repeated below)")
            log("    TFLOP/s: " + " | ".join(parts) + (f"  ({len(sets)} input sets)"
                                                       if len(sets) > 1 else ""))
            del sets, recs
            if device.type == "cuda":
                torch.cuda.empty_cache()
    writer.close()
    write_reports(records, meta, base, f"forward, preset {preset}: {tag}", not args.no_plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
