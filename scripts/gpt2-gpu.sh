#!/usr/bin/env bash
# GPT-2 on the arena beside PyTorch, on one GPU: PyTorch writes the initial
# weights and the batches, both train on them in fp32 and in bf16, and the
# losses are compared; the Rust loop also runs on plain cudarc allocations
# (its speed baseline) and checks its first gradients against PyTorch's.
#
#   cargo build --release -p cuarena-gpt2
#   scripts/gpt2-gpu.sh target/release/gpt2 gpt2-out [STEPS]
#
# REPEAT (default 3) alternating runs of the arena and of plain allocations
# give the speed ratio (medians). FIND_CAP=1 also searches PyTorch's smallest
# memory cap (default allocator and expandable segments) on the same batches;
# TRAIN=0 skips the training runs (with FIND_CAP=1: the caps only);
# ELASTIC=1 adds an elastic arena run (no capacity given) after each fixed
# arena run (`--elastic`): tokens/s against the fixed arena's, peak mapped
# against peak live (the Rust loop alone, without PyTorch:
# `BIN --mem arena --elastic --repeat 3 --steps 50`);
# MEMCHECK=1 runs two steps of the arena run under compute-sanitizer memcheck;
# WORLD=2 (on a host with two GPUs, BIN built with `--features nccl`) trains
# the same batches data-parallel, alternating with one-GPU arena runs
# (REPEAT of each), and compares losses and speed.
set -u
BIN=${1:?usage: scripts/gpt2-gpu.sh BIN OUT [STEPS]}
OUT=${2:?usage: scripts/gpt2-gpu.sh BIN OUT [STEPS]}
STEPS=${3:-100}
PY=scripts/gpt2_reference.py
if [ ! -x "$BIN" ]; then
    echo "gpt2-gpu.sh: $BIN is not an executable (cargo build --release -p cuarena-gpt2)" >&2
    exit 2
fi
if ! command -v nvidia-smi > /dev/null || ! python3 -c 'import torch, transformers' 2> /dev/null; then
    echo "gpt2-gpu.sh needs a CUDA GPU (nvidia-smi) and Python 3 with torch and transformers" >&2
    exit 2
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT"
D=$(mktemp -d)
INIT=$D/gpt2_init.safetensors
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 "$PY" init --out "$D" --steps "$STEPS" --seed 0 || exit 1
status=0
for P in ${PRECISIONS:-fp32 bf16}; do
  if [ "${TRAIN:-1}" = 1 ]; then
    extra_t=(); extra_r=(); tol=()
    if [ "$P" = fp32 ]; then
        extra_t=(--grads-out "$D/grads0.safetensors")
        extra_r=(--check-grads "$D/grads0.safetensors")
    else
        tol=(--tol-first 2e-2 --tol-all 2e-2)
    fi
    if [ -n "${TORCH_JSON_DIR:-}" ]; then
        # PyTorch's runs from an earlier call on the same init (same seed).
        cp "$TORCH_JSON_DIR/torch_$P.json" "$OUT/"
        if [ "$P" = fp32 ]; then
            python3 "$PY" train --init "$INIT" --precision fp32 --steps 1 --json "$D/one.json" "${extra_t[@]}" > /dev/null || status=1
        fi
    else
        python3 "$PY" train --init "$INIT" --precision "$P" --json "$OUT/torch_$P.json" "${extra_t[@]}" || status=1
    fi
    [ "${ELASTIC:-0}" = 1 ] && extra_r+=(--elastic)
    "$BIN" --init "$INIT" --precision "$P" --repeat "${REPEAT:-3}" --json "$OUT/rust_$P.json" "${extra_r[@]}" || status=1
    python3 "$PY" compare --torch "$OUT/torch_$P.json" --rust "$OUT/rust_$P.json" "${tol[@]}" || status=1
  fi
    if [ "${FIND_CAP:-0}" = 1 ]; then
        python3 "$PY" find-cap --init "$INIT" --precision "$P" --json "$OUT/cap_$P.json" || status=1
    fi
done
if [ "${WORLD:-1}" -gt 1 ]; then
    for P in ${PRECISIONS:-fp32 bf16}; do
        NCCL_NVLS_ENABLE=0 "$BIN" --init "$INIT" --precision "$P" --mem arena --world "$WORLD" \
            --repeat "${REPEAT:-3}" --json "$OUT/world_$P.json" || status=1
    done
fi
if [ "${MEMCHECK:-0}" = 1 ]; then
    timeout 200 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 9 \
        "$BIN" --init "$INIT" --steps 2 --mem arena --every 1 > "$OUT/memcheck.txt" 2>&1
    echo "memcheck exit $? ($(grep -c 'ERROR SUMMARY' "$OUT/memcheck.txt") summaries): $(grep 'ERROR SUMMARY' "$OUT/memcheck.txt" | tail -1)"
fi
rm -rf "$D"
exit $status
