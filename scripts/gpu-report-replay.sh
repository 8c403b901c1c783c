#!/usr/bin/env bash
# GPU replays of the report half of a recorded corpus under the default
# policy and under naive compact-on-failure, at 1.00 x peak live, every
# tensor's bytes written and checked (`cuarena replay --gpu`).
#
#   scripts/gpu-report-replay.sh CUARENA_BINARY CORPUS_DIR [OUT_DIR]
#
# CORPUS_DIR holds the snapshots and a manifest.json listing each file with
# its half (`design` or `report`), as `scripts/record-corpus.sh` writes it.
# With ELASTIC=1 the default policy's run also replays on an elastic arena
# (no capacity; `--elastic`), whose row ends the log. Prints, per trace and policy, the outcome, bytes moved, the device time
# spent moving and whether every pass made the metadata replay's decisions;
# the logs go to OUT_DIR (default: out/gpu-report).
set -uo pipefail
bin="$1"
dir="$2"
out="${3:-out/gpu-report}"
mkdir -p "$out"
files=$(python3 -c '
import json, sys
m = json.load(open(sys.argv[1] + "/manifest.json"))
print("\n".join(t["file"] for t in m["traces"] if t["half"] == "report"))
' "$dir")
printf '%-36s %-8s %s\n' trace policy "result (from the table row)"
for f in $files; do
    for policy in ${POLICIES:-bounded naive}; do
        extra=()
        if [ "${ELASTIC:-0}" = 1 ] && [ "$policy" = bounded ]; then
            extra=(--elastic)
        fi
        log="$out/${f%%.pickle*}.$policy.log"
        timeout --signal=INT --kill-after=10 "${STEP_TIMEOUT:-120}" \
            "$bin" replay "$dir/$f" --gpu --policy "$policy" --capacity 1.0 \
            --gpu-no-baselines --gpu-warmup 0 "${extra[@]}" >"$log" 2>&1
        rc=$?
        same=$(grep -o 'decisions (compactions, bytes moved, ops run, peak): [A-Za-z]*' "$log" | awk '{print $NF}')
        mismatched=$(grep -o '[0-9]* mismatching words' "$log" | awk '{s += $1} END {print s + 0}')
        # One line per arena row of the table (the fixed arena's, then the
        # elastic one's where it ran).
        grep -E '^\| cuarena' "$log" | tr -s ' ' | while read -r row; do
            printf '%-36s %-8s rc=%s same=%s mismatching=%s %s\n' "$f" "$policy" "$rc" "${same:-?}" "$mismatched" "$row"
        done
    done
done
