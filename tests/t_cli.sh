#!/usr/bin/env bash
# CLI behaviour: the main jobs run, bad input gives one clear line and exit 2,
# and no partial output file is left behind.
. "$(dirname "$0")/lib.sh"
cd "$T"

expect_exit cli_help 0 "$DHP" --help
expect_err cli_unknown_command "unknown command 'frobnicate'" "$DHP" frobnicate

# plan on the built-in default writes a readable plan
if "$DHP" plan --top 1 -o "$T/p.json" >"$T/out" 2>"$T/err" && grep -qE '"schema":[[:space:]]*"dhp.plan/1"' "$T/p.json" \
   && grep -q 'chosen plan' "$T/out" && grep -q 'zero3' "$T/out"; then ok cli_plan_default
else fail cli_plan_default "$(head -c 400 "$T/err")"; fi

# the plan file is a valid input for memory, and round-trips as JSON
if "$DHP" memory "$T/p.json" >"$T/out" 2>"$T/err" && grep -qE '^(FITS|OOM)' "$T/out"; then ok cli_memory_of_plan_file
else fail cli_memory_of_plan_file "$(head -c 400 "$T/err")"; fi

if "$DHP" memory --baseline zero3 --vision-tokens 65536 --batch 8 --check >"$T/out" 2>&1; then
    fail cli_memory_check_exits_1_on_oom "zero3 at 65536 tokens reported as fitting"
elif [ $? = 1 ] && grep -q '^OOM by' "$T/out"; then ok cli_memory_check_exits_1_on_oom
else fail cli_memory_check_exits_1_on_oom "$(head -c 300 "$T/out")"; fi

# beside an OOM verdict, the least recomputation that fits: Llama 3 8B at 64k tokens keeping every
# activation is over 80 GB; the text names rc_layers, --json the same plan
cat >"$T/l8.json" <<'EOF'
{"schema": "dhp.model/1", "name": "llama3-8b", "modules": [{"name": "llm", "kind": "llm", "layers": 32, "hidden": 4096,
 "heads": 32, "kv_heads": 8, "ffn": 14336, "ffn_kind": "swiglu", "norm": "rmsnorm", "vocab": 128256}]}
EOF
l8=(--model "$T/l8.json" --cluster 8xh100 --batch 16 --text-tokens 65536 --strategy 'llm:tp=2,sp=4,zero=3,rc=none')
if "$DHP" memory "${l8[@]}" >"$T/out" 2>"$T/err" && grep -q '^OOM by' "$T/out" \
   && grep -qE '^fits with llm: rc=full,rc_layers=[0-9]+ \(the least recomputation that fits' "$T/out" \
   && "$DHP" memory "${l8[@]}" --json >"$T/outj" 2>>"$T/err" \
   && /usr/bin/python3 -c "import json,re,sys; d=json.load(open('$T/outj')); f=d['fits_with']; n=int(re.search(r'rc_layers=(\d+)', open('$T/out').read()).group(1)); assert not d['fits'] and f['modules']==[{'module': 'llm', 'recompute': 'full', 'recompute_layers': n}] and f['peak_bytes']<=d['capacity_bytes'], f" 2>>"$T/err"; then
    ok cli_memory_oom_names_the_least_recomputation_that_fits
else fail cli_memory_oom_names_the_least_recomputation_that_fits "$(head -c 400 "$T/out" "$T/err")"; fi
# and beside FITS, where the plan recomputes every block, the same count: recomputing less also fits
n=$(sed -n 's/^fits with llm: rc=full,rc_layers=\([0-9]*\) .*/\1/p' "$T/out")
l8[9]='llm:tp=2,sp=4,zero=3,rc=full'
if [ -n "$n" ] && "$DHP" memory "${l8[@]}" >"$T/out2" 2>"$T/err" && grep -q '^FITS' "$T/out2" \
   && grep -q "^fits recomputing less, with llm: rc=full,rc_layers=$n (the least recomputation that fits" "$T/out2"; then
    ok cli_memory_fits_names_the_least_recomputation_that_fits
else fail cli_memory_fits_names_the_least_recomputation_that_fits "$(tail -c 400 "$T/out2") $(head -c 200 "$T/err")"; fi

if "$DHP" memory --strategy 'vision:sp=8,rc=full;llm:tp=8,rc=full' --json >"$T/out" 2>"$T/err" \
   && /usr/bin/python3 -c "import json,sys; d=json.load(open('$T/out')); assert d['fits'] in (True, False); assert len(d['modules'])==2" 2>>"$T/err"; then
    ok cli_memory_strategy_json
else fail cli_memory_strategy_json "$(head -c 400 "$T/err")"; fi

# a pipelined module's figures are its busiest stage's, which memory names (text and --json): with one
# micro-batch every stage holds one, and the last also the head and its logits
l8p=(--model "$T/l8p.json" --text-tokens 4096 --target megatron --strategy 'llm:tp=2,pp=4' --batch 1)
printf '%s' '{"schema": "dhp.model/1", "name": "l8", "modules": [{"name": "llm", "kind": "llm", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "ffn_kind": "swiglu", "vocab": 128256}]}' > "$T/l8p.json"
if "$DHP" memory "${l8p[@]}" >"$T/out" 2>"$T/err" && grep -q '^  llm: pipeline stage 3 of 4, the busiest' "$T/out" \
   && "$DHP" memory "${l8p[@]}" --json >"$T/outj" 2>>"$T/err" \
   && /usr/bin/python3 -c "import json; d=json.load(open('$T/outj')); assert d['modules'][0]['stage'] == 3, d['modules'][0]" 2>>"$T/err"; then
    ok cli_memory_names_the_busiest_pipeline_stage
else fail cli_memory_names_the_busiest_pipeline_stage "$(tail -c 300 "$T/out") $(head -c 300 "$T/err")"; fi

# where the step goes: printed under the plan, and in --json each module's parts add up to
# its total, the totals (colocated) to the analytic step
if "$DHP" plan --strategy 'vision:sp=4,rc=full;llm:tp=4,pp=2,mb=2' --json -o "$T/ps.json" >"$T/out" 2>"$T/err" \
   && /usr/bin/python3 - "$T/out" <<'PY' 2>>"$T/err" \
   && "$DHP" memory "$T/ps.json" >"$T/txt" 2>>"$T/err" && grep -q 'where the step goes' "$T/txt" && grep -q 'bubble' "$T/txt"
import json, sys
d = json.load(open(sys.argv[1]))
parts = d["step_parts"]
assert [p["module"] for p in parts] == ["vision", "llm"], parts
for p in parts:
    s = sum(v for k, v in p.items() if k.endswith("_s") and k != "total_s")
    assert abs(s - p["total_s"]) <= 1e-9 * p["total_s"], (s, p["total_s"])
step = d["prediction"]["analytic_step_time_s"]
assert abs(sum(p["total_s"] for p in parts) - step) <= 1e-9 * step, (parts, step)
assert parts[1]["pipeline_bubble_s"] > 0 and parts[1]["gemm_s"] > 0
PY
then ok cli_plan_step_parts; else fail cli_plan_step_parts "$(head -c 400 "$T/err")"; fi

if "$DHP" plan --compare --json --grid 1024:8,65536:2 -o - >"$T/out" 2>"$T/err" \
   && /usr/bin/python3 - "$T/out" <<'PY' 2>>"$T/err"
import json, sys
rows = json.load(open(sys.argv[1]))
assert [r["vision_tokens"] for r in rows] == [1024, 65536]
names = [s["strategy"] for s in rows[1]["strategies"]]
assert names == ["zero3", "tp", "sp-tp", "dhp"], names
z = rows[1]["strategies"][0]
assert z["fits"] is False, "zero3 should not fit at 65536"
PY
then ok cli_plan_compare_json; else fail cli_plan_compare_json "$(head -c 400 "$T/err")"; fi

# bad input: one line, exit 2, naming the problem
expect_err cli_bad_preset "unknown|not found|no cluster" "$DHP" plan --cluster 3xfoo
expect_err cli_bad_model "no-such-model.*not a zoo model" "$DHP" plan --model no-such-model
expect_err cli_bad_batch "--batch" "$DHP" plan --batch 0
expect_err cli_bad_batch_text "--batch" "$DHP" plan --batch eight
# an enum option's message lists its choices from the one table that parses it (util_name_index)
expect_err cli_bad_zero3_names_the_choices "--zero3: 'bogus' is not units, deepspeed-2021 or fsdp2" "$DHP" plan --zero3 bogus
expect_err cli_bad_recompute_names_the_choices "--strategy: rc: 'lots' is not none, selective, full or op" \
    "$DHP" plan --strategy "vision:rc=lots;llm:tp=8"
expect_err cli_bad_baseline_names_the_choices "--baseline: 'zz' is not zero3, tp, homogeneous or sp-tp" "$DHP" memory --baseline zz
expect_err cli_bad_tokens "merge|multiple" "$DHP" plan --vision-tokens 1023
expect_err cli_bad_image_size "image-size" "$DHP" plan --image-size 100
expect_err cli_bad_option "unknown option" "$DHP" plan --frobnicate
expect_err cli_bad_placement "placement" "$DHP" plan --placement sideways
expect_err cli_bad_strategy_key "unknown key" "$DHP" memory --strategy 'llm:tq=8'
expect_err cli_bad_strategy_module "no module" "$DHP" memory --strategy 'eye:tp=8'
expect_err cli_bad_strategy_degree "divide" "$DHP" memory --strategy 'llm:tp=3'
expect_err cli_bad_strategy_cp "cp=p2p: ulysses, ring or auto" "$DHP" memory --strategy 'llm:sp=2,cp=p2p'
expect_err cli_strategy_cp_needs_sp "llm: cp=ring says how sp ranks attend across the sequence: it needs sp > 1" \
    "$DHP" memory --strategy 'llm:tp=2,cp=ring'

printf '{"schema": "dhp.model/1", "name": "x", "modules": [\n{"name": "llm", "kind": "llm", "layers": 2, "hidden": 64, "heads": 7, "ffn": 128, "vocab": 100}]}\n' >"$T/bad_heads.json"
expect_err cli_model_heads_not_dividing "heads" "$DHP" plan --model "$T/bad_heads.json" -o "$T/never.json"
printf '{"schema": "dhp.model/1", "name": "x", "modules": [ {"name": "llm", ' >"$T/trunc.json"
expect_err cli_model_malformed_json "line 1" "$DHP" plan --model "$T/trunc.json" -o "$T/never.json"
printf '{"schema": "dhp.cluster/1", "name": "c", "pools": [{"name": "p", "gpu": "H100-SXM-80GB", "nodes": 0, "gpus_per_node": 8}]}\n' >"$T/c0.json"
expect_err cli_cluster_zero_nodes "nodes" "$DHP" plan --cluster "$T/c0.json" -o "$T/never.json"
printf '{"schema": "dhp.cluster/1", "name": "tiny", "pools": [{"name": "p", "gpu": "L40S", "nodes": 1, "gpus_per_node": 1, "intra": {"busbw": 1e10, "alpha_s": 1e-5}, "inter": {"busbw": 1e10, "alpha_s": 1e-5}}]}\n' >"$T/c1.json"
expect_err cli_model_fits_nowhere "fits" "$DHP" plan --model qwen2.5-vl-72b --cluster "$T/c1.json" -o "$T/never.json"
if [ -e "$T/never.json" ] || ls "$T" | grep -q 'tmp\.'; then fail cli_no_partial_output "a file was left behind"; else ok cli_no_partial_output; fi
expect_err cli_plan_file_missing "nofile.json" "$DHP" memory "$T/nofile.json"
printf '{"schema": "dhp.plan/9"}' >"$T/badplan.json"
expect_err cli_plan_file_bad_schema "schema" "$DHP" memory "$T/badplan.json"
expect_err cli_plan_unwritable "cannot create|No such file" "$DHP" plan --top 0 --no-baselines -o /nonexistent-dir/p.json
expect_err cli_grad_reduce_bf16_needs_the_megatron_target 'grad-reduce bf16 describes a plan exported to PyTorch FSDP .*dhp run reduces its gradients in fp32' \
    "$DHP" plan --target dhp --grad-reduce bf16 --no-baselines -o "$T/never.json"
expect_err cli_optim_dtype_bf16_needs_the_megatron_target "optim-dtype bf16 describes a plan exported to Apex's DistributedFusedAdam .*dhp run keeps fp32 AdamW states" \
    "$DHP" plan --target dhp --optim-dtype bf16 --no-baselines -o "$T/never.json"
expect_err cli_optim_dtype_bf16_needs_bf16_weights "optim-dtype bf16 keeps the master weights in the bf16 weights' own dtype: use --precision bf16-mixed" \
    "$DHP" plan --target megatron --precision bf16-autocast --optim-dtype bf16 --no-baselines -o "$T/never.json"
expect_err cli_pipe_engine_deepspeed_needs_the_megatron_target "pipe-engine deepspeed describes a plan exported to DeepSpeed's pipeline engine" \
    "$DHP" plan --target dhp --pipe-engine deepspeed --no-baselines -o "$T/never.json"
expect_err cli_grad_accum_add_needs_the_megatron_target "grad-accum add describes a plan exported to another trainer" \
    "$DHP" plan --target dhp --grad-accum add --no-baselines -o "$T/never.json"
expect_err cli_pipe_engine_deepspeed_refuses_interleaving "has no interleaved schedule" \
    "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --target megatron --pipe-engine deepspeed-2021 --gpus 8 \
    --strategy "vision:dp=8;llm:pp=2,dp=4,vp=2" --no-baselines -o "$T/never.json"
expect_err cli_pipe_engine_deepspeed_refuses_zero2_on_stages "ZeRO-2 beside pp 2: DeepSpeed's pipeline engine \(deepspeed\) refuses ZeRO-2 and -3 with pipeline stages" \
    "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --target megatron --pipe-engine deepspeed --gpus 8 \
    --strategy "vision:dp=8;llm:pp=2,dp=4,zero=2" --no-baselines -o "$T/never.json"

# FP8 linears: the Megatron target only, on GPUs with FP8; a plan made with them says so under its table,
# keeps the recipe in its file, and dhp run refuses it (Megatron-LM's kernels, not dhp run's)
# step_faster A B: plan file A's predicted step is shorter than plan file B's
step_faster() {
    python3 -c 'import json, sys; a, b = (json.load(open(p))["prediction"]["step_time_s"] for p in sys.argv[1:3]); assert a < b, (a, b)' "$1" "$2"
}
expect_err cli_fp8_needs_the_megatron_target "--fp8 delayed describes a plan exported to TransformerEngine" \
    "$DHP" plan --fp8 delayed --no-baselines -o "$T/never.json"
expect_err cli_fp8_needs_fp8_tensor_cores "--fp8: pool a100's A100-SXM-80GB has no FP8 tensor cores" \
    "$DHP" plan --cluster 8xa100-80g --target megatron --fp8 torchao --no-baselines -o "$T/never.json"
expect_err cli_fp8_names_the_recipes "--fp8: 'e4m3' is not none, delayed, tensorwise or torchao" \
    "$DHP" plan --target megatron --fp8 e4m3 -o "$T/never.json"
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --fp8 tensorwise --gpus 8 \
        --strategy "vision:dp=8;llm:tp=2,dp=4,zero=1" --no-baselines -o "$T/f8.json" >"$T/out" 2>"$T/err" &&
   "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --gpus 8 \
        --strategy "vision:dp=8;llm:tp=2,dp=4,zero=1" --no-baselines -o "$T/b16.json" >"$T/out16" 2>>"$T/err" &&
   grep -q "fp8 tensorwise: the blocks' linears in FP8 (TransformerEngine, current scaling" "$T/out" &&
   grep -qE '"fp8":[[:space:]]*"tensorwise"' "$T/f8.json" &&
   "$DHP" simulate "$T/f8.json" --json >"$T/sim" 2>>"$T/err" && "$DHP" memory "$T/f8.json" >"$T/mem" 2>>"$T/err" &&
   step_faster "$T/f8.json" "$T/b16.json"
then
    "$DHP" data synth --out "$T/d8" --samples 16 --window 0 >/dev/null 2>&1
    # dhp run starts MPI before it reads the plan: Open MPI's own allocations under the ASan build
    expect_err cli_fp8_plan_is_not_run "target megatron prices Megatron-LM" \
        env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$DHP" run "$T/f8.json" --data "$T/d8" --steps 1
    ok cli_fp8_plan_simulate_memory
else fail cli_fp8_plan_simulate_memory "$(head -c 400 "$T/err")"; fi

# TransformerEngine's TP overlap: the Megatron target only; the plan names the modules it applies to (seqpar over
# tp > 1), keeps it in the file and prices it faster; simulate and memory read it back
expect_err cli_tp_comm_overlap_needs_the_megatron_target "tp-comm-overlap describes a plan exported to Megatron-LM" \
    "$DHP" plan --tp-comm-overlap --no-baselines -o "$T/never.json"
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --tp-style dtensor --tp-comm-overlap \
        --gpus 8 --strategy "vision:dp=8;llm:tp=4,dp=2,zero=1,seqpar=1" --no-baselines -o "$T/atp.json" >"$T/out" \
        2>"$T/err" && grep -q "tp comm overlap (torchtitan's async TP; TP comm is what the GEMMs leave exposed): llm" \
        "$T/out"; then ok cli_tp_comm_overlap_async_tp_under_dtensor
else fail cli_tp_comm_overlap_async_tp_under_dtensor "$(head -c 300 "$T/err") $(head -c 300 "$T/out")"; fi
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --tp-comm-overlap --gpus 8 \
        --strategy "vision:dp=8;llm:tp=4,dp=2,zero=1,seqpar=1" --no-baselines -o "$T/ub.json" >"$T/out" 2>"$T/err" &&
   "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --gpus 8 \
        --strategy "vision:dp=8;llm:tp=4,dp=2,zero=1,seqpar=1" --no-baselines -o "$T/noub.json" >/dev/null 2>>"$T/err" &&
   grep -q "tp comm overlap (TransformerEngine's userbuffers; TP comm is what the GEMMs leave exposed): llm" \
        "$T/out" &&
   grep -qE '"tp_comm_overlap":[[:space:]]*true' "$T/ub.json" && ! grep -q tp_comm_overlap "$T/noub.json" &&
   "$DHP" simulate "$T/ub.json" >"$T/sim" 2>>"$T/err" && grep -q "tp comm overlap" "$T/sim" &&
   "$DHP" memory "$T/ub.json" >/dev/null 2>>"$T/err" &&
   step_faster "$T/ub.json" "$T/noub.json"
then ok cli_tp_comm_overlap_plan
else fail cli_tp_comm_overlap_plan "$(head -c 400 "$T/err") $(head -c 300 "$T/out")"; fi

# The cross-entropy a Megatron-target plan's trainer runs: kept in the plan file, read back by dhp memory, whose logits
# term it sets (flash-attn's fused loss holds less than Megatron's vocab-parallel one); the dhp target refuses it
expect_err cli_loss_needs_the_megatron_target "loss fused describes a plan exported to another trainer's cross-entropy" \
    "$DHP" plan --loss fused --no-baselines -o "$T/never.json"
expect_err cli_loss_names_the_kernels "--loss: 'xent' is not auto, vocab-parallel, torch or fused" \
    "$DHP" plan --target megatron --loss xent -o "$T/never.json"
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --loss fused --gpus 8 \
        --strategy "vision:dp=8;llm:dp=8,zero=1" --no-baselines -o "$T/lf.json" >/dev/null 2>"$T/err" &&
   "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --gpus 8 \
        --strategy "vision:dp=8;llm:dp=8,zero=1" --no-baselines -o "$T/lv.json" >/dev/null 2>>"$T/err" &&
   grep -qE '"loss":[[:space:]]*"fused"' "$T/lf.json" && ! grep -q '"loss"' "$T/lv.json" &&
   "$DHP" memory "$T/lf.json" --json >"$T/mf" 2>>"$T/err" && "$DHP" memory "$T/lv.json" --json >"$T/mv" 2>>"$T/err" &&
   python3 - "$T/mf" "$T/mv" <<'PY'
import json, sys
def logits(p):
    d = json.load(open(p))
    return [m for m in d["modules"] if m["module"] == "llm"][0]["logits"]
f, v = logits(sys.argv[1]), logits(sys.argv[2])
assert 0 < f < v and abs(f / v - 4 / 6) < 1e-6, (f, v)
PY
then ok cli_loss_plan_memory
else fail cli_loss_plan_memory "$(head -c 400 "$T/err")"; fi

# cuDNN's fused attention (TransformerEngine's on Hopper): the Megatron target only, on GPUs whose file measures it;
# kept in the plan file and priced faster than FlashAttention-2
expect_err cli_attention_cudnn_needs_the_megatron_target "attention cudnn describes a plan exported to TransformerEngine" \
    "$DHP" plan --attention cudnn --no-baselines -o "$T/never.json"
expect_err cli_attention_cudnn_needs_its_figure "--attention cudnn: pool a100's A100-SXM-80GB has no measured cuDNN attention" \
    "$DHP" plan --cluster 8xa100-80g --target megatron --attention cudnn --no-baselines -o "$T/never.json"
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --attention cudnn --gpus 8 \
        --strategy "vision:dp=8;llm:dp=8,zero=1" --no-baselines -o "$T/cu.json" >"$T/out" 2>"$T/err" &&
   grep -q "attention cudnn: cuDNN's fused attention" "$T/out" && grep -qE '"attention":[[:space:]]*"cudnn"' "$T/cu.json" &&
   "$DHP" simulate "$T/cu.json" >/dev/null 2>>"$T/err" &&
   step_faster "$T/cu.json" "$T/lv.json"
then ok cli_attention_cudnn_plan
else fail cli_attention_cudnn_plan "$(head -c 400 "$T/err") $(head -c 300 "$T/out")"; fi

# Interleaving up to 32 chunks a stage (NeMo's Llama 2 70B: pp 4 x vp 20, a layer a chunk), simulated; 33 refused
cat >"$T/llm28.json" <<'JSON'
{"schema": "dhp.model/1", "name": "llm28", "modules": [{"name": "llm", "kind": "llm", "layers": 28, "hidden": 1024,
 "heads": 16, "ffn": 4096, "ffn_kind": "swiglu", "norm": "rmsnorm", "vocab": 1000}]}
JSON
if "$DHP" plan --model "$T/llm28.json" --cluster 2x8xh100 --batch 32 --text-tokens 2048 --target megatron --gpus 16 \
        --strategy "llm:pp=4,vp=7,dp=4" --no-baselines -o "$T/vp7.json" >"$T/out" 2>"$T/err" &&
   "$DHP" simulate "$T/vp7.json" >"$T/sim" 2>>"$T/err" && grep -q "simulated step" "$T/sim"
then ok cli_interleaving_beyond_eight_chunks; else fail cli_interleaving_beyond_eight_chunks "$(head -c 300 "$T/err")"; fi
expect_err cli_interleaving_caps_at_32_chunks "vp 33 needs pp > 1 and at most 32 chunks a stage" \
    "$DHP" plan --model "$T/llm28.json" --cluster 2x8xh100 --batch 32 --text-tokens 2048 --target megatron --gpus 16 \
    --strategy "llm:pp=4,vp=33,dp=4" --no-baselines -o "$T/never.json"
