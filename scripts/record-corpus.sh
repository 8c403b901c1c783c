#!/usr/bin/env bash
# Records, on a CUDA machine with PyTorch 2.11 (plus torchvision and
# transformers), the snapshot-reader fixtures and the compaction-policy corpus
# of scripts/pytorch_trace.py, and packs them into tar files in $OUT:
#
#   bash scripts/record-corpus.sh [fixtures] [corpus]     (default: both)
#
# Writes into $OUT (default ./corpus-out):
#   fixtures.tar   fixtures/snap_*.pickle.gz, their JSON facts, logs and
#                  results.json (see FIXTURES in pytorch_trace.py)
#   corpus-N.tar   corpus/*.pickle.gz with a JSON of facts and a log each,
#                  split into tar files of at most 15 MiB; corpus-1.tar also
#                  holds corpus/manifest.json
#   record.log     what was printed
# Runs 4 recordings at once on the one GPU (each a subprocess, capped with
# torch.cuda.set_per_process_memory_fraction well above its expected peak).
#
# Environment (all optional):
#   CORPUS_JOBS=4         recordings at once
#   CORPUS_DEADLINE=420   seconds after which no corpus recording starts
#   RECORD_BUDGET=560     seconds the whole script may take: the corpus
#                         deadline is cut so that every recording (killed
#                         after 150 s) and the packing end within it
#   CORPUS_ONLY=a,b       only these corpus traces (names as in CORPUS)
#   CORPUS_MAX_MIB=60     at most this many MiB of corpus tar files in all
#   WORK=/tmp/record-corpus  where the recordings are written first
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$PWD/corpus-out}"
work="${WORK:-/tmp/record-corpus}"
export PYTHONUNBUFFERED=1
mkdir -p "$out" "$work" || exit 1
if [ "$#" -gt 0 ]; then parts=("$@"); else parts=(fixtures corpus); fi
log="$out/record.log"
t0=$(date +%s)
: >"$log"

{
    date -u '+%Y-%m-%d %H:%M UTC'
    python3 -c 'import torch, torchvision, transformers; print("torch", torch.__version__, "torchvision", torchvision.__version__, "transformers", transformers.__version__, "on", torch.cuda.get_device_name(0), "x", torch.cuda.device_count())'
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
} 2>&1 | tee -a "$log"

status=0
for part in "${parts[@]}"; do
    case "$part" in
        fixtures)
            rm -rf "$work/fixtures"
            python3 "$repo/scripts/pytorch_trace.py" --fixtures "$work/fixtures" \
                --jobs 4 --deadline 60 --job-timeout 90 2>&1 | tee -a "$log" || status=1
            tar cf "$out/fixtures.tar" -C "$work" fixtures || status=1
            ;;
        corpus)
            rm -rf "$work/corpus"
            deadline=$(( ${RECORD_BUDGET:-560} - ($(date +%s) - t0) - 150 - 20 ))
            [ "$deadline" -gt "${CORPUS_DEADLINE:-420}" ] && deadline="${CORPUS_DEADLINE:-420}"
            [ "$deadline" -lt 0 ] && deadline=0
            echo "corpus: no recording starts after ${deadline} s" | tee -a "$log"
            python3 "$repo/scripts/pytorch_trace.py" --corpus "$work/corpus" \
                --jobs "${CORPUS_JOBS:-4}" --deadline "$deadline" --job-timeout 150 \
                ${CORPUS_ONLY:+--only "$CORPUS_ONLY"} 2>&1 | tee -a "$log" || status=1
            # Tar files of at most 15 MiB each, at most CORPUS_MAX_MIB in all.
            python3 - "$work" "$out" "${CORPUS_MAX_MIB:-60}" <<'EOF' 2>&1 | tee -a "$log"
import os, sys, tarfile
work, out, max_mib = sys.argv[1], sys.argv[2], float(sys.argv[3])
d = os.path.join(work, "corpus")
names = sorted(os.listdir(d))
small = [n for n in names if not n.endswith(".pickle.gz")]
traces = sorted((n for n in names if n.endswith(".pickle.gz")), key=lambda n: os.path.getsize(os.path.join(d, n)))
bins, left_out, total = [[]], [], sum(os.path.getsize(os.path.join(d, n)) for n in small)
size = total
for n in traces:
    s = os.path.getsize(os.path.join(d, n))
    if total + s > max_mib * 2**20 or s > 15 * 2**20:
        left_out.append(n)
        continue
    if size + s > 15 * 2**20:
        bins.append([])
        size = 0
    bins[-1].append(n)
    size += s
    total += s
bins[0] = small + bins[0]
for i, b in enumerate(bins, 1):
    with tarfile.open(os.path.join(out, f"corpus-{i}.tar"), "w") as t:
        for n in b:
            t.add(os.path.join(d, n), arcname=f"corpus/{n}")
    print(f"corpus-{i}.tar: {len(b)} files, {os.path.getsize(os.path.join(out, f'corpus-{i}.tar')) / 2**20:.1f} MiB")
for n in left_out:
    print(f"left out (size): {n}")
EOF
            ;;
        *) echo "unknown part: $part (fixtures, corpus)"; status=1 ;;
    esac
done
exit "$status"
