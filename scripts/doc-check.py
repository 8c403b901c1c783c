#!/usr/bin/env python3
"""Docs that cannot go stale: run by `.ci/run`, exits non-zero on a finding.

1. Figures live in BENCHMARKS.md only: a rustdoc comment (`///`, `//!`) in
   a crate's sources that quotes a measured figure (a number with a unit of
   time, bandwidth or speed-up: ns, us, ms, s, GB/s, x) must quote one
   that BENCHMARKS.md holds; better, it links to the heading instead.
   Sizes (KiB, MiB, GiB) are configuration, not measurements, and pass;
   so do code spans and examples. A reference `BENCHMARKS.md#anchor`, in
   any comment, names a heading BENCHMARKS.md has.
2. Relative links resolve: in the Markdown documents a link `[..](path)`,
   `[..](path#heading)`, `[..](#heading)` or a reference definition
   `[..]: path` names a file that exists and a heading that it has
   (GitHub's anchors).
3. Text that becomes rustdoc links no file by a relative path (dead on
   docs.rs, where the page is not beside the file): rustdoc comments, and
   the Markdown files a crate includes as documentation
   (`#![doc = include_str!("../README.md")]`, the guide and the policies as
   modules, a crate README): such a link must be an absolute URL, an
   intra-doc link (`crate::guide`, `Arena::compact`) or a heading of the
   same page (`#heading`). Intra-doc links are rustdoc's to check
   (`-D rustdoc::broken_intra_doc_links`).

Usage: python3 scripts/doc-check.py (from the repository root).
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?(ns|µs|us|ms|GB/s|x)(?![\w/])")
BENCH_ANCHOR = re.compile(r"BENCHMARKS\.md#([\w-]+)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A link reference definition: `[label]: target` at the start of a line.
LINK_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?([^>\s]+)>?")
# A Markdown file a crate's documentation includes.
DOC_INCLUDE = re.compile(r"doc\s*=\s*include_str!\(\s*\"([^\"]+\.md)\"\s*\)")
SOURCES = ["src", "crates/cuarena-trace/src", "crates/cuarena-cli/src", "crates/cuarena-tensor/src"]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(path: pathlib.Path) -> set:
    text = path.read_text(encoding="utf-8")
    out, seen = set(), {}
    in_code = False
    for line in text.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            a = slug(m.group(1))
            n = seen.get(a, 0)
            seen[a] = n + 1
            out.add(a if n == 0 else f"{a}-{n}")
    return out


def check_link(target: str, base: pathlib.Path, where: str, errors: list, rustdoc=False,
               page=None) -> None:
    if re.match(r"^[a-z]+:", target) or target.startswith("<"):
        return  # a URL
    path, _, anchor = target.partition("#")
    if not path and not anchor:
        return
    if not path and page is not None and page.suffix == ".md":
        if anchor not in anchors(page):
            errors.append(f"{where}: link to #{anchor}: no such heading on this page")
        return
    if path and not re.search(r"[./]", path):
        return  # an intra-doc link (`Arena`, `crate::plan`): rustdoc checks those
    if path.startswith(("crate::", "self::", "super::")) or "::" in path:
        return
    if rustdoc and path:
        errors.append(f"{where}: relative link to {target} in rustdoc: dead on docs.rs "
                      "(link a URL or an intra-doc path, or name the file in code quotes)")
        return
    file = (base / path).resolve() if path else None
    if file is not None and not file.exists():
        errors.append(f"{where}: link to {target}: no such file")
        return
    doc = file if file is not None else None
    if anchor and doc is not None and doc.suffix == ".md":
        if anchor not in anchors(doc):
            errors.append(f"{where}: link to {target}: no such heading")


def prose(numbered):
    """(line number, text) of the numbered lines outside fenced code blocks,
    code spans removed (they are neither prose nor links)."""
    in_code = False
    for n, text in numbered:
        if text.lstrip().startswith("```"):
            in_code = not in_code
            continue
        if not in_code:
            yield n, re.sub(r"`[^`]*`", "", text)


def link_targets(text: str) -> list:
    """The targets of a line's inline links and of its reference definition."""
    targets = [m.group(1) for m in LINK.finditer(text)]
    d = LINK_DEF.match(text)
    if d:
        targets.append(d.group(1))
    return targets


def rustdoc_markdown() -> set:
    """The Markdown files that a crate's sources include as documentation."""
    out = set()
    for src in sorted(ROOT.glob("crates/*/src")) + [ROOT / "src"]:
        for path in sorted(src.rglob("*.rs")):
            text = path.read_text(encoding="utf-8")
            for m in DOC_INCLUDE.finditer(text):
                out.add((path.parent / m.group(1)).resolve())
    return out


def main() -> int:
    errors = []
    bench = (ROOT / "BENCHMARKS.md").read_text(encoding="utf-8")
    figures = {m.group(0).replace(" ", "") for m in FIGURE.finditer(bench)}
    bench_anchors = anchors(ROOT / "BENCHMARKS.md")
    for src in SOURCES:
        for path in sorted((ROOT / src).rglob("*.rs")):
            rel = path.relative_to(ROOT)
            lines = path.read_text(encoding="utf-8").splitlines()
            for n, line in enumerate(lines, 1):
                for m in BENCH_ANCHOR.finditer(line):
                    if m.group(1) not in bench_anchors:
                        errors.append(f"{rel}:{n}: BENCHMARKS.md has no heading #{m.group(1)}")
            doc_lines = ((n, d.group(1)) for n, line in enumerate(lines, 1)
                    if (d := re.match(r"\s*//[/!](.*)", line)))
            for n, text in prose(doc_lines):
                for m in FIGURE.finditer(text):
                    if m.group(0).replace(" ", "") not in figures:
                        errors.append(
                            f"{rel}:{n}: figure {m.group(0)!r} is not in BENCHMARKS.md "
                            "(link to its heading instead)"
                        )
                for target in link_targets(text):
                    check_link(target, path.parent, f"{rel}:{n}", errors, rustdoc=True)
    rustdoc_md = rustdoc_markdown()
    docs = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "CHANGELOG.md"]
    docs += sorted((ROOT / "docs").glob("*.md")) + sorted(ROOT.glob("crates/*/README.md"))
    docs += sorted(ROOT.glob("benches/*.md"))
    for path in docs + sorted(rustdoc_md - set(docs)):
        rel = path.relative_to(ROOT)
        rustdoc = path in rustdoc_md
        for n, text in prose(enumerate(path.read_text(encoding="utf-8").splitlines(), 1)):
            for target in link_targets(text):
                check_link(target, path.parent, f"{rel}:{n}", errors, rustdoc=rustdoc, page=path)
    for e in errors:
        print(e)
    print(f"doc-check: {len(errors)} finding(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
