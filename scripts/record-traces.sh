#!/usr/bin/env bash
# Records real allocation traces of scripts/pytorch_trace.py's workloads on
# a CUDA machine, each gzipped into $OUT, for `cuarena replay`:
#
#   bash scripts/record-traces.sh [WORKLOAD...]
#
# Default workloads: bert-varlen model-switch llm-decode (each at its default
# --steps; together about a minute or two on one H100). Writes, per workload,
# WORKLOAD.pickle.gz and WORKLOAD.log (the script's output) into $OUT (default
# ./traces-out), and prints one line per workload: status, wall time, size and
# peak allocated bytes. A workload that fails (or runs past $TRACE_TIMEOUT
# seconds, default 150) does not stop the others; its log's last lines are
# printed. Exit status: 0 when every workload was recorded, 1 otherwise.
# $TRACE_ARGS: more arguments for every workload (e.g. "--steps 10").
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$PWD/traces-out}"
limit="${TRACE_TIMEOUT:-150}"
mkdir -p "$out" || exit 1
if [ "$#" -gt 0 ]; then
    workloads=("$@")
else
    workloads=(bert-varlen model-switch llm-decode)
fi

python3 -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))' 2>&1 | tail -1
failed=0
for w in "${workloads[@]}"; do
    pickle="$out/$w.pickle"
    log="$out/$w.log"
    rm -f "$pickle" "$pickle.gz"
    start=$(date +%s.%N)
    timeout "$limit" python3 "$repo/scripts/pytorch_trace.py" "$w" --out "$pickle" ${TRACE_ARGS:-} >"$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }')
    if [ "$rc" -eq 0 ] && [ -s "$pickle" ] && gzip -9f "$pickle"; then
        size=$(stat -c %s "$pickle.gz")
        peak=$(grep -o 'peak allocated [0-9,]* B ([^)]*)' "$log" | head -1)
        printf '%-14s ok      %7s s  %9s B gzipped  %s\n' "$w" "$secs" "$size" "$peak"
    else
        failed=1
        [ "$rc" -eq 124 ] && rc="$rc, past ${limit} s"
        printf '%-14s FAILED  %7s s  (exit %s; %s)\n' "$w" "$secs" "$rc" "$log"
        tail -n 5 "$log" | sed 's/^/    /'
        rm -f "$pickle"  # a partial pickle is no trace
    fi
done
exit "$failed"
