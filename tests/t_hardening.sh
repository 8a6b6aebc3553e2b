#!/usr/bin/env bash
# Hostile inputs through the CLI (issue: hardened against bad input): each is
# refused with one line and exit 2, never a crash, a hang or a runaway; and
# outputs go where they are named.
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3
export OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
cd "$T"
TINY="--model tiny-vl --cluster cpu-4 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32"
"$DHP" plan $TINY --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o one.json >/dev/null 2>&1 || fail hard_setup "dhp plan failed"

# edit FILE.json OUT.json PYTHON-EXPRESSION-ON-d
edit() { $PY -c "import json,sys; d=json.load(open(sys.argv[1])); $3; json.dump(d, open(sys.argv[2], 'w'))" "$1" "$2"; }

# --- sizes that wrapped or divided by zero ---
# colocated dp * micro_batch = 65536 * 65536 wrapped to 0, then global_batch % 0: SIGFPE
"$DHP" plan --model tiny-vl --cluster 128x8xh100 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32 \
    --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o big.json >/dev/null 2>&1
edit big.json fpe.json "c=d['cluster']['pools'][0]; c['nodes']=8192; d['world_size']=65536
for m in d['modules']: m.update(dp=65536, n_ranks=65536, micro_batch=65536)"
expect_err hard_plan_dp_times_micro_batch_past_2_31 'dp\*micro_batch' "$DHP" memory fpe.json
expect_err hard_simulate_dp_times_micro_batch_past_2_31 'dp\*micro_batch' "$DHP" simulate fpe.json
# vision tokens per sample past 2^31: signed overflow in the schedule
edit one.json tokens.json "d['workload'].update(images_per_sample=65536, image_tokens=65536)"
expect_err hard_plan_vision_tokens_past_2_31 'tokens per sample, above the limit' "$DHP" simulate tokens.json
# degrees whose product overflows
edit one.json degrees.json "d['modules'][1].update(dp=16777216, tp=1024, sp=65536, pp=1024)"
expect_err hard_plan_degrees_past_2_63 'modules\[1\]' "$DHP" memory degrees.json
expect_err hard_cli_images_zero '--images: 0 is out of range' "$DHP" plan --images 0
# found by fuzz_hf_config: a Qwen2.5-VL window of 91312 px over 1-px patches, squared, overflowed an int
expect_err hard_hf_window_squared_past_2_31 'derived window \(patches\) = 8337881344 exceeds' \
    "$DHP" import "$ROOT/tests/fuzz/regress/fuzz_hf_config/crash-window-size-squared-overflow"

# --- the simulator and the planner at sizes that used to run away ---
expect_err hard_simulate_refuses_a_million_chunks 'chunks make [0-9.e+]+ ops, above the simulator.s limit' \
    "$DHP" simulate --model tiny-vl --cluster cpu-4 --strategy 'vision:dp=4;llm:dp=4' --batch 4194304 \
    --vision-tokens 64 --text-tokens 48 --precision fp32
# 2^28 samples: 6.7 GB and 29 s before; bounded now (the simulated re-ranking is refused, the analytic
# stays). The peak resident memory is read after the fact (a sanitizer build cannot run under ulimit -v).
peak_kb() { $PY -c "import resource,subprocess,sys
r = subprocess.run(sys.argv[1:], stdout=open('out', 'w'), stderr=open('err', 'w'))
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if r.returncode == 0 else -1)" "$@"; }
kb=$(peak_kb timeout 120 "$DHP" plan --model tiny-vl --cluster cpu-4 --batch 268435456 --vision-tokens 64 \
     --text-tokens 48 --precision fp32 --top 0 -o /dev/null)
if [ "$kb" -gt 0 ] && [ "$kb" -lt 3000000 ] && grep -q 'chosen plan' out; then ok "hard_plan_batch_2_28_bounded ($((kb / 1024)) MB)"
else fail hard_plan_batch_2_28_bounded "peak $kb KB: $(tail -c 300 err)"; fi

# --- JSON that cJSON accepts and dhp must not ---
cp "$ROOT/models/zoo/tiny-vl.json" tiny.json
$PY - tiny.json <<'PY'
import sys
t = open(sys.argv[1]).read()
open("dup.json", "w").write(t.replace('"layers": 2,', '"layers": 2, "layers": 3,', 1))
open("nul.json", "w").write(t.replace('"name": "tiny-vl"', '"name": "tiny\\u0000vl"', 1))
open("utf8.json", "wb").write(t.replace('"name": "tiny-vl"', '"name": "tiny-XYvl"', 1).encode().replace(b"XY", b"\xc3\x28"))
open("esc.json", "w").write(t.replace('"name": "tiny-vl"', '"name": "tiny\\u001b[31mvl"', 1))
open("deep.json", "w").write("[" * 100000 + "]" * 100000)
PY
expect_err hard_json_duplicate_key "key 'layers' appears twice in modules\[0\]" "$DHP" plan --model dup.json -o never.json
expect_err hard_json_nul_in_name 'NUL character' "$DHP" plan --model nul.json -o never.json
expect_err hard_json_invalid_utf8 'invalid UTF-8' "$DHP" plan --model utf8.json -o never.json
expect_err hard_json_escape_code_in_name 'name: control characters are not allowed' "$DHP" plan --model esc.json -o never.json
expect_err hard_json_nesting_depth 'nesting deeper than 64 levels' "$DHP" plan --model deep.json -o never.json
[ -e never.json ] && fail hard_json_no_output "a refused input still wrote never.json"

# a terminal escape sequence in a path or argument is never echoed raw
"$DHP" plan --model "$(printf 'no\033]0;owned\007such.json')" >out 2>err
if [ $? = 2 ] && ! grep -q "$(printf '\033')" err && grep -q 'no?\]0;owned?such.json' err; then ok hard_error_lines_scrub_control_codes
else fail hard_error_lines_scrub_control_codes "$(od -c err | head -3)"; fi

# --- files that are not files ---
truncate -s 301M huge.json
expect_err hard_input_size_capped 'huge.json: 315621376 bytes, above the 67108864-byte limit' "$DHP" plan --model huge.json
expect_err hard_input_device_refused '/dev/zero: is a character device' "$DHP" plan --model /dev/zero
mkfifo fifo.json
if timeout 20 "$DHP" plan --model fifo.json >out 2>err; then fail hard_input_fifo_refused "accepted a FIFO"
elif [ $? = 124 ]; then fail hard_input_fifo_refused "blocked on the FIFO"
elif grep -q 'fifo.json: is a FIFO' err; then ok hard_input_fifo_refused
else fail hard_input_fifo_refused "$(cat err)"; fi
expect_err hard_plan_file_fifo 'is a FIFO' timeout 20 "$DHP" simulate fifo.json
expect_err hard_checkpoint_fifo 'fifo.json: not a regular file' timeout 20 "$DHP" data ckpt-inspect fifo.json

# --- module names become file names ---
edit one.json evil.json "d['model']['modules'][1]['name']='../../../X'; d['model']['modules'][0]['feeds']='../../../X'; d['modules'][1]['module']='../../../X'"
expect_err hard_module_name_cannot_escape 'must be letters, digits' "$DHP" memory evil.json

# --- outputs ---
# /dev/stdout (a pipe here) is written in place, not replaced by a regular file
if "$DHP" plan $TINY --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o /dev/stdout 2>err | $PY -c \
     "import json,sys; t=sys.stdin.read(); assert json.loads(t[t.index('{'):t.rindex('}')+1])['schema']=='dhp.plan/1'" \
   && [ -L /dev/stdout ] || [ -c /dev/stdout ]; then ok hard_output_dev_stdout_in_place
else fail hard_output_dev_stdout_in_place "$(head -c 300 err)"; fi
# -o -: the plan on stdout, the report on stderr
if "$DHP" plan $TINY --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o - >out 2>err \
   && $PY -c "import json,sys; assert json.load(open('out'))['schema']=='dhp.plan/1'" && grep -q 'wrote the plan to stdout' err
then ok hard_output_dash_is_stdout; else fail hard_output_dash_is_stdout "$(head -c 300 err)"; fi
# a missing output directory is found before the search
expect_err hard_output_missing_dir_found_first 'missing/p.json: cannot write in missing: No such file' \
    "$DHP" plan -o missing/p.json
# a symbolic link stays one: the file it names is replaced
ln -s real.json link.json && echo old >real.json
if "$DHP" plan $TINY --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o link.json >/dev/null 2>err && [ -L link.json ] \
   && grep -q dhp.plan real.json; then ok hard_output_symlink_kept
else fail hard_output_symlink_kept "$(head -c 300 err)"; fi
