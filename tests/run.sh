#!/usr/bin/env bash
# The test runner: C unit tests, then every tests/t_*.sh script. Prints each
# result line and ends with one line "N passed, N failed, N skipped".
#
# The scripts run TEST_JOBS at a time (default: the processors, at most 4).
# Most of them wait far more than they compute (mpirun's ranks polling, runs
# that sleep to a timeout, Python starting up), so two lanes on CI's two cores
# take about two thirds of one lane's time. Each script keeps its own temp dir
# (tests/lib.sh) and HTTP port (start_http_server), so none sees another's
# files; its output is printed whole when it ends, under a lock, so lanes
# never interleave lines. The scripts that time this machine (ALONE: dhp
# profile's ranks sharing one processor measure how much each gets) run
# after the lanes, by themselves. TEST_JOBS=1 runs all one after another.
set -u
cd "$(dirname "$0")/.."
: "${DHP:=$PWD/dhp}" "${TEST_BIN:=$PWD/build/test_dhp}"
export DHP TEST_BIN
log=$(mktemp)
outs=$(mktemp -d)
trap 'rm -rf "$log" "$outs"' EXIT

lanes=${TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
case "$lanes" in '' | *[!0-9]* | 0) lanes=1 ;; esac
[ "$lanes" -gt 4 ] && [ -z "${TEST_JOBS:-}" ] && lanes=4

# The longest scripts start first (their CI minutes, make test then
# test-asan: t_zoo_run 128/58 s, t_run 81/96, t_faults 82/61, t_bf16
# 39/84), so the lanes end together; the rest follow in name order.
FIRST="t_zoo_run t_run t_faults t_bf16 t_comm_nccl t_backend t_export t_gpu_check"
ALONE="t_profile"
laned_scripts() {
    local f
    for f in $FIRST; do [ -e "tests/$f.sh" ] && echo "tests/$f.sh"; done
    for f in tests/t_*.sh; do
        [ -e "$f" ] || continue
        case " $FIRST $ALONE " in *" $(basename "$f" .sh) "*) ;; *) echo "$f" ;; esac
    done
}

# run_script T: T's output and its time, printed as one block when it ends
run_script() {
    local t=$1 out t0
    out="$outs/$(basename "$t").out"
    t0=$SECONDS
    bash "$t" >"$out" 2>&1 || echo "FAIL $t: script exited non-zero" >>"$out"
    echo "# time $t: $((SECONDS - t0)) s" >>"$out"   # where CI's minutes go
    flock "$outs/print.lock" cat "$out"
}

{
    unit_log=$(mktemp)
    t0=$SECONDS
    "$TEST_BIN" >"$unit_log" 2>&1
    status=$?
    cat "$unit_log"
    # A crash (sanitizer abort, signal) must not pass silently.
    if [ "$status" != 0 ] && ! grep -qE '^FAIL ' "$unit_log"; then
        echo "FAIL unit-tests: $TEST_BIN exited with status $status before finishing"
    fi
    rm -f "$unit_log"
    echo "# time unit tests: $((SECONDS - t0)) s"
    t0=$SECONDS
    for t in $(laned_scripts); do
        while [ "$(jobs -rp | wc -l)" -ge "$lanes" ]; do wait -n; done
        run_script "$t" &
    done
    wait
    echo "# time scripts, $lanes at a time: $((SECONDS - t0)) s"
    for f in $ALONE; do [ -e "tests/$f.sh" ] && run_script "tests/$f.sh"; done
} | tee "$log" | grep -vE '^unit: '
passed=$(grep -cE '^ok ' "$log")
failed=$(grep -cE '^FAIL ' "$log")
skipped=$(grep -cE '^skipped: ' "$log")
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
