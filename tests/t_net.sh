#!/usr/bin/env bash
# util/http.c against misbehaving servers on 127.0.0.1: each request ends
# with one line and exit 2 within its time or size cap (a 60 s watchdog
# catches a hang), and nothing is written.
. "$(dirname "$0")/lib.sh"
mkdir -p "$T/root"
if ! start_http_server "$T/root"; then fail net_server "tests/http_server.py did not start"; exit 0; fi
U="http://127.0.0.1:$HTTP_PORT"

# net_case NAME PATTERN [ENV=VAL...] -- URL: dhp import URL -o FILE under a watchdog.
net_case() {
    local name=$1 pat=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    rm -f "$T/out.json"
    expect_err "$name" "$pat" env "${envs[@]}" timeout 60 "$DHP" import "$1" -o "$T/out.json"
    if [ -e "$T/out.json" ]; then fail "$name-no-output" "$T/out.json was written"; fi
}
net_case net_never_answers "never/x.json: timed out" DHP_HTTP_LOW_SPEED_TIME=2 -- "$U/never/x.json"
net_case net_slow_answer "slow/x.json: timed out" DHP_HTTP_TIMEOUT=3 DHP_HTTP_LOW_SPEED_TIME=100 -- "$U/slow/x.json"
net_case net_endless_body "endless/x.json: response larger than the 16777216-byte cap" -- "$U/endless/x.json"
net_case net_2gb_body "2gb/x.json: response larger than the 16777216-byte cap" -- "$U/2gb/x.json"
net_case net_2gb_streamed "2gb/x.json: response larger than the 1048576-byte cap" DHP_HTTP_MAX_BYTES=1048576 -- "$U/2gb/x.json"
net_case net_redirect_loop "loop/x.json: more than 5 redirects" -- "$U/loop/x.json"
net_case net_plain_http_off_loopback "plain http is allowed to a loopback host only" -- "http://192.0.2.1/config.json"
net_case net_404 "HTTP 404 \\(not found\\)" -- "$U/missing.json"

# https -> http: a TLS server on 127.0.0.1 with a certificate made here, trusted
# through CURL_CA_BUNDLE, redirects to the plain server.
if ! openssl req -x509 -newkey rsa:2048 -nodes -keyout "$T/key.pem" -out "$T/cert.pem" -days 1 \
        -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 >/dev/null 2>&1; then
    fail net_https_cert "openssl could not make a certificate"
    exit 0
fi
echo '{"model_type": "llama"}' >"$T/root/llama.json"
if ! start_http_server "$T/root" --tls "$T/cert.pem" "$T/key.pem" --downgrade-to "$U/llama.json"; then
    fail net_https_server "the TLS server did not start"; exit 0
fi
S="https://127.0.0.1:$HTTP_PORT"
if CURL_CA_BUNDLE="$T/cert.pem" timeout 60 "$DHP" import "$S/llama.json" >/dev/null 2>"$T/err"; then ok net_https_fetch
else fail net_https_fetch "$(head -c 300 "$T/err")"; fi
net_case net_no_https_downgrade "redirect from https down to http refused" CURL_CA_BUNDLE="$T/cert.pem" -- "$S/downgrade/x.json"
net_case net_https_untrusted "SSL certificate|certificate" CURL_CA_BUNDLE=/dev/null -- "$S/llama.json"
