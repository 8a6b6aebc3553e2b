#!/usr/bin/env bash
# dhp export: the produced arguments and configs, checked by the trainers'
# own definitions (tests/check_export.py: Megatron-LM's argument names from
# its source, DeepSpeed's DeepSpeedConfig and torchtitan's ConfigManager from
# build/venv, which `make deps` creates), and the values for known plans.
. "$(dirname "$0")/lib.sh"
VPY="${DHP_VENV:-$PWD/build/venv}/bin/python"
CHECK="$(cd "$(dirname "$0")" && pwd)/check_export.py"
if [ ! -x "$VPY" ]; then fail export_venv "$VPY missing: run make deps (scripts/venv.sh)"; exit 0; fi

# Known plans: Qwen2.5-VL-32B on 8 GPUs (per-module strategies, colocated) and
# a disaggregated one with ZeRO-1, selective recompute and a pipelined LLM.
"$DHP" plan --model qwen2.5-vl-32b --batch 8 --vision-tokens 16384 \
    --strategy 'vision:sp=4,dp=2,zero=3,rc=full;llm:tp=2,sp=2,dp=2,zero=3,rc=full,seqpar=1' -o "$T/a.json" >/dev/null 2>"$T/err" ||
    fail export_plan_a "$(head -c 300 "$T/err")"
"$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
    --n-micro 4 --strategy 'vision:gpus=4,dp=4,zero=1,rc=selective,mb=2;llm:gpus=8,tp=2,pp=2,dp=2,zero=1,rc=selective,mb=1' \
    -o "$T/b.json" >/dev/null 2>"$T/err" || fail export_plan_b "$(head -c 300 "$T/err")"

for plan in a b; do
    for t in megatron deepspeed torchtitan; do
        name="export_${t}_$plan"
        if ! "$DHP" export --to "$t" "$T/$plan.json" --json -o "$T/$plan.$t.json" 2>"$T/err"; then
            fail "$name" "$(head -c 300 "$T/err")"; continue
        fi
        extra=()
        if [ "$t" = torchtitan ]; then
            "$DHP" export --to torchtitan "$T/$plan.json" -o "$T/$plan.toml" 2>"$T/err" || fail "$name-toml" "$(cat "$T/err")"
            extra=("$T/$plan.toml")
        fi
        if (cd "$T" && "$VPY" "$CHECK" "$t" "$T/$plan.$t.json" "${extra[@]}") >"$T/check" 2>&1; then ok "$name"
        else fail "$name" "$(grep -v -e WARNING -e 'HF assets' "$T/check" | head -c 400)"; fi
    done
done

# has VALUE-LIST FILE: each "--flag value" pair (or lone flag) appears in the args.
args_of() { "$VPY" -c 'import json,sys; print(" ".join(json.load(open(sys.argv[1]))["args"]))' "$1"; }
expect_args() {
    local name=$1 file=$2; shift 2
    local a; a=" $(args_of "$file") "
    for want in "$@"; do
        case "$a" in *" $want "*) ;; *) fail "$name" "missing '$want' in: $a"; return ;; esac
    done
    ok "$name"
}
expect_args export_megatron_values_a "$T/a.megatron.json" "--tensor-model-parallel-size 2" \
    "--context-parallel-size 2" "--cp-comm-type a2a" "--sequence-parallel" "--use-megatron-fsdp" \
    "--data-parallel-sharding-strategy optim_grads_params" "--micro-batch-size 1" "--global-batch-size 8" \
    "--recompute-granularity full" "--num-layers 64" "--num-query-groups 8" "--bf16" "--ckpt-format fsdp_dtensor" \
    "--position-embedding-type mrope" "--mrope-section 16 24 24" "--rotary-base 1000000" "--norm-epsilon 1e-06"
expect_args export_megatron_values_b "$T/b.megatron.json" "--tensor-model-parallel-size 2" \
    "--pipeline-model-parallel-size 2" "--use-distributed-optimizer" "--recompute-granularity selective" \
    "--global-batch-size 32"
# The LLM's context parallelism as ring attention (--strategy cp=ring): Megatron's p2p communication,
# DeepSpeed's Ulysses-only sequence parallelism and torchtitan's ring said in the notes
ring_exports() {
    "$DHP" plan --model qwen2.5-vl-32b --batch 8 --vision-tokens 16384 \
        --strategy 'vision:sp=4,dp=2,zero=3,rc=full;llm:tp=2,sp=2,cp=ring,dp=2,zero=3,rc=full,seqpar=1' -o "$T/r.json" >/dev/null || return 1
    local t x
    for t in megatron deepspeed torchtitan; do "$DHP" export --to $t "$T/r.json" --json -o "$T/r.$t.json" || return 1; done
    for x in r.deepspeed r.torchtitan a.torchtitan; do
        "$VPY" -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1])).get("notes", [])))' "$T/$x.json" >"$T/$x.notes" || return 1
    done
    grep -q "sp 2 priced as ring attention; DeepSpeed's sequence parallelism is Ulysses" "$T/r.deepspeed.notes" &&
        ! grep -q "Ulysses" "$T/r.torchtitan.notes" && grep -q "not the Ulysses all-to-all priced" "$T/a.torchtitan.notes"
}
if ring_exports 2>"$T/err"; then
    expect_args export_megatron_ring_is_p2p "$T/r.megatron.json" "--context-parallel-size 2" "--cp-comm-type p2p"
else fail export_ring_notes "$(head -c 300 "$T/err")"; fi
# The LLM's pipeline split in Megatron-LM's arguments (each a name of core_v0.15.0's parser): 28 layers
# interleaved over 2 x 3 chunks with the embedding and the loss a layer each (split=ends), and dhp's own
# 9 + 10 + 9 over 3 stages as the first and the last stage's layers, 14 + 14 as Megatron's own even
# split (no split argument), and 7 a stage over 4 x 2 chunks (4 + 3 a stage, which Megatron's
# uneven arguments cannot say: it splits a stage evenly over its chunks) stage by stage
for x in "c pp=2,vp=3,split=ends 8 2" "d pp=3 12 2" "e pp=2 8 2" "f pp=4,vp=2 8 1"; do
    set -- $x
    "$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
        --n-micro 4 --strategy "vision:gpus=4,dp=4,mb=2;llm:gpus=$3,tp=2,$2,dp=$4,mb=1" -o "$T/$1.json" >/dev/null 2>"$T/err" &&
        "$DHP" export --to megatron "$T/$1.json" --json -o "$T/$1.megatron.json" 2>>"$T/err" &&
        (cd "$T" && "$VPY" "$CHECK" megatron "$T/$1.megatron.json") >"$T/check" 2>&1 ||
        fail "export_megatron_split_$1" "$(cat "$T/err" "$T/check" 2>/dev/null | head -c 400)"
done
expect_args export_megatron_split_ends "$T/c.megatron.json" "--pipeline-model-parallel-size 2" \
    "--num-virtual-stages-per-pipeline-rank 3" "--account-for-embedding-in-pipeline-split" "--account-for-loss-in-pipeline-split"
expect_args export_megatron_split_uneven "$T/d.megatron.json" "--pipeline-model-parallel-size 3" \
    "--decoder-first-pipeline-num-layers 9" "--decoder-last-pipeline-num-layers 9"
# The layout read as Megatron-LM reads it (PipelineParallelLayerLayout.parse_str_to_list: "(X)*n" and
# "x*n" unrolled, commas dropped, stages split at '|'), and the even split left to Megatron
if "$VPY" - "$T/e.megatron.json" "$T/f.megatron.json" <<'PY' >"$T/v" 2>&1; then ok export_megatron_split_layout; else fail export_megatron_split_layout "$(cat "$T/v")"; fi
import json, re, sys
e, f = (json.load(open(p))["args"] for p in sys.argv[1:3])
assert not [a for a in e if "pipeline-num-layers" in a or "layout" in a], e
lay = f[f.index("--pipeline-model-parallel-layout") + 1].replace(",", "")
for pat in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
    lay = re.sub(pat, lambda m: m.group(1) * int(m.group(2)), lay)
stages = lay.split("|")
assert stages == ["E" + "t" * 4] + ["t" * 4] * 3 + ["t" * 3] * 3 + ["t" * 3 + "L"], stages
assert "--num-virtual-stages-per-pipeline-rank" not in f, f   # Megatron takes the layout alone
PY
# The same split for torchtitan (its ConfigManager reads the TOML): Interleaved1F1B over the 6 model
# chunks, each chunk's modules as dhp splits them, the dp rank's whole batch in one pipeline pass
# of micro-batches of 1; DeepSpeed's config says what it cannot take
if "$DHP" export --to torchtitan "$T/c.json" --json -o "$T/c.torchtitan.json" 2>"$T/err" &&
   "$DHP" export --to torchtitan "$T/c.json" -o "$T/c.toml" 2>>"$T/err" &&
   "$DHP" export --to deepspeed "$T/c.json" --json -o "$T/c.deepspeed.json" 2>>"$T/err" &&
   (cd "$T" && "$VPY" "$CHECK" torchtitan "$T/c.torchtitan.json" "$T/c.toml") >"$T/check" 2>&1 &&
   "$VPY" - "$T/c.torchtitan.json" "$T/c.deepspeed.json" <<'PY' >"$T/v" 2>&1; then ok export_torchtitan_split_ends; else fail export_torchtitan_split_ends "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
t, d = (json.load(open(p)) for p in sys.argv[1:3])
par, tr = t["toml"]["parallelism"], t["toml"]["training"]
assert par["pipeline_parallel_schedule"] == "Interleaved1F1B" and par["pipeline_parallel_microbatch_size"] == 1, par
parts = par["module_fqns_per_model_part"]
assert len(parts) == 6 and parts[0][:2] == ["tok_embeddings", "layers.0"] and parts[-1][-2:] == ["norm", "output"], parts
assert [len([m for m in p if m.startswith("layers.")]) for p in parts] == [4, 5, 5, 5, 5, 4], parts
assert sum(parts, []).count("layers.27") == 1
assert tr["local_batch_size"] == 16 and tr["global_batch_size"] == 32, tr
assert any("vp 3 not exported" in n for n in d["notes"]) and any("split=ends" in n for n in d["notes"]), d["notes"]
PY
if "$VPY" - "$T/b.megatron.json" "$T/b.deepspeed.json" "$T/b.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_values_b; else fail export_values_b "$(cat "$T/v")"; fi
import json, sys
m, d, t = (json.load(open(p)) for p in sys.argv[1:4])
g = {s["name"]: s for s in m["mimo_module_grid_specs"]}
assert m["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, m["env"]   # validate_args: TP without FSDP, before Blackwell
assert g["vision"] == {"name": "vision", "num_ranks": 4, "tp": 1, "cp": 1, "pp": 1, "rank_offset": 8}, g
assert g["language"] == {"name": "language", "num_ranks": 8, "tp": 2, "cp": 1, "pp": 2, "rank_offset": 0}, g
mods = {x["module"]: x for x in d["modules"]}
assert mods["vision"]["config"]["zero_optimization"]["stage"] == 1
assert mods["vision"]["config"]["gradient_accumulation_steps"] == 32 // (2 * 4)
assert mods["llm"]["config"]["pipeline"]["stages"] == 2 and mods["llm"]["config"]["tensor_parallel"]["autotp_size"] == 2
assert mods["llm"]["data_parallel_size"] == 2 and mods["llm"]["config"]["gradient_accumulation_steps"] == 16
assert any("DeepSpeed's PipelineEngine blocks on each send" in n for n in d["notes"]), d["notes"]
tt = t["toml"]
assert tt["parallelism"]["data_parallel_shard_degree"] == 2 and tt["parallelism"]["fsdp_reshard_after_forward"] == "never"
assert tt["activation_checkpoint"]["mode"] == "selective" and tt["training"]["global_batch_size"] == 32
# pp 2: the dp rank's 16 samples in one pipeline pass of micro-batches of 1, 1F1B over 2 chunks
assert tt["training"]["local_batch_size"] == 16 and tt["parallelism"]["pipeline_parallel_schedule"] == "1F1B"
assert len(tt["parallelism"]["module_fqns_per_model_part"]) == 2
PY

# ZeRO-2 on pipeline stages (dhp runs it): DeepSpeed's PipelineEngine refuses ZeRO-2 and -3 there, so
# its config takes stage 1 and says so; Megatron FSDP writes its checkpoint format and notes that its
# guide does not name pipelines
if "$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
        --n-micro 4 --strategy 'vision:gpus=4,dp=4,mb=2;llm:gpus=8,tp=2,pp=2,dp=2,zero=2,mb=1' -o "$T/z.json" >/dev/null 2>"$T/err" &&
   "$DHP" export --to deepspeed "$T/z.json" --json -o "$T/z.deepspeed.json" 2>>"$T/err" &&
   "$DHP" export --to megatron "$T/z.json" --json -o "$T/z.megatron.json" 2>>"$T/err" &&
   (cd "$T" && "$VPY" "$CHECK" deepspeed "$T/z.deepspeed.json" && "$VPY" "$CHECK" megatron "$T/z.megatron.json") >"$T/check" 2>&1 &&
   "$VPY" - "$T/z.deepspeed.json" "$T/z.megatron.json" <<'PY' >"$T/v" 2>&1; then ok export_zero2_stages; else fail export_zero2_stages "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING | head -c 400)"; fi
import json, sys
d, m = (json.load(open(p)) for p in sys.argv[1:3])
llm = {x["module"]: x for x in d["modules"]}["llm"]["config"]
assert llm["zero_optimization"]["stage"] == 1 and llm["pipeline"]["stages"] == 2, llm
assert any("ZeRO-2 exported as stage 1" in n for n in d["notes"]), d["notes"]
a = " ".join(m["args"])
assert "--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads --ckpt-format fsdp_dtensor" in a, a
assert any("not pipelines" in n for n in m["notes"]) and "CUDA_DEVICE_MAX_CONNECTIONS" not in m["env"], m
PY

expect_err export_unknown_trainer "--to: 'nemo' is not megatron, deepspeed or torchtitan" "$DHP" export --to nemo "$T/a.json"
expect_err export_missing_plan "nofile.json" "$DHP" export --to megatron "$T/nofile.json"

# A disaggregated plan may split a chunk unevenly over dp (8 samples over 3):
# the trainers cannot express that.
if "$DHP" plan --model qwen2.5-vl-7b --batch 32 --n-micro 4 --vision-tokens 1024 --placement disaggregated \
        --strategy 'vision:gpus=2,dp=2;llm:gpus=6,tp=2,dp=3' -o "$T/c.json" >/dev/null 2>"$T/err"; then
    expect_err export_uneven_batch "c.json: module llm: global batch 32 is not a multiple of micro-batch 2 x dp 3" \
        "$DHP" export --to deepspeed "$T/c.json"
else fail export_uneven_batch "plan: $(head -c 300 "$T/err")"; fi

# export_checked STEM: the plan STEM.json exported to the three trainers (STEM.megatron.json,
# STEM.deepspeed.json, STEM.torchtitan.json and STEM.toml), each checked by the trainer's own definitions
export_checked() {
    "$DHP" export --to megatron "$1.json" --json -o "$1.megatron.json" 2>>"$T/err" &&
    "$DHP" export --to deepspeed "$1.json" --json -o "$1.deepspeed.json" 2>>"$T/err" &&
    "$DHP" export --to torchtitan "$1.json" --json -o "$1.torchtitan.json" 2>>"$T/err" &&
    "$DHP" export --to torchtitan "$1.json" -o "$1.toml" 2>>"$T/err" &&
    (cd "$T" && "$VPY" "$CHECK" megatron "$1.megatron.json" && "$VPY" "$CHECK" deepspeed "$1.deepspeed.json" &&
     "$VPY" "$CHECK" torchtitan "$1.torchtitan.json" "$1.toml") >"$T/check" 2>&1
}

# ZeRO-3 on pipeline stages (dhp runs it): DeepSpeed takes stage 1 as above; torchtitan reshards after every
# forward and says that its pipeline schedules keep each stage's whole gradients to the last backward; all
# three checked by the trainers' own definitions
if "$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
        --n-micro 4 --strategy 'vision:gpus=4,dp=4,mb=2;llm:gpus=8,tp=2,pp=2,dp=2,zero=3,mb=1' -o "$T/z3.json" >/dev/null 2>"$T/err" &&
   export_checked "$T/z3" &&
   "$VPY" - "$T/z3.deepspeed.json" "$T/z3.megatron.json" "$T/z3.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_zero3_stages; else fail export_zero3_stages "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
d, m, t = (json.load(open(p)) for p in sys.argv[1:4])
llm = {x["module"]: x for x in d["modules"]}["llm"]["config"]
assert llm["zero_optimization"]["stage"] == 1 and llm["pipeline"]["stages"] == 2, llm
assert any("ZeRO-3 exported as stage 1" in n for n in d["notes"]), d["notes"]
assert "--data-parallel-sharding-strategy optim_grads_params" in " ".join(m["args"]), m["args"]
p = t["toml"]["parallelism"]
assert p["fsdp_reshard_after_forward"] == "always" and p["pipeline_parallel_degree"] == 2, p
assert any("reduce-scatter FSDP2 gradients at each stage's last backward only" in n for n in t["notes"]), t["notes"]
PY

# Partial full recomputation (rc_layers=3 of each 7-block chunk: 28 layers over 2 stages x 2 chunks):
# Megatron's block method with that many layers; torchtitan's layer-wise option 2, which wraps
# floor(7 / 2) = 3 blocks of each model part; DeepSpeed's pipeline config checkpoints no interval and
# says what the model code does
if "$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
        --n-micro 4 --strategy 'vision:gpus=4,dp=4,mb=2;llm:gpus=8,tp=2,pp=2,vp=2,dp=2,zero=1,mb=1,rc=full,rc_layers=3' \
        -o "$T/r.json" >/dev/null 2>"$T/err" &&
   export_checked "$T/r" &&
   "$VPY" - "$T/r.megatron.json" "$T/r.deepspeed.json" "$T/r.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_partial_recompute; else fail export_partial_recompute "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
m, d, t = (json.load(open(p)) for p in sys.argv[1:4])
a = " ".join(m["args"])
assert "--recompute-granularity full --recompute-method block --recompute-num-layers 3" in a, a
llm = {x["module"]: x for x in d["modules"]}["llm"]["config"]
assert llm["pipeline"]["activation_checkpoint_interval"] == 0, llm
assert any("recompute full:3" in n and "first rc_layers blocks" in n for n in d["notes"]), d["notes"]
ac = t["toml"]["activation_checkpoint"]
assert ac == {"mode": "selective", "selective_ac_option": "2"}, ac
assert not any("rc_layers" in n for n in t["notes"]), t["notes"]
PY

# FP8 linears: Megatron's TransformerEngine flags (the recipe, hybrid E4M3/E5M2, primary FP8 weights), torchtitan's
# quantize.linear.float8 converter with the output layer left out, DeepSpeed's note; each checked by the trainer's
# own definitions
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --fp8 delayed --gpus 8 \
        --strategy 'vision:dp=8;llm:tp=2,dp=4,zero=1' --no-baselines -o "$T/f8.json" >/dev/null 2>"$T/err" &&
   export_checked "$T/f8" &&
   "$VPY" - "$T/f8.megatron.json" "$T/f8.deepspeed.json" "$T/f8.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_fp8; else fail export_fp8 "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
m, d, t = (json.load(open(p)) for p in sys.argv[1:4])
a = " ".join(m["args"])
assert "--fp8-format hybrid --fp8-recipe delayed --fp8-param-gather" in a, a
assert any("no FP8 linears" in n for n in d["notes"]), d["notes"]
toml = t["toml"]
assert toml["model"]["converters"] == ["quantize.linear.float8"], toml
assert toml["quantize.linear.float8"] == {"recipe_name": "tensorwise", "filter_fqns": ["output"]}, toml
assert any("fp8 delayed (TransformerEngine) exported as torchao" in n for n in t["notes"]), t["notes"]
PY

# TP communication overlap and bf16 gradient buffers: Megatron's --tp-comm-overlap beside --sequence-parallel and
# --grad-reduce-in-bf16 (ZeRO-1); torchtitan's and DeepSpeed's notes say what they do not take, and every trainer
# that a plan's flash-attn loss (--loss fused) and bf16 AdamW states (--optim-dtype bf16) are not its own
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --tp-comm-overlap --grad-reduce bf16 \
        --loss fused --optim-dtype bf16 --gpus 8 --strategy 'vision:dp=8;llm:tp=2,dp=4,zero=1,seqpar=1' --no-baselines -o "$T/ub.json" >/dev/null 2>"$T/err" &&
   export_checked "$T/ub" &&
   "$VPY" - "$T/ub.megatron.json" "$T/ub.deepspeed.json" "$T/ub.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_tp_comm_overlap; else fail export_tp_comm_overlap "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
m, d, t = (json.load(open(p)) for p in sys.argv[1:4])
a = m["args"]
assert "--tp-comm-overlap" in a and "--sequence-parallel" in a and "--grad-reduce-in-bf16" in a, a
assert any("tp_comm_overlap not exported: DeepSpeed" in n for n in d["notes"]), d["notes"]
assert any("tp_comm_overlap not exported" in n and "async TP" in n for n in t["notes"]), t["notes"]
for doc, who in ((m, "Megatron-LM computes its own vocab-parallel"), (t, "torchtitan computes its own torch"),
                 (d, "DeepSpeed computes the model code's cross-entropy")):
    assert any("loss fused not exported: " + who in n for n in doc["notes"]), doc["notes"]
for doc, who in ((m, "Megatron-LM"), (t, "torchtitan"), (d, "DeepSpeed")):
    assert any("optimizer states bf16 (--optim-dtype) not exported: " + who + " keeps fp32" in n
               for n in doc["notes"]), doc["notes"]
PY

# async TP under --tp-style dtensor: torchtitan's enable_async_tensor_parallel beside the compile it needs
# (components ["model"]: the loss stays eager, as priced); cuDNN attention is torchtitan's to pick, a note says
if "$DHP" plan --model qwen2.5-vl-7b --cluster 8xh100 --batch 16 --target megatron --tp-style dtensor --tp-comm-overlap \
        --attention cudnn --gpus 8 --strategy 'vision:dp=8;llm:tp=2,dp=4,zero=1,seqpar=1' --no-baselines -o "$T/atp.json" \
        >/dev/null 2>"$T/err" &&
   export_checked "$T/atp" &&
   "$VPY" - "$T/atp.torchtitan.json" <<'PY' >"$T/v" 2>&1; then ok export_async_tp; else fail export_async_tp "$(cat "$T/err" "$T/check" "$T/v" 2>/dev/null | grep -v -e WARNING -e 'HF assets' | head -c 400)"; fi
import json, sys
t = json.load(open(sys.argv[1]))["toml"]
assert t["parallelism"]["enable_async_tensor_parallel"] is True, t["parallelism"]
assert t["compile"] == {"enable": True, "components": ["model"]}, t.get("compile")
assert any("attention cudnn not exported" in n for n in json.load(open(sys.argv[1]))["notes"])
PY
