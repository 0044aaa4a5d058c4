"""The documentation stays true: the README's and docs/'s Python blocks run (on the CPU in CI),
every relative link in the tree's Markdown resolves, and every file kept in benchmarks/results/
is cited by the README or docs/.

A ```python block runs unless the HTML comment on the line before it says otherwise:
    <!-- test: skip -->   a signature listing or a fragment that needs context (never run)
    <!-- test: gpu -->    needs the CUDA kernels (runs where flash_attn_det.has_cuda() and a
                          GPU is visible; skipped elsewhere)
    <!-- test: run -->    runs everywhere (the default, written out where it helps the reader)
The blocks of one file run in order in one namespace, as a reader would paste them."""
import os
import re

import pytest
import torch

import flash_attn_det

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC_FILES = ["README.md"] + sorted(
    os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs")) if f.endswith(".md"))
MARKER = re.compile(r"^<!--\s*test:\s*(skip|gpu|run)\s*-->\s*$")
FENCE = re.compile(r"^```(\w*)\s*$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
GPU = flash_attn_det.has_cuda() and torch.cuda.is_available()


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def code_blocks(text):
    """(language, marker or None, first line number, code) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        prev = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        mark = MARKER.match(prev.strip())
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        blocks.append((m.group(1), mark.group(1) if mark else None, i + 2,
                       "\n".join(lines[i + 1:j])))
        i = j + 1
    return blocks


def markdown_files():
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if not d.startswith(".") and d not in
                       ("build", "dist", "node_modules", "__pycache__") and
                       not d.endswith(".egg-info")]
        out += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in filenames
                if f.endswith(".md")]
    return sorted(out)


def _slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(text):
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


@pytest.mark.parametrize("rel", DOC_FILES)
def test_python_blocks_run(rel, monkeypatch):
    blocks = [b for b in code_blocks(_read(rel)) if b[0] == "python"]
    if not blocks:
        pytest.skip(f"{rel} has no python block")
    monkeypatch.chdir(ROOT)
    namespace = {"__name__": f"doc:{rel}"}
    ran = 0
    for _, mark, line, code in blocks:
        if mark == "skip" or (mark == "gpu" and not GPU):
            continue
        try:
            exec(compile(code, f"{rel}:{line}", "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"{rel}, the python block at line {line}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        ran += 1
    if not ran:
        pytest.skip(f"every python block of {rel} needs a GPU or is a listing")


def test_readme_quickstart_runs_on_the_cpu():
    # the first python block of the README is the quickstart: it must not need a GPU
    blocks = [b for b in code_blocks(_read("README.md")) if b[0] == "python"]
    assert blocks, "the README has no python block"
    assert blocks[0][1] in (None, "run"), "the README's quickstart is marked skip or gpu"


def test_readme_install_blocks_are_what_ci_runs():
    # .ci/run reads the first line of the fenced block after each tag
    text = _read("README.md").splitlines()
    for tag in ("<!-- ci:install -->", "<!-- ci:test -->"):
        assert tag in text, f"README.md lacks {tag}"
        i = text.index(tag)
        assert text[i + 1] == "```bash" and text[i + 2].strip(), f"{tag}: no bash block after it"


def test_readme_under_2000_words():
    assert len(_read("README.md").split()) < 2000


@pytest.mark.parametrize("rel", markdown_files())
def test_relative_links_resolve(rel):
    text = _read(rel)
    base = os.path.dirname(os.path.join(ROOT, rel))
    bad = []
    for m in LINK.finditer(text):
        target = m.group(1) or m.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, rel)
        if not os.path.exists(full):
            bad.append(f"{target} (no such file)")
        elif anchor and full.endswith(".md"):
            with open(full, encoding="utf-8") as f:
                if anchor not in _anchors(f.read()):
                    bad.append(f"{target} (no such heading)")
    assert not bad, f"{rel}: " + ", ".join(bad)


def test_every_result_file_is_cited():
    results = os.path.join(ROOT, "benchmarks", "results")
    cited = "\n".join(_read(rel) for rel in DOC_FILES)
    uncited = [f for f in sorted(os.listdir(results))
               if f != "README.md" and f"results/{f}" not in cited]
    assert not uncited, f"benchmarks/results/ files that no doc cites: {uncited}"
    index = _read(os.path.join("benchmarks", "results", "README.md"))
    unlisted = [f for f in sorted(os.listdir(results))
                if f != "README.md" and f"({f})" not in index]
    assert not unlisted, f"benchmarks/results/README.md does not list: {unlisted}"
