# Helpers for script tests. Each check prints "ok NAME", "FAIL NAME: why" or
# "skipped: NAME: why", the same lines the C runner prints.
# Needs $DHP (the binary under test). Work in a private temp dir.
set -u
T=$(mktemp -d "${TMPDIR:-/tmp}/dhp-test.XXXXXX")
trap 'rm -rf "$T"' EXIT

ok()   { echo "ok $1"; }
fail() { echo "FAIL $1: $2"; }
skip() { echo "skipped: $1: $2"; }

# expect_exit NAME CODE CMD... : runs CMD, checks its exit code.
expect_exit() {
    local name=$1 want=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local got=$?
    if [ "$got" = "$want" ]; then ok "$name"; else fail "$name" "exit $got, wanted $want; stderr: $(head -c 300 "$T/err")"; fi
}

# expect_err NAME PATTERN CMD... : CMD must exit 2 with one stderr line matching PATTERN.
expect_err() {
    local name=$1 pat=$2; shift 2
    "$@" >"$T/out" 2>"$T/err"
    local got=$?
    local lines; lines=$(wc -l <"$T/err")
    if [ "$got" != 2 ]; then fail "$name" "exit $got, wanted 2; stderr: $(head -c 300 "$T/err")"
    elif [ "$lines" != 1 ]; then fail "$name" "wanted one error line, got $lines: $(head -c 300 "$T/err")"
    elif ! grep -qE -- "$pat" "$T/err"; then fail "$name" "stderr '$(cat "$T/err")' does not match '$pat'"
    else ok "$name"; fi
}
