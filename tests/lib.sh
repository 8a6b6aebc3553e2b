# Helpers for script tests. Each check prints "ok NAME", "FAIL NAME: why" or
# "skipped: NAME: why", the same lines the C runner prints.
# Needs $DHP (the binary under test). Work in a private temp dir.
set -u
T=$(mktemp -d "${TMPDIR:-/tmp}/dhp-test.XXXXXX")
PIDS_TO_STOP=""
trap 'for p in $PIDS_TO_STOP; do kill "$p" 2>/dev/null; done; rm -rf "$T"' EXIT

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

# start_http_server ROOT [ARGS...]: tests/http_server.py on 127.0.0.1 (stopped
# when the script exits, and by itself after 300 s); sets HTTP_PORT.
start_http_server() {
    local root=$1; shift
    local pf; pf=$(mktemp -u "$T/port.XXXXXX")
    /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/http_server.py" --root "$root" --port-file "$pf" "$@" \
        >/dev/null 2>&1 &
    PIDS_TO_STOP="$PIDS_TO_STOP $!"
    for _ in $(seq 100); do [ -s "$pf" ] && break; sleep 0.1; done
    HTTP_PORT=$(cat "$pf" 2>/dev/null)
    [ -n "$HTTP_PORT" ]
}

# Requests to the test servers must not go through a proxy from the environment.
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" no_proxy="127.0.0.1,localhost${no_proxy:+,$no_proxy}"

# dhp run --log-json: losses FILE prints the steps' losses; same_losses A B: every
# step's loss (files of losses) within 1e-5 relative.
losses() { /usr/bin/python3 -c "import json,sys; print(' '.join(repr(json.loads(l)['loss']) for l in open(sys.argv[1]) if l.startswith('{')))" "$1"; }

same_losses() {
    /usr/bin/python3 - "$1" "$2" <<'PY'
import sys
a = [float(x) for x in open(sys.argv[1]).read().split()]
b = [float(x) for x in open(sys.argv[2]).read().split()]
if len(a) != len(b) or not a: sys.exit(f"{len(a)} vs {len(b)} steps")
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"losses: worst relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}
