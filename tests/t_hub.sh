#!/usr/bin/env bash
# Models by name: dhp import / plan --model hf:ORG/NAME against a Hub stand-in
# on 127.0.0.1 (HF_ENDPOINT), the cache under XDG_CACHE_HOME, and the Hub's
# bad answers: one line, exit 2, no cache entry.
. "$(dirname "$0")/lib.sh"
HF="$(cd "$(dirname "$0")" && pwd)/data/hf"
hub="$T/hub"
put() { mkdir -p "$hub/$1/resolve/main"; cp "$2" "$hub/$1/resolve/main/config.json"; }
put Qwen/Qwen2.5-VL-7B-Instruct "$HF/qwen2.5-vl-7b.json"
put google/gemma-3-4b-it "$HF/gemma-3-4b-it.json"
put gated/Model "$HF/paligemma-3b-pt-224.json"
mkdir -p "$hub/odd/Model/resolve/main" "$hub/broken/Model/resolve/main"
echo '{"model_type": "gpt_neox", "hidden_size": 512}' >"$hub/odd/Model/resolve/main/config.json"
echo '{"model_type": "qwen2", "hidden_size": ' >"$hub/broken/Model/resolve/main/config.json"
if ! start_http_server "$hub"; then fail hub_server "tests/http_server.py did not start"; exit 0; fi
export HF_ENDPOINT="http://127.0.0.1:$HTTP_PORT" XDG_CACHE_HOME="$T/cache"
unset HF_TOKEN HUGGING_FACE_HUB_TOKEN HF_HUB_OFFLINE
C="$T/cache/dhp/hf"

if "$DHP" import hf:Qwen/Qwen2.5-VL-7B-Instruct -o "$T/q.json" 2>"$T/err" &&
   cmp -s <("$DHP" import "$HF/qwen2.5-vl-7b.json" 2>/dev/null | grep -vE '"(name|source)"') \
          <(grep -vE '"(name|source)"' "$T/q.json") &&
   grep -q '"name":.*"Qwen2.5-VL-7B-Instruct"' "$T/q.json" &&
   cmp -s "$C/Qwen/Qwen2.5-VL-7B-Instruct/main/config.json" "$HF/qwen2.5-vl-7b.json"; then
    ok hub_import_fetches_converts_caches
else fail hub_import_fetches_converts_caches "$(head -c 300 "$T/err")"; fi

# From the cache: the server's copy is gone and the hub is offline.
rm -rf "$hub/Qwen"
if HF_HUB_OFFLINE=1 "$DHP" plan --model hf:Qwen/Qwen2.5-VL-7B-Instruct --vision-tokens 1024 --top 0 --no-baselines \
        -o /dev/null >"$T/plan.txt" 2>"$T/err" && grep -q "model    Qwen2.5-VL-7B-Instruct, 8.29B" "$T/plan.txt"; then
    ok hub_plan_from_cache_offline
else fail hub_plan_from_cache_offline "$(head -c 300 "$T/err") $(head -c 200 "$T/plan.txt")"; fi
if "$DHP" memory --model hf:google/gemma-3-4b-it --image-size 896 --strategy 'llm:tp=2' --json >/dev/null 2>"$T/err"; then
    ok hub_memory_model_by_name
else fail hub_memory_model_by_name "$(head -c 300 "$T/err")"; fi

no_entry() {   # NAME DIR: the failure left nothing under the cache for it
    if [ -e "$C/$2" ]; then fail "$1-no-cache" "$C/$2 exists"; fi
}
expect_err hub_404 "hf:nobody/none: .*/nobody/none/resolve/main/config.json: HTTP 404" "$DHP" import hf:nobody/none
no_entry hub_404 nobody
expect_err hub_gated_says_hf_token "hf:gated/Model: .*HTTP 401: gated or private model: set HF_TOKEN" \
    "$DHP" import hf:gated/Model
no_entry hub_gated gated
expect_err hub_wrong_token "the HF_TOKEN given was refused" env HF_TOKEN=wrong "$DHP" import hf:gated/Model
if HF_TOKEN=good-token "$DHP" import hf:gated/Model -o "$T/g.json" 2>/dev/null &&
   [ -s "$C/gated/Model/main/config.json" ]; then ok hub_gated_with_token
else fail hub_gated_with_token "import with HF_TOKEN failed"; fi
expect_err hub_unsupported_architecture \
    "hf:odd/Model config.json: model_type: 'gpt_neox' is not supported \\(supported: .*gemma3.*\\)" \
    "$DHP" import hf:odd/Model
no_entry hub_unsupported odd
expect_err hub_malformed "hf:broken/Model config.json: .*line" "$DHP" import hf:broken/Model
no_entry hub_malformed broken
expect_err hub_oversized "hf:google/gemma-3-4b-it: .*larger than the 100-byte cap" \
    env DHP_HTTP_MAX_BYTES=100 XDG_CACHE_HOME="$T/cache2" "$DHP" import hf:google/gemma-3-4b-it
if [ -e "$T/cache2/dhp/hf/google" ]; then fail hub_oversized-no-cache "cache entry written"; fi
expect_err hub_timeout "hf:x/y: .*timed out" env HF_ENDPOINT="$HF_ENDPOINT/never" DHP_HTTP_LOW_SPEED_TIME=2 \
    timeout 60 "$DHP" import hf:x/y
no_entry hub_timeout x
expect_err hub_offline_uncached "hf:google/gemma-3-4b-it@v2: not in the cache .* HF_HUB_OFFLINE" \
    env HF_HUB_OFFLINE=1 "$DHP" import hf:google/gemma-3-4b-it@v2
expect_err hub_bad_name "hf:../etc: organisation, name and revision may hold only" "$DHP" import hf:../etc
expect_err hub_http_endpoint_off_loopback "plain http is allowed to a loopback host only" \
    env HF_ENDPOINT=http://192.0.2.1 "$DHP" import hf:a/b
expect_err hub_endpoint_scheme "scheme 'ftp' is not http or https" env HF_ENDPOINT=ftp://127.0.0.1 "$DHP" import hf:a/b
