#!/usr/bin/env bash
# The test runner: C unit tests, then every tests/t_*.sh script. Prints each
# result line and ends with one line "N passed, N failed, N skipped".
set -u
cd "$(dirname "$0")/.."
: "${DHP:=$PWD/dhp}" "${TEST_BIN:=$PWD/build/test_dhp}"
export DHP TEST_BIN
log=$(mktemp)
trap 'rm -f "$log"' EXIT
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
    for t in tests/t_*.sh; do
        [ -e "$t" ] || continue
        t0=$SECONDS
        bash "$t" 2>&1 || echo "FAIL $t: script exited non-zero"
        echo "# time $t: $((SECONDS - t0)) s"   # where CI's minutes go
    done
} | tee "$log" | grep -vE '^unit: '
passed=$(grep -cE '^ok ' "$log")
failed=$(grep -cE '^FAIL ' "$log")
skipped=$(grep -cE '^skipped: ' "$log")
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ] && [ "$passed" -gt 0 ]
