#!/usr/bin/env bash
# GPU suite: build on a machine with Rust (no GPU, no CUDA needed), run on a
# CUDA machine (which needs no Rust).
#
#   scripts/gpu-suite.sh build    build every test, bench and example
#                                 executable and the `cuarena` command in
#                                 release mode, strip debug
#                                 info, stage them into .gpu-stage/ and print
#                                 how to run them on the CUDA machine
#   scripts/gpu-suite.sh run      (on the CUDA machine) run the GPU tests, the
#                                 GPU benches (moves, handles, spill,
#                                 elastic_gpu), the
#                                 examples (demo, train_mlp), the GPU trace
#                                 replay (`cuarena replay --gpu`), the NCCL
#                                 tests, and the GPU tests again under
#                                 compute-sanitizer memcheck, racecheck and
#                                 synccheck at reduced size (and the NCCL
#                                 tests under memcheck); logs go to $OUT (or
#                                 .gpu-stage/out), a short table is printed last
#
# Environment for `run` (all optional):
#   SUITE_SKIP="bench racecheck"  parts to skip: tests nccl bench examples replay memcheck
#                                 racecheck synccheck nccl-memcheck
#   SUITE_BENCHES="moves handles spill elastic_gpu"  GPU benches to run (default all four)
#   SUITE_EXAMPLES="demo train_mlp"      examples to run (default these two)
#   CUARENA_GPU_PROGRAMS          random arena programs in the plain test run (default 4000)
#   CUARENA_BENCH_REPS            bench repetitions (default 10)
#   CUARENA_BENCH_SWEEP=1         bench other kernel shapes too
#   SAN_MAX_BLOCK                 largest block under the sanitizers (default 4194304)
#   SAN_PROGRAMS                  random programs under the sanitizers (default 20)
#   STEP_TIMEOUT                  seconds each step may take (default 280)
#
# `build` honours CARGO_TARGET_DIR and STAGE (default: .gpu-stage in the repo).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
stage="${STAGE:-$repo/.gpu-stage}"
mode="${1:-build}"

list_executables() {
    # cargo's JSON messages -> "<target name> <executable>" per line
    python3 -c '
import json, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("executable"):
        kind = " ".join(m["target"]["kind"])
        name = m["target"]["name"]
        if kind == "bin" and m.get("profile", {}).get("test"):
            kind = "bin-test"  # the unit tests of a binary, not the binary
        # Each crate has a test binary `all`: those of the workspace crates
        # are named after their crate (crates/cuarena-trace -> trace-all).
        parts = m.get("manifest_path", "").split("/")
        if kind == "test" and len(parts) > 2 and parts[-3] == "crates":
            name = parts[-2].removeprefix("cuarena-") + "-" + name
        print(name, kind, m["executable"])
'
}

build() {
    cd "$repo" || exit 1
    rm -rf "$stage"
    mkdir -p "$stage/bin"
    local list
    list="$(mktemp)"
    echo "== building tests (release)" >&2
    # With `nccl`: the test binary then holds the NCCL tests too (libnccl is
    # loaded only when they run, so the binary runs on any CUDA machine).
    cargo test --release --workspace --features cuarena/nccl --no-run --message-format=json | list_executables >>"$list" || exit 1
    echo "== building benches" >&2
    # Only the bench executables: the unit tests cargo rebuilds in the bench
    # profile would replace the release ones built with `nccl` above.
    cargo bench --features nccl --no-run --message-format=json | list_executables | awk '$2 == "bench"' >>"$list" || exit 1
    echo "== building examples and the cuarena command" >&2
    cargo build --release --workspace --features cuarena/nccl --examples --bins --message-format=json | list_executables >>"$list" || exit 1
    while read -r name kind exe; do
        local dest
        case "$kind" in
            lib) dest="unit-$name" ;;
            test) dest="test-$name" ;;
            bench) dest="bench-$name" ;;
            example) dest="example-$name" ;;
            bin) dest="$name" ;;
            bin-test) dest="unit-bin-$name" ;;
            *) dest="$kind-$name" ;;
        esac
        strip --strip-debug -o "$stage/bin/$dest" "$exe" || cp "$exe" "$stage/bin/$dest"
        echo "staged $dest" >&2
    done <"$list"
    rm -f "$list"
    # The traces go into the stage, so that the stage and a checkout are
    # all the CUDA machine needs.
    mkdir -p "$stage/traces"
    for t in "$repo"/crates/cuarena-trace/tests/data/resnet50_varbatch.csv.gz "$repo"/crates/cuarena-trace/tests/data/*.pickle.gz; do
        [ -e "$t" ] && cp "$t" "$stage/traces/"
    done
    du -sh "$stage" >&2
    cat <<EOF

On the CUDA machine, in a copy of this repository with .gpu-stage/ in it:
  bash scripts/gpu-suite.sh run
EOF
}

run() {
    cd "$repo" || exit 1
    export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
    export PATH="/usr/local/cuda/bin:$PATH"
    local out="${OUT:-$stage/out}"
    mkdir -p "$out"
    local bin="$stage/bin"
    local skip=" ${SUITE_SKIP:-} "
    local summary="$out/summary.txt"
    : >"$summary"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$summary"

    local t0 status
    step() { # name, log, command...
        local name="$1" log="$2"
        shift 2
        echo "== $name" >&2
        t0=$(date +%s)
        timeout --signal=INT --kill-after=10 "${STEP_TIMEOUT:-280}" "$@" >"$out/$log" 2>&1
        status=$?
        local verdict="ok"
        [ $status -ne 0 ] && verdict="FAILED (exit $status)"
        printf '%-28s %-18s %5ss  log %s\n' "$name" "$verdict" "$(($(date +%s) - t0))" "$log" >>"$summary"
        tail -n 5 "$out/$log" >&2
    }

    # NVLink multicast off: NCCL's multicast setup is not needed here.
    export NCCL_NVLS_ENABLE=0
    if [[ $skip != *" tests "* ]]; then
        step "gpu tests" tests.log "$bin/test-all" gpu --include-ignored --test-threads=1 --nocapture
        step "gpu replay test" tests-replay.log "$bin/test-trace-all" gpu_replay --include-ignored --test-threads=1 --nocapture
        step "core unit tests on cuda" tests-unit.log "$bin/unit-cuarena" backend::cuda --include-ignored --test-threads=1 --nocapture
        step "tensor crate on cuda" tests-tensor.log "$bin/test-tensor-all" cuda --include-ignored --test-threads=1 --nocapture
    fi
    if [[ $skip != *" nccl "* ]]; then
        step "nccl tests" nccl.log "$bin/test-all" nccl --include-ignored --test-threads=1 --nocapture
    fi
    if [[ $skip != *" bench "* ]]; then
        for b in ${SUITE_BENCHES:-moves handles spill elastic_gpu}; do
            local log=bench.log
            [ "$b" != moves ] && log="bench-$b.log"
            step "$b bench" "$log" "$bin/bench-$b" --bench
        done
    fi
    if [[ $skip != *" examples "* ]]; then
        for ex in ${SUITE_EXAMPLES:-demo train_mlp}; do
            step "example $ex" "example-$ex.log" "$bin/example-$ex"
        done
        [ -e out/demo_memory_map.svg ] && cp out/demo_memory_map.svg "$out/"
    fi
    if [[ $skip != *" replay "* ]] && [ -e "$stage/traces/resnet50_varbatch.csv.gz" ]; then
        step "cuarena replay --gpu (resnet50)" replay.log "$bin/cuarena" replay \
            "$stage/traces/resnet50_varbatch.csv.gz" --gpu --find-min --svg "$out/replay_timeline.svg"
    fi
    # Reduced sizes, and one host thread: racecheck loses track of kernels
    # launched from several threads at once (and then hangs). The GPU trace
    # replay test (the trace crate's binary) runs under memcheck only: its
    # thousands of pattern kernels under racecheck did not finish.
    local san_env=(env CUARENA_GPU_MAX_BLOCK="${SAN_MAX_BLOCK:-4194304}" CUARENA_GPU_PROGRAMS="${SAN_PROGRAMS:-20}" CUARENA_GPU_THREADS=1)
    if [[ $skip != *" memcheck "* ]]; then
        # The refused-map test asks the driver for too much on purpose;
        # memcheck counts that API error as an error.
        step "memcheck (reduced)" memcheck.log "${san_env[@]}" compute-sanitizer --tool memcheck \
            --error-exitcode 99 "$bin/test-all" gpu --include-ignored --test-threads=1 \
            --skip a_map_the_device_refuses
        step "memcheck replay (reduced)" memcheck-replay.log "${san_env[@]}" compute-sanitizer --tool memcheck \
            --error-exitcode 99 "$bin/test-trace-all" gpu_replay --include-ignored --test-threads=1
    fi
    if [[ $skip != *" racecheck "* ]]; then
        step "racecheck (reduced)" racecheck.log "${san_env[@]}" compute-sanitizer --tool racecheck \
            --racecheck-report hazard --error-exitcode 99 "$bin/test-all" gpu --include-ignored --test-threads=1
    fi
    if [[ $skip != *" synccheck "* ]]; then
        step "synccheck (reduced)" synccheck.log "${san_env[@]}" compute-sanitizer --tool synccheck \
            --error-exitcode 99 "$bin/test-all" gpu --include-ignored --test-threads=1
    fi
    if [[ $skip != *" nccl-memcheck "* ]]; then
        # NCCL probes the driver with calls it expects to fail (peer access
        # already enabled, no kernel image for another architecture): those
        # API-error reports are left out; memory errors are all reported.
        step "nccl memcheck" nccl-memcheck.log compute-sanitizer --tool memcheck \
            --report-api-errors no --error-exitcode 99 "$bin/test-all" nccl --include-ignored --test-threads=1 \
            --skip peer_never_joins --skip dies_mid # timing bounds; the sanitizer slows the abort
    fi

    echo
    echo "== results"
    for log in tests tests-unit tests-replay tests-tensor nccl memcheck memcheck-replay racecheck synccheck nccl-memcheck; do
        [ -e "$out/$log.log" ] || continue
        printf '%-10s %s\n' "$log" "$(grep -hE '^test result' "$out/$log.log" | tail -n 1)"
        grep -hE '^test .*(FAILED|panicked)|random programs' "$out/$log.log" | sed "s/^/           /"
    done
    for log in memcheck memcheck-replay racecheck synccheck nccl-memcheck; do
        [ -e "$out/$log.log" ] && printf '%-14s %s\n' "$log" "$(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$out/$log.log" | tail -n 1)"
    done
    grep -hE "^device |end-to-end" "$out/bench.log" 2>/dev/null
    sed -n '/^moves bench/,$p' "$out/bench.log" 2>/dev/null
    for log in bench-handles bench-spill bench-elastic_gpu; do
        [ -e "$out/$log.log" ] && { echo "-- $log"; grep -E '^\|' "$out/$log.log"; }
    done
    for ex in demo train_mlp; do
        [ -e "$out/example-$ex.log" ] && { echo "-- example $ex"; tail -n 25 "$out/example-$ex.log"; }
    done
    [ -e "$out/replay.log" ] && { echo "-- cuarena replay --gpu"; tail -n 25 "$out/replay.log"; }
    echo
    cat "$summary"
    # Pack the logs into one archive, beside the summary.
    if [ -n "${OUT:-}" ]; then
        (cd "$out" && tar czf all-logs.tgz ./*.log && rm -f ./*.log)
    fi
}

case "$mode" in
    build) build ;;
    run) run ;;
    *)
        echo "usage: $0 [build|run]" >&2
        exit 2
        ;;
esac
