#!/usr/bin/env python3
"""The core's house, drawn from the tree, and the CI check of its arrows.

Each file under `src/` is a room (a module). An arrow runs from a room to
every room whose items it names: `use` lines and qualified paths
(`crate::a::b`, `super::x`, `self::y`, a child module's name), test-only
modules left out. A room encloses its children, so a child naming its
enclosing rooms' items is no arrow; a room naming its children's items
(re-exports among them) is. The check fails on an arrow from a lower floor to a
higher one (the floors below), and on any circle of arrows.

    python3 scripts/module-graph.py            # the check (CI)
    python3 scripts/module-graph.py --rooms    # every room and its arrows
    python3 scripts/module-graph.py --house    # the house by floors (README.md's table)

The check also fails when README.md's table between `<!-- house -->` and
`<!-- /house -->` is not the one `--house` prints.

A test over the `use` lines rather than `cargo-modules`: that tool needs a
nightly-only build of rust-analyzer's crates per toolchain and a network
install on every CI run; this script needs neither and checks the same
relation.
"""

import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
SRC = os.path.join(ROOT, "src")

# Floors, lowest first: a room may name rooms on its own floor or below.
FLOORS = [
    ["error", "dtype", "slots", "handle", "stream", "config"],
    ["placement", "plan"],
    ["backend"],
    ["arena", "storage"],
    ["lib"],
]
FLOOR_OF = {top: i for i, floor in enumerate(FLOORS) for top in floor}


def module_of(path):
    rel = os.path.relpath(path, SRC)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib"):
        rel = rel[:-1]
    return tuple(rel)


def strip_comments_and_tests(text):
    """Drops comments, strings and `#[cfg(test)]` items (their arrows are
    the tests' business)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+\w+\s*(;|\{)", text):
        if m.start() < i:
            continue
        out.append(text[i : m.start()])
        if m.group(1) == ";":
            i = m.end()
            continue
        depth, j = 1, m.end()
        while j < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def test_only_children(text):
    return set(re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?mod\s+(\w+)\s*;", text))


def expand_use(tree):
    """`a::{b, c::{d, e}}` -> ['a::b', 'a::c::d', 'a::c::e']."""
    tree = re.sub(r"\s+", "", tree)
    m = re.match(r"^(.*?)\{(.*)\}$", tree)
    if not m:
        return [tree]
    prefix, inner = m.groups()
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    return [p for part in parts if part for p in expand_use(prefix + part)]


def main():
    rooms, texts, test_only = {}, {}, set()
    for dirpath, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".rs"):
                path = os.path.join(dirpath, f)
                mod = module_of(path)
                raw = open(path, encoding="utf-8").read()
                rooms[mod] = os.path.relpath(path, ROOT)
                texts[mod] = strip_comments_and_tests(raw)
                test_only |= {mod + (c,) for c in test_only_children(raw)}
    # A test-only file's children are test-only too.
    test_only = {m for m in rooms if any(m[: len(t)] == t for t in test_only)}
    modules = set(rooms) - test_only

    def resolve(here, path):
        segs = [s for s in path.split("::") if s]
        if not segs:
            return None
        if segs[0] == "crate":
            base, segs = (), segs[1:]
        elif segs[0] in ("super", "self"):
            base = here
            while segs and segs[0] in ("super", "self"):
                if segs[0] == "super":
                    base = base[:-1]
                segs = segs[1:]
        elif here + (segs[0],) in modules:
            base = here
        else:
            return None  # an external crate or a local item
        target = base
        for s in segs:
            if target + (s,) in modules:
                target = target + (s,)
            else:
                break
        return target

    edges = {}
    for mod in sorted(modules):
        text = texts[mod]
        paths = []
        for m in re.finditer(r"\buse\s+([^;]+);", text):
            paths += expand_use(m.group(1).split(" as ")[0])
        paths += re.findall(r"\b((?:crate|super|self)(?:::\w+)+)", text)
        targets = set()
        for p in paths:
            t = resolve(mod, p.split(" as ")[0])
            # A room encloses its children: a child naming its enclosing
            # room's items (`super::Trait`) is inside that room, not an
            # arrow between two.
            if t is not None and t in modules and mod[: len(t)] != t:
                targets.add(t)
        edges[mod] = targets

    if "--rooms" in sys.argv:
        print_rooms(modules, edges, rooms)
        return 0
    if "--house" in sys.argv:
        print(house(modules, edges))
        return 0

    problems = []
    name = lambda m: "::".join(m) or "crate"
    for a, ts in edges.items():
        for b in ts:
            fa = FLOOR_OF.get(a[0] if a else "lib")
            fb = FLOOR_OF.get(b[0] if b else "lib")
            if fa is None or fb is None:
                problems.append(f"{rooms[a]}: room {name(a)} or {name(b)} is on no floor (add it to FLOORS)")
            elif fb > fa:
                problems.append(f"{rooms[a]}: an upward arrow {name(a)} -> {name(b)}")
    # Circles: strongly connected components of more than one room.
    for comp in sccs(modules, edges):
        if len(comp) > 1:
            cyc = find_cycle(comp, edges)
            problems.append("a circle: " + " -> ".join(rooms[m] for m in cyc))
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    m = re.search(r"<!-- house -->\n(.*?)<!-- /house -->", readme, flags=re.S)
    if not m or m.group(1).strip() != house(modules, edges).strip():
        problems.append(
            "README.md's house (between <!-- house --> and <!-- /house -->) is not the tree's: "
            "paste `python3 scripts/module-graph.py --house`"
        )
    for p in problems:
        print("error:", p, file=sys.stderr)
    if problems:
        return 1
    print(f"{len(modules)} rooms, {sum(len(t) for t in edges.values())} arrows: no upward arrow, no circle")
    return 0


def sccs(nodes, edges):
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(comp)

    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def find_cycle(comp, edges):
    comp = set(comp)
    start = min(comp)
    # Breadth-first back to the start.
    prev, frontier = {start: None}, [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & comp):
                if w == start:
                    path = [v]
                    while prev[path[-1]] is not None:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def house(modules, edges):
    """The floors, top first: each floor's top-level rooms with the rooms
    inside them, and the floors below that its arrows reach."""
    top = lambda m: m[0] if m else "lib"
    lines = ["| floor | rooms (and the rooms inside them) | names items of |", "| ---: | --- | --- |"]
    for i in reversed(range(len(FLOORS))):
        names, reach = [], set()
        for t in FLOORS[i]:
            inner = sorted("/".join(m[1:]) for m in modules if m and m[0] == t and len(m) > 1)
            names.append(f"`{t}`" + (f" ({', '.join(inner)})" if inner else ""))
            for m in modules:
                if top(m) == t:
                    reach |= {top(x) for x in edges[m] if top(x) != t}
        lines.append(f"| {i} | {'; '.join(names)} | {', '.join(sorted(reach)) or '-'} |")
    return "\n".join(lines)


def print_rooms(modules, edges, rooms):
    for floor in reversed(FLOORS):
        for top in floor:
            ms = sorted(m for m in modules if (m[0] if m else "lib") == top)
            for m in ms:
                outs = sorted("::".join(t) or "crate" for t in edges[m])
                print(f"| `{rooms[m]}` | {', '.join(outs)} |")


if __name__ == "__main__":
    sys.exit(main())
