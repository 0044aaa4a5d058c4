#!/usr/bin/env python3
"""Keep benchmarks/results/ to the runs the docs cite, and index them.

    python3 dev/results_index.py          # list uncited files, rewrite benchmarks/results/README.md
    python3 dev/results_index.py --prune  # also delete the uncited files (git rm them after)

A citation is any `results/NAME` in README.md, benchmarks/*.md, docs/**/*.md or the sources,
with shell braces ({a,b}, {1..4}) and globs (*) expanded. The index gives, per file, what it
is (from its name: the run's kind), the commit (a 7-hex name part, or the jsonl's git_commit),
the GPU and the command that makes such a file.
"""
import glob
import itertools
import json
import os
import re
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "benchmarks", "results")
CITING = ["README.md", "benchmarks/*.md", "docs/**/*.md", "csrc/**/*.[ch]*", "flash_attn_det/*.py",
          "tests/*.py", "dev/*", "examples/*"]

# kind (a name part) -> (what, command)
KINDS = [
    ("pytest", "full test suite", "python3 -m pytest -q tests"),
    ("verify", "the verify job (seed report's checks)", "python3 -m flash_attn_det.verify --json F"),
    ("fwd_quick", "forward benchmark, quick preset", "python3 benchmarks/bench_fwd.py --preset quick"),
    ("fwd_full", "forward benchmark, full preset", "python3 benchmarks/bench_fwd.py --preset full"),
    ("bwd_quick", "backward benchmark, quick preset", "python3 benchmarks/bench_bwd.py --preset quick"),
    ("decode_quick", "decode benchmark", "python3 benchmarks/bench_decode.py --quick"),
    ("overhead", "host time of one call", "python3 benchmarks/bench_overhead.py"),
    ("train_check", "training bit-identity check", "python3 examples/train_check.py --steps 300"),
    ("timeline", "kernel timeline of decode calls", "python3 dev/probe_timeline.py"),
    ("ncu", "Nsight Compute profile", "ncu ... python3 dev/ncu_fwd.py (dev/device_all.sh ncu)"),
    ("wgmma_probe", "wgmma vs mma.sync rounding probe", "tests/wgmma_probe.cu (tests/test_wgmma_rounding.py)"),
    ("probe_kernels", "per-kernel times", "python3 dev/probe_kernels.py"),
    ("build", "build log", "python3 setup.py build_ext --inplace"),
    ("ab_fwd_dropout", "same-run A/B of build variants, dropout's forward",
     "BENCH=dropout DROPOUT_ARGS=--fwd-only BUILDS=... dev/ab_so.sh (see the notebook)"),
    ("ab_", "same-run A/B of build variants", "dev/ab_variants.sh or dev/ab_decode.sh (see the notebook)"),
    ("fa_compat", "flash_attn's test file through the shim", "tests/fa_compat/run.sh (FA_SEED in the notebook)"),
    ("quick", "quick forward table, wgmma on/off", "python3 dev/quick_perf.py"),
]


def expand(pattern):
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    body = m.group(1)
    r = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    alts = [str(i) for i in range(int(r.group(1)), int(r.group(2)) + 1)] if r else body.split(",")
    return list(itertools.chain.from_iterable(
        expand(pattern[:m.start()] + a + pattern[m.end():]) for a in alts))


def cited():
    names = set()
    for pat in CITING:
        for path in glob.glob(os.path.join(REPO, pat), recursive=True):
            if os.path.isfile(path) and not path.startswith(RESULTS):
                text = open(path, errors="replace").read()
                for m in re.finditer(r"results/([A-Za-z0-9_.*{},-]+(?:\{[^}]*\}[A-Za-z0-9_.*-]*)*)", text):
                    for pattern in expand(m.group(1).rstrip(".,")):
                        names.update(os.path.basename(p) for p in glob.glob(os.path.join(RESULTS, pattern)))
    return names


def describe(name):
    gpu = "H200" if "h200" in name else "H100" if "h100" in name else "?"
    what, cmd = "", ""
    for key, w, c in KINDS:
        if key in name:
            what, cmd = w, c
            break
    commit = ""
    m = re.search(r"_([0-9a-f]{7})(?:_|\.|$)", name)
    if m:
        commit = m.group(1)
    elif name.endswith(".jsonl"):
        try:
            commit = json.loads(open(os.path.join(RESULTS, name)).readline()).get("git_commit", "")[:7]
        except (ValueError, OSError):
            pass
    return what or "run output", commit or "(see the notebook entry)", gpu, cmd or "(see the notebook entry)"


def main():
    keep = cited()
    files = sorted(f for f in os.listdir(RESULTS) if f != "README.md")
    drop = [f for f in files if f not in keep]
    for f in drop:
        print("uncited:", f)
        if "--prune" in sys.argv:
            os.remove(os.path.join(RESULTS, f))
    rows = [f for f in files if f in keep]
    with open(os.path.join(RESULTS, "README.md"), "w") as out:
        out.write("# benchmarks/results\n\nRuns that README.md, benchmarks/METHOD.md, docs/ or the "
                  "notebook (docs/log/) cite, and nothing else (`python3 dev/results_index.py` rewrites "
                  "this index and lists uncited files; the harnesses write to the ignored "
                  "benchmarks/out/). Dated runs are the day's; the commit is the build measured.\n\n"
                  "| file | what | commit | GPU | command |\n|---|---|---|---|---|\n")
        for f in rows:
            what, commit, gpu, cmd = describe(f)
            out.write(f"| {f} | {what} | {commit} | {gpu} | `{cmd}` |\n")
    print(f"{len(rows)} cited, {len(drop)} uncited{' (deleted)' if '--prune' in sys.argv else ''}")


if __name__ == "__main__":
    main()
