#!/usr/bin/env bash
# dhp import from a file and over HTTP from a server on 127.0.0.1.
. "$(dirname "$0")/lib.sh"
HF="$(cd "$(dirname "$0")" && pwd)/data/hf"
cfg="$HF/internvl2.5-26b.json"
[ -f "$cfg" ] || { fail import_file "missing fixture $cfg"; exit 0; }
if "$DHP" import "$cfg" -o "$T/m.json" 2>"$T/err" && "$DHP" memory --model "$T/m.json" --strategy 'llm:tp=8' --json >/dev/null 2>>"$T/err"; then
    ok import_file_then_plan
else fail import_file_then_plan "$(head -c 300 "$T/err")"; fi
expect_err import_missing_file "nofile" "$DHP" import "$T/nofile.json"
printf '{"model_type": "gpt_neox"}' >"$T/neox.json"
expect_err import_unknown_type "gpt_neox" "$DHP" import "$T/neox.json"

if ! command -v /usr/bin/python3 >/dev/null; then skip import_http "no python3 for a local server"; exit 0; fi
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
(cd "$HF" && exec /usr/bin/python3 -m http.server "$port" --bind 127.0.0.1 >/dev/null 2>&1) &
srv=$!
trap 'kill $srv 2>/dev/null; rm -rf "$T"' EXIT
for _ in $(seq 50); do /usr/bin/python3 -c "import socket; socket.create_connection(('127.0.0.1',$port),0.2)" 2>/dev/null && break; sleep 0.1; done
name=$(basename "$cfg")
if "$DHP" import "http://127.0.0.1:$port/$name" -o "$T/h.json" 2>"$T/err" && cmp -s <("$DHP" import "$cfg" 2>/dev/null | grep -v '"source"') <(grep -v '"source"' "$T/h.json"); then
    ok import_http_matches_file
else fail import_http_matches_file "$(head -c 300 "$T/err")"; fi
expect_err import_http_404 "404" "$DHP" import "http://127.0.0.1:$port/missing.json"
