#!/usr/bin/env bash
# Two tenants on one GPU: two processes whose peaks together exceed the
# GPU's memory, in alternating phases (A0 B0 A1 B1 ...), handed their turns
# through files. Each phase allocates FRACTION of the GPU's memory in u32
# tensors of varied sizes, churns, fills, frees and gives back what it can.
#
#   cargo build --release --example two_tenants
#   scripts/two-tenants.sh target/release/examples/two_tenants OUT
#
# Variants (VARIANTS, default all four, in this order):
#   elastic           both tenants on elastic cuarena arenas, trim() after each phase
#   fixed             both on fixed arenas of the peak (B's creation should fail)
#   torch-default     PyTorch's caching allocator, no empty_cache
#   torch-expandable  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, empty_cache()
# Writes OUT/samples.csv (memory held per process, sampled every ~50 ms),
# OUT/results.csv, OUT/events.csv, OUT/log.txt and OUT/two_tenants.svg
# (copy it to docs/), and prints the table last. FRACTION (0.62), PHASES (3),
# HOLD_MS (1500: the least time a phase holds its peak) tune it. Without an
# NVIDIA GPU it prints why and exits with status 0.
set -u
BIN=${1:?usage: scripts/two-tenants.sh BIN OUT}
OUT=${2:?usage: scripts/two-tenants.sh BIN OUT}
PY=$(dirname "$0")/two_tenants.py
FRACTION=${FRACTION:-0.62}
PHASES=${PHASES:-3}
HOLD_MS=${HOLD_MS:-1500}
VARIANTS=${VARIANTS:-elastic fixed torch-default torch-expandable}
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
    echo "two-tenants.sh: skipped: no NVIDIA GPU (nvidia-smi missing or failing)"
    exit 0
fi
if [ ! -x "$BIN" ]; then
    echo "two-tenants.sh: $BIN is not an executable (cargo build --release --example two_tenants)" >&2
    exit 2
fi
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
mkdir -p "$OUT"
LOG=$OUT/log.txt
TOTAL_MIB=$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')
PEAK=$(python3 -c "print(int($TOTAL_MIB * 2**20 * $FRACTION) // 4096 * 4096)")
{
    nvidia-smi -i 0 --query-gpu=name,driver_version,memory.total --format=csv,noheader
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "each tenant's phase peak: $PEAK B ($FRACTION of $TOTAL_MIB MiB), $PHASES phases each, hold $HOLD_MS ms"
} | tee "$LOG"
W=$(mktemp -d)
echo none > "$W/variant"
python3 "$PY" sample --out "$OUT/samples.csv" --variant-file "$W/variant" --stop "$W/stop" \
    --interval-ms 50 >> "$LOG" 2>&1 &
SAMPLER=$!
echo "variant,tenant,pid,exit,phases_done,phases,message" > "$OUT/results.csv"
echo "variant,tenant,t_unix,phase,what" > "$OUT/events.csv"

# Starts tenant $2 of variant $1 with turn folder $3; sets LAST_PID.
launch() {
    local v=$1 n=$2 d=$3
    local common=(--name "$n" --peak-bytes "$PEAK" --turns "$d" --phases "$PHASES" --hold-ms "$HOLD_MS")
    case $v in
        elastic | fixed) "$BIN" --mode "$v" "${common[@]}" > "$d/$n.log" 2>&1 & ;;
        torch-default) python3 "$PY" tenant "${common[@]}" > "$d/$n.log" 2>&1 & ;;
        torch-expandable)
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
                python3 "$PY" tenant --empty-cache "${common[@]}" > "$d/$n.log" 2>&1 & ;;
        *) echo "two-tenants.sh: unknown variant $v" >&2; exit 2 ;;
    esac
    LAST_PID=$!
}

# Waits until file $1 exists (0), or tenant $2 (pid $3) failed or exited (1).
await() {
    local f=$1 n=$2 pid=$3 d
    d=$(dirname "$f")
    for _ in $(seq 30000); do
        [ -e "$f" ] && return 0
        if [ -e "$d/failed.$n" ] || ! kill -0 "$pid" 2> /dev/null; then
            return 1
        fi
        sleep 0.01
    done
    echo "two-tenants.sh: gave up waiting for $f" >&2
    return 1
}

for v in $VARIANTS; do
    d=$W/$v
    mkdir -p "$d"
    echo "$v" > "$W/variant"
    echo "== $v" | tee -a "$LOG"
    sleep 0.5
    declare -A PID=() ALIVE=()
    for n in A B; do
        launch "$v" "$n" "$d"
        PID[$n]=$LAST_PID
        ALIVE[$n]=1
        await "$d/ready.$n" "$n" "${PID[$n]}" || ALIVE[$n]=0
    done
    for ((i = 0; i < PHASES; i++)); do
        for n in A B; do
            [ "${ALIVE[$n]}" = 1 ] || continue
            : > "$d/go.$n.$i"
            await "$d/done.$n.$i" "$n" "${PID[$n]}" || ALIVE[$n]=0
        done
    done
    for n in A B; do
        wait "${PID[$n]}"
        rc=$?
        done_n=$(find "$d" -name "done.$n.*" | wc -l)
        msg=$(grep -m1 "^$n FAILED" "$d/$n.log" || grep -m1 '^RESULT' "$d/$n.log" || tail -1 "$d/$n.log")
        msg=${msg//\"/\"\"}
        printf '%s,%s,%s,%s,%s,%s,"%s"\n' "$v" "$n" "${PID[$n]}" "$rc" "$done_n" "$PHASES" "$msg" \
            >> "$OUT/results.csv"
        sed -n "s/^EVENT t=\([0-9.]*\) $n phase \([0-9]*\) \(start\|end\)$/$v,$n,\1,\2,\3/p" \
            "$d/$n.log" >> "$OUT/events.csv"
        { echo "-- $v $n (pid ${PID[$n]}, exit $rc)"; grep -v '^EVENT' "$d/$n.log"; } >> "$LOG"
        grep -E "^($n FAILED|RESULT)" "$d/$n.log"
    done
    sleep 1
done
echo none > "$W/variant"
: > "$W/stop"
wait "$SAMPLER"
tail -1 "$LOG"
python3 "$PY" plot --dir "$OUT" --total-mib "$TOTAL_MIB" \
    --title "Two tenants on one GPU: $(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader)" | tee -a "$LOG"
rm -rf "$W"
