#!/usr/bin/env python3
"""Counts the core crate's public API from rustdoc's JSON output.

Build the JSON first (CUDA and NCCL on, so that every public item is there):

    RUSTC_BOOTSTRAP=1 cargo rustdoc -p cuarena --lib --features cuda,nccl \
        -- -Z unstable-options --output-format json

then run `python3 scripts/api-count.py [target/doc/cuarena.json]`.

Two numbers, each with a limit:
- public items: every item reachable from the crate root through public
  modules and re-exports, counted once (modules themselves are not counted;
  a re-exported external crate or item counts as one item);
- `Arena`'s public inherent methods, across all its `impl` blocks (a method
  defined in two blocks, say one per backend, counts twice).

It also lists the items reachable under more than one public path: each item
must have one. Exits non-zero when a limit is passed or a path is doubled.
"""

import json
import sys
from collections import defaultdict

MAX_ITEMS = 60
MAX_ARENA_METHODS = 35


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "target/doc/cuarena.json"
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    index = doc["index"]

    def item(i):
        return index.get(str(i))

    def kind(it):
        return next(iter(it["inner"]))

    # Public path(s) of every item reachable from the root.
    paths = defaultdict(list)
    seen_modules = set()

    def walk(module_id, prefix):
        if module_id in seen_modules:
            return
        seen_modules.add(module_id)
        module = item(module_id)
        for child_id in module["inner"]["module"]["items"]:
            child = item(child_id)
            if child is None or child["visibility"] != "public":
                continue
            k = kind(child)
            if k == "use":
                use = child["inner"]["use"]
                target = item(use["id"]) if use["id"] is not None else None
                if use["is_glob"]:
                    if target is not None and kind(target) == "module":
                        walk(use["id"], prefix)
                    continue
                name = f"{prefix}::{use['name']}"
                if target is None:
                    # An external crate or item: the re-export is the item.
                    paths[("extern", use["source"])].append(name)
                elif kind(target) == "module":
                    walk(use["id"], name)
                else:
                    paths[use["id"]].append(name)
            elif k == "module":
                walk(child_id, f"{prefix}::{child['name']}")
            elif k == "impl":
                continue
            else:
                paths[child_id].append(f"{prefix}::{child['name']}")

    walk(doc["root"], "cuarena")

    items = sorted(min(p) for p in paths.values())
    doubled = {min(p): sorted(p) for p in paths.values() if len(p) > 1}

    # Arena's public inherent methods.
    arena = next(
        (
            it
            for it in index.values()
            if it["crate_id"] == 0 and it["name"] == "Arena" and kind(it) == "struct"
        ),
        None,
    )
    if arena is None:
        print("error: no `Arena` struct in the JSON", file=sys.stderr)
        return 2
    methods = []
    for impl_id in arena["inner"]["struct"]["impls"]:
        impl = item(impl_id)["inner"]["impl"]
        if impl["trait"] is not None:
            continue
        for m in impl["items"]:
            mi = item(m)
            if mi is not None and mi["visibility"] == "public" and kind(mi) == "function":
                methods.append(mi["name"])

    for p in items:
        print(f"  {p}")
    print(f"public items: {len(items)} (limit {MAX_ITEMS})")
    print(f"Arena public methods: {len(methods)} (limit {MAX_ARENA_METHODS})")
    print("  " + ", ".join(sorted(methods)))
    failed = False
    if doubled:
        failed = True
        print("error: items with more than one public path:", file=sys.stderr)
        for paths_of in doubled.values():
            print("  " + " = ".join(paths_of), file=sys.stderr)
    if len(items) > MAX_ITEMS:
        failed = True
        print(f"error: {len(items)} public items (at most {MAX_ITEMS})", file=sys.stderr)
    if len(methods) > MAX_ARENA_METHODS:
        failed = True
        print(
            f"error: {len(methods)} public methods on Arena (at most {MAX_ARENA_METHODS})",
            file=sys.stderr,
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
