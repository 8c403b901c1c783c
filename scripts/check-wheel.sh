#!/usr/bin/env bash
# Builds the `cuarena` wheel (maturin, `bin` bindings, linked by zig against
# glibc 2.17: a manylinux2014 wheel), installs it into a fresh virtual
# environment and checks that the command installed there gives the same
# answer as the one cargo builds, on shipped snapshots.
#
#   bash scripts/check-wheel.sh            # needs python3 with venv, and cargo
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/build"
"$work/build/bin/pip" install --quiet "maturin[zig]>=1.5,<2"
# maturin finds zig through the environment's python (`python -m ziglang`).
PATH="$work/build/bin:$PATH" maturin build --release --zig --quiet --out "$work/wheels"
wheel=$(ls "$work"/wheels/cuarena-*.whl)
echo "built $(basename "$wheel")"
case "$(basename "$wheel")" in
*manylinux_2_17_*) ;;
*)
    echo "error: the wheel is not tagged manylinux_2_17 (glibc 2.17)" >&2
    exit 1
    ;;
esac

python3 -m venv "$work/user"
"$work/user/bin/pip" install --quiet "$wheel"
installed="$work/user/bin/cuarena"
cargo build --release --quiet -p cuarena-cli
built="${CARGO_TARGET_DIR:-target}/release/cuarena"

"$installed" --version
data=crates/cuarena-trace/tests/data
for trace in "$data/mlp_small_with_stacks.pickle" "$data/gpt2_varlen_h100.pickle.gz"; do
    a=$("$installed" replay "$trace" --json)
    b=$("$built" replay "$trace" --json)
    if [ "$a" != "$b" ]; then
        printf 'wheel and cargo builds disagree on %s:\n%s\n%s\n' "$trace" "$a" "$b" >&2
        exit 1
    fi
    # The verdict lines (the first four) are the same too.
    diff <("$installed" replay "$trace" | head -4) <("$built" replay "$trace" | head -4)
    "$installed" replay "$trace" | head -4
done
echo "wheel OK: the installed command gives the cargo build's answers"
