#!/usr/bin/env bash
# dhp simulate: a plan file written by dhp plan is simulated to the step the
# planner recorded, re-priced on another cluster, traced; bad input exits 2.
. "$(dirname "$0")/lib.sh"
cd "$T"

# Two GPUs of one node: the disaggregated plans are 1 + 1 GPU, which the schedule runs.
cat >"$T/two.json" <<'JSON'
{"schema": "dhp.cluster/1", "name": "two", "pools": [{"name": "p", "gpu": "H100-SXM-80GB", "nodes": 1, "gpus_per_node": 2,
 "intra": {"busbw": 3.6e11, "alpha_s": 1e-5}, "inter": {"busbw": 4e10, "alpha_s": 1e-5}}]}
JSON
sed 's/"name": "two"/"name": "slow"/; s/"busbw": 3.6e11/"busbw": 1e7/' "$T/two.json" >"$T/slow.json"
sed 's/"name": "two"/"name": "one"/; s/"gpus_per_node": 2/"gpus_per_node": 1/' "$T/two.json" >"$T/one.json"
W="--model tiny-vl --vision-tokens 1024 --text-tokens 64 --batch 8"

if "$DHP" plan $W --cluster "$T/two.json" --placement disaggregated --top 0 --no-baselines -o "$T/p.json" >"$T/out" 2>"$T/err"; then
    ok simulate_plan_written
else fail simulate_plan_written "$(head -c 300 "$T/err")"; fi

if "$DHP" simulate "$T/p.json" >"$T/out" 2>"$T/err" && grep -q '^simulated step' "$T/out" \
   && grep -q '^critical path' "$T/out" && grep -qE '^ +1 llm ' "$T/out"; then ok simulate_text_report
else fail simulate_text_report "$(head -c 300 "$T/err") $(head -c 300 "$T/out")"; fi

# the planner recorded the simulated step; simulating the file gives it back,
# and the trace has one complete event per op
if "$DHP" simulate "$T/p.json" --json --trace "$T/trace.json" >"$T/sim.json" 2>"$T/err" \
   && /usr/bin/python3 - "$T/p.json" "$T/sim.json" "$T/trace.json" <<'PY' 2>>"$T/err"
import json, sys
plan, sim, trace = (json.load(open(f)) for f in sys.argv[1:4])
pred = plan["prediction"]
assert pred["simulated"] is True, pred
assert abs(sim["step_time_s"] - pred["step_time_s"]) <= 1e-12 * pred["step_time_s"], (sim["step_time_s"], pred)
assert abs(sim["analytic_step_time_s"] - pred["analytic_step_time_s"]) <= 1e-12 * pred["step_time_s"]
assert len(sim["ranks"]) == 2 and sim["critical_path"][-1]["end_s"] == sim["step_time_s"]
for r in sim["ranks"]:
    assert abs(r["busy_s"] + r["comm_s"] + r["idle_s"] - sim["step_time_s"]) < 1e-12
    assert r["memory"]["total"] > r["memory"]["params"] > 0
x = [e for e in trace if e["ph"] == "X"]
assert len(x) == sum(r["ops"] for r in sim["ranks"]), (len(x), [r["ops"] for r in sim["ranks"]])
assert {e["pid"] for e in x} == {0, 1}
assert sum(1 for e in trace if e["ph"] == "M" and e["name"] == "process_name") == 2
PY
then ok simulate_json_matches_plan_and_trace
else fail simulate_json_matches_plan_and_trace "$(tail -c 400 "$T/err")"; fi

# re-pricing on a cluster with slow links makes the hand-offs, and the step, longer
if "$DHP" simulate "$T/p.json" --cluster "$T/slow.json" --json >"$T/slow_sim.json" 2>"$T/err" \
   && /usr/bin/python3 - "$T/sim.json" "$T/slow_sim.json" <<'PY' 2>>"$T/err"
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert b["cluster"] == "slow" and a["cluster"] == "two"
assert b["step_time_s"] > a["step_time_s"] * 1.5, (a["step_time_s"], b["step_time_s"])
PY
then ok simulate_reprices_on_another_cluster
else fail simulate_reprices_on_another_cluster "$(tail -c 400 "$T/err")"; fi

# a plan built from --strategy (4 ranks: vision dp 2, llm tp 2)
if "$DHP" simulate --model tiny-vl --strategy 'vision:gpus=2,dp=2;llm:gpus=2,tp=2,seqpar=0' --placement disaggregated \
      --n-micro 2 --batch 8 --vision-tokens 64 --text-tokens 16 --json >"$T/s4.json" 2>"$T/err" \
   && /usr/bin/python3 -c "
import json; d = json.load(open('$T/s4.json'))
assert d['world_size'] == 4 and d['chunks'] == 2 and d['step_time_s'] > 0
assert sorted(m for r in d['ranks'] for m in r['modules']) == ['llm', 'llm', 'vision', 'vision']" 2>>"$T/err"; then
    ok simulate_strategy
else fail simulate_strategy "$(tail -c 400 "$T/err")"; fi

# ranks that print the same row are one line (a data-parallel group: 0-7), ranks that differ keep
# their own (the pipeline's first stage, its last stage holding the logits)
if "$DHP" simulate $W --cluster 8xh100 --strategy 'vision:gpus=8;llm:gpus=8' >"$T/out" 2>"$T/err" \
   && [ "$(sed -n '/^per rank/,/^$/p' "$T/out" | grep -cE '^ +[0-9]')" = 1 ] && grep -qE '^ +0-7 vision\+llm ' "$T/out" \
   && "$DHP" simulate $W --cluster 8xh100 --strategy 'vision:gpus=8;llm:gpus=8,pp=2' >"$T/out2" 2>>"$T/err" \
   && grep -qE '^ +0 vision\+llm ' "$T/out2" && grep -qE '^ +4-7 vision\+llm ' "$T/out2"; then ok simulate_same_ranks_one_line
else fail simulate_same_ranks_one_line "$(head -c 300 "$T/err") $(sed -n '/^per rank/,/^$/p' "$T/out" "$T/out2" | head -c 900)"; fi

# the Megatron target's gradient all-reduce overlaps the last backward (its buckets): the simulated
# GRAD_SYNC charges what the closed form leaves exposed, so the two agree (Llama 3 8B, dp 8; the
# simulator charged the whole all-reduce after the backward before: +7.9%)
cat >"$T/l8b.json" <<'JSON'
{"schema": "dhp.model/1", "name": "llama3-8b", "modules": [{"name": "llm", "kind": "llm", "layers": 32, "hidden": 4096,
 "heads": 32, "kv_heads": 8, "ffn": 14336, "ffn_kind": "swiglu", "norm": "rmsnorm", "vocab": 128256, "tied_embeddings": false}]}
JSON
if "$DHP" simulate --model "$T/l8b.json" --cluster 8xh100 --batch 8 --text-tokens 4096 --target megatron \
       --strategy 'llm:dp=8,rc=full' --json >"$T/m.json" 2>"$T/err" \
   && /usr/bin/python3 -c "
import json; d = json.load(open('$T/m.json'))
assert abs(d['step_time_s'] / d['analytic_step_time_s'] - 1) < 0.005, (d['step_time_s'], d['analytic_step_time_s'])" 2>>"$T/err"
then ok simulate_megatron_overlapped_grad_sync
else fail simulate_megatron_overlapped_grad_sync "$(tail -c 300 "$T/err")"; fi

# the Megatron target's stage hops: each receive waits out its transfer (the exchange is waited before
# the next compute, as the closed form paces the stages), so none is free even where the message came
# early (Llama 2 13B, pp 4 x vp 10 over two nodes: 9,320 of 9,984 receives took no time before)
cat >"$T/l13b.json" <<'JSON'
{"schema": "dhp.model/1", "name": "llama2-13b", "modules": [{"name": "llm", "kind": "llm", "layers": 40, "hidden": 5120,
 "heads": 40, "kv_heads": 40, "ffn": 13824, "ffn_kind": "swiglu", "norm": "rmsnorm", "vocab": 32000, "tied_embeddings": false}]}
JSON
if "$DHP" simulate --model "$T/l13b.json" --cluster 2x8xh100 --batch 128 --text-tokens 4096 --target megatron \
       --strategy 'llm:pp=4,vp=10,dp=4' --trace "$T/hops.json" >"$T/out" 2>"$T/err" \
   && /usr/bin/python3 -c "
import json; d = json.load(open('$T/hops.json')); ev = d['traceEvents'] if isinstance(d, dict) else d
r = [e['dur'] for e in ev if e.get('ph') == 'X' and e['name'].startswith('recv_stage')]
assert len(r) > 1000 and min(r) > 50, (len(r), min(r))" 2>>"$T/err"
then ok simulate_megatron_receives_wait_their_transfer
else fail simulate_megatron_receives_wait_their_transfer "$(tail -c 300 "$T/err")"; fi

# bad input: one line, exit 2
expect_err simulate_needs_a_plan "plan file or --strategy" "$DHP" simulate
expect_err simulate_missing_file "nofile.json" "$DHP" simulate "$T/nofile.json"
expect_err simulate_unknown_option "unknown option" "$DHP" simulate "$T/p.json" --frobnicate
expect_err simulate_bad_cluster "not found|unknown|no cluster" "$DHP" simulate "$T/p.json" --cluster 3xfoo
expect_err simulate_cluster_too_small "does not fit cluster 'one'" "$DHP" simulate "$T/p.json" --cluster "$T/one.json"
# a pipelined LLM: its stages hand each micro-batch on and its gradient back
if "$DHP" simulate $W --cluster "$T/two.json" --strategy 'vision:dp=2;llm:pp=2' >"$T/out" 2>"$T/err" \
   && grep -qE '^ +1 recv_stage llm ' "$T/out" && grep -qE '^ +0 recv_stage_grad llm ' "$T/out"; then ok simulate_pipeline_stages
else fail simulate_pipeline_stages "$(head -c 300 "$T/err") $(head -c 600 "$T/out")"; fi
expect_err simulate_split_must_hold_the_blocks "the stages hold 3 blocks" "$DHP" simulate $W --cluster "$T/two.json" --strategy 'vision:dp=2;llm:split=2:1'
expect_err simulate_bad_strategy "unknown key" "$DHP" simulate --model tiny-vl --strategy 'llm:tq=2'
expect_err simulate_trace_unwritable "cannot create|No such file" "$DHP" simulate "$T/p.json" --trace /nonexistent-dir/t.json
if ls "$T" | grep -q 'tmp\.'; then fail simulate_no_partial_output "a temp file was left behind"; else ok simulate_no_partial_output; fi
