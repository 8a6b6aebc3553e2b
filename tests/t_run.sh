#!/usr/bin/env bash
# dhp run under mpirun: the core equivalence test (plans on 1-4 ranks, both
# placements, SP / TP / DP / ZeRO-1/2/3, recomputation, Megatron sequence
# parallelism, frozen modules, uneven groups, pipelines, the LLM's context
# parallelism, audio and several encoders give the 1-rank run's losses and
# final weights), recomputation changes no bit, bit-identical resume, and bad input.
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip run "mpirun not found"; exit 0; fi
if ! /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then skip run "/usr/bin/python3 has no numpy"; exit 0; fi
HERE=$(cd "$(dirname "$0")" && pwd)
# 20 steps, as the equivalence is stated; under the sanitizers (make test-asan, DHP_SANITIZED) 6:
# the memory and UB checks see every step's code by step 2, and resume's half is step 3
STEPS=20
[ -n "${DHP_SANITIZED:-}" ] && STEPS=6
. "$HERE/run_lib.sh"

"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null || { fail run_data "dhp data synth failed"; exit 0; }

plan ref colocated "vision:dp=1;llm:dp=1" --gpus 1 || exit 0
if ! train ref; then fail run_reference "$(tail -c 300 "$T/ref.err")"; exit 0; fi
losses "$T/ref.log" >"$T/ref.losses"

# check_plan NAME [REF]: NAME's 20 losses and final weights and moments match REF's (the 1-rank run)
check_plan() {
    local name=$1 ref=${2:-ref}
    if ! train "$name"; then fail "run_equivalence_$name" "dhp run failed: $(tail -c 300 "$T/$name.err")"; return; fi
    losses "$T/$name.log" >"$T/$name.losses"
    local lo wo
    if ! lo=$(same_losses "$T/$ref.losses" "$T/$name.losses" 2>&1); then fail "run_equivalence_$name" "$lo"; return; fi
    if ! wo=$($DIFF "$T/$ref.ck" "$T/$name.ck" --skip-key-bias --rtol 1e-5 2>&1); then fail "run_equivalence_$name" "weights: $wo"; return; fi
    echo "# $name: $lo; weights $(echo "$wo" | head -1)"
    ok "run_equivalence_$name"
}

plan dp2 colocated "vision:dp=2;llm:dp=2,zero=0" --gpus 2 && check_plan dp2
plan sp2_tp2 colocated "vision:sp=2,dp=1;llm:tp=2,dp=1,seqpar=0" --gpus 2 && check_plan sp2_tp2
plan dp4_zero1 colocated "vision:dp=4,zero=1;llm:dp=4,zero=1" --gpus 4 && check_plan dp4_zero1
plan vtp2_dp2 colocated "vision:tp=2,dp=2;llm:tp=2,dp=2,seqpar=0" --gpus 4 && check_plan vtp2_dp2
plan dis_1_tp2 disaggregated "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0" --n-micro 4 && check_plan dis_1_tp2
plan dis_2_1 disaggregated "vision:gpus=2,dp=2;llm:gpus=1" --n-micro 2 && check_plan dis_2_1
plan dis_sp2_dp2 disaggregated "vision:gpus=2,sp=2;llm:gpus=2,dp=2,zero=1" --n-micro 2 && check_plan dis_sp2_dp2
# chunks of 4 samples over 3 vision replicas: shares of 1, 1 and 2
plan dis_3_1 disaggregated "vision:gpus=3,dp=3,zero=1;llm:gpus=1,mb=1" --n-micro 2 && check_plan dis_3_1

# ZeRO-2 and -3, alone and mixed with Ulysses SP, TP, sequence parallelism and recomputation
plan z2_dp2 colocated "vision:dp=2,zero=2;llm:dp=2,zero=2" --gpus 2 && check_plan z2_dp2
plan z3_dp2 colocated "vision:dp=2,zero=3;llm:dp=2,zero=3" --gpus 2 && check_plan z3_dp2
plan z3_sp2_tp2 colocated "vision:sp=2,dp=2,zero=3;llm:tp=2,dp=2,zero=3,seqpar=0" --gpus 4 && check_plan z3_sp2_tp2
plan dis_z2 disaggregated "vision:gpus=2,dp=2,zero=2;llm:gpus=2,dp=2,zero=2" --n-micro 2 && check_plan dis_z2
# ZeRO-3 over replicas of uneven shares (1, 1, 2 samples of each chunk): the short ones run empty micro-batches
plan z3_uneven disaggregated "vision:gpus=3,dp=3,zero=3,mb=1;llm:gpus=1,mb=1" --n-micro 2 && check_plan z3_uneven
plan seqpar_dp2 colocated "vision:dp=4;llm:tp=2,dp=2,seqpar=1" --gpus 4 && check_plan seqpar_dp2
plan rc_full_seqpar colocated "vision:dp=2,rc=full;llm:tp=2,rc=full,seqpar=1" --gpus 2 && check_plan rc_full_seqpar
plan rc_sel_seqpar colocated "vision:dp=2,rc=selective;llm:tp=2,rc=selective,seqpar=1" --gpus 2 && check_plan rc_sel_seqpar
plan z3_rc_seqpar colocated "vision:dp=4,zero=3,rc=selective;llm:tp=2,dp=2,zero=3,rc=full,seqpar=1" --gpus 4 && check_plan z3_rc_seqpar
plan dis_z2_seqpar disaggregated "vision:gpus=2,dp=2,zero=2;llm:gpus=2,tp=2,seqpar=1,rc=selective" --n-micro 4 && check_plan dis_z2_seqpar
plan dis_sp2_z3_rc disaggregated "vision:gpus=2,sp=2,zero=3,rc=full;llm:gpus=2,dp=2,zero=2" --n-micro 2 && check_plan dis_sp2_z3_rc

# Recomputation changes no number: rc=full, rc=selective and rc=full on the first
# block of each module only (rc_layers=1: the other blocks keep their activations)
# give the plain run's losses and weights bit for bit
for rc in full selective partial; do
    spec=$rc; [ "$rc" = partial ] && spec="full,rc_layers=1"
    plan "rc_$rc" colocated "vision:dp=1,rc=$spec;llm:dp=1,rc=$spec" --gpus 1 || continue
    if ! train "rc_$rc"; then fail "run_recompute_${rc}_is_bit_identical" "$(tail -c 300 "$T/rc_$rc.err")"; continue; fi
    losses "$T/rc_$rc.log" >"$T/rc_$rc.losses"
    s=$(cat "$T/ref.ck/latest")
    if cmp -s "$T/ref.losses" "$T/rc_$rc.losses" && cmp -s "$T/ref.ck/$s/llm.safetensors" "$T/rc_$rc.ck/$s/llm.safetensors" \
       && cmp -s "$T/ref.ck/$s/vision.safetensors" "$T/rc_$rc.ck/$s/vision.safetensors"; then ok "run_recompute_${rc}_is_bit_identical"
    else fail "run_recompute_${rc}_is_bit_identical" "losses or checkpoints differ from the run without recomputation"; fi
done
# what the partial run allocated, per rank and category, is what dhp simulate predicts (the recomputed block's
# shared copies beside the other's own tensors)
[ -s "$T/rc_partial.log" ] && check_memory rc_partial run_memory_is_predicted_rc_partial

# Frozen modules and a tied LLM head, each against its own 1-rank run: a frozen
# encoder runs no backward, a frozen LLM still back-propagates to the encoder;
# under ZeRO-3 a frozen module gathers and never reduces; the tied head gathers the embedding too.
variant() {   # variant NAME KEY=VALUE[,KEY=VALUE] MODULE-KIND: tiny-vl with fields of one module changed
    /usr/bin/python3 - "$T/$1.model.json" "$2" "$3" "$HERE/../models/zoo/tiny-vl.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[4]))
for kv in sys.argv[2].split(","):
    key, value = kv.split("=")
    for mod in m["modules"]:
        if mod["kind"] == sys.argv[3]: mod[key] = value == "true" if value in ("true", "false") else int(value)
m["name"] = "tiny-vl-" + sys.argv[2].split("=")[0]
json.dump(m, open(sys.argv[1], "w"))
PY
}
variant frozen_vision frozen=true vision && variant frozen_llm frozen=true llm && variant tied tied_embeddings=true llm
for v in frozen_vision frozen_llm tied; do
    export MODEL="$T/$v.model.json"
    if plan "ref_$v" colocated "vision:dp=1;llm:dp=1" --gpus 1 && train "ref_$v"; then
        losses "$T/ref_$v.log" >"$T/ref_$v.losses"
        plan "${v}_z3" colocated "vision:dp=2,zero=3;llm:dp=2,zero=3" --gpus 2 && check_plan "${v}_z3" "ref_$v"
    else fail "run_reference_$v" "$(tail -c 300 "$T/ref_$v.err")"; fi
    unset MODEL
done
# (the frozen vision under full recomputation, which it never runs: its blocks share one set of buffers;
# micro-stepping through its chunk share, which a frozen encoder may)
MODEL="$T/frozen_vision.model.json" plan frozen_vision_z2_tp disaggregated "vision:gpus=1,rc=full,mb=1;llm:gpus=2,tp=2,seqpar=1,zero=2" --n-micro 2 \
    && check_plan frozen_vision_z2_tp ref_frozen_vision && check_memory frozen_vision_z2_tp run_memory_is_predicted_frozen_vision_z2_tp
MODEL="$T/tied.model.json" plan tied_z2_seqpar colocated "vision:dp=2,zero=2;llm:tp=2,seqpar=1,rc=full" --gpus 2 \
    && check_plan tied_z2_seqpar ref_tied

# Pipeline parallelism (1F1B): both modules on stages, with ZeRO-1 and data
# parallelism, disaggregated with the LLM's pipeline over the step's
# micro-batches, an encoder pipeline feeding an LLM pipeline, TP with sequence
# parallelism and recomputation on stages, a tied embedding split over the
# first and the last stage, and an uneven split of a 3-block LLM; ZeRO-2 and
# -3 on stages.
plan pp_z1 colocated "vision:dp=2,pp=2,zero=1;llm:pp=2,dp=2,zero=1" --gpus 4 && check_plan pp_z1
plan pp_dis disaggregated "vision:gpus=1;llm:gpus=2,pp=2,mb=1" --n-micro 4 && check_plan pp_dis
plan pp_enc_dis disaggregated "vision:gpus=2,pp=2;llm:gpus=2,pp=2" --n-micro 2 && check_plan pp_enc_dis
plan pp_tp_seqpar colocated "vision:dp=4;llm:pp=2,tp=2,seqpar=1,rc=selective" --gpus 4 && check_plan pp_tp_seqpar
# ZeRO-2 on pipeline stages: every micro-batch's unit gradients reduce-scattered into the shards, the
# last of them added before the update on the stages without the stem too (both modules on 2 stages)
plan pp_z2 colocated "vision:dp=2,pp=2,zero=2;llm:pp=2,dp=2,zero=2" --gpus 4 && check_plan pp_z2 \
    && check_memory pp_z2 run_memory_is_predicted_pp_z2
# ZeRO-3 on pipeline stages: each stage's units gathered for every micro-batch's forward and backward
# and freed after it, their gradients reduce-scattered into the shards every micro-batch
plan pp_z3 colocated "vision:dp=2,pp=2,zero=3;llm:pp=2,dp=2,zero=3" --gpus 4 && check_plan pp_z3 \
    && check_memory pp_z3 run_memory_is_predicted_pp_z3
MODEL="$T/tied.model.json" plan tied_pp colocated "vision:dp=4;llm:pp=2,dp=2,zero=1" --gpus 4 && check_plan tied_pp ref_tied
# llm_reference NAME LAYERS: tiny-vl with an LLM of LAYERS blocks (variant NAME) trained on one rank,
# the run its plans are checked against (ref_NAME); MODEL stays set for them.
llm_reference() {
    local name=$1 layers=$2
    variant "$name" layers="$layers" llm
    export MODEL="$T/$name.model.json"
    if plan "ref_$name" colocated "vision:dp=1;llm:dp=1" --gpus 1 && train "ref_$name"; then
        losses "$T/ref_$name.log" >"$T/ref_$name.losses"
        return 0
    fi
    fail "run_reference_$name" "$(tail -c 300 "$T/ref_$name.err")"
    return 1
}
if llm_reference deep 3; then
    plan deep_split disaggregated "vision:gpus=1;llm:gpus=2,split=1:2,mb=1" --n-micro 4 && check_plan deep_split ref_deep
fi
# Interleaved virtual stages (vp = 2, Megatron's interleaved 1F1B): an LLM of
# 4 layers on 2 stages of 2 one-layer chunks (rank stage 0 holds layers 0 and
# 2, stage 1 layers 1 and 3, the last stage's chunk 0 feeding the first
# stage's chunk 1), fed by the encoder; with tp 2 and sequence parallelism;
# with dp 2 and ZeRO-1 behind 2 encoder replicas.
if llm_reference deep4 4; then
    plan vp_dis disaggregated "vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1" --n-micro 4 && check_plan vp_dis ref_deep4
    plan vp_tp2 disaggregated "vision:gpus=1;llm:gpus=4,pp=2,vp=2,tp=2,seqpar=1,mb=1" --n-micro 4 && check_plan vp_tp2 ref_deep4
    plan vp_dp2_z1 disaggregated "vision:gpus=2,dp=2;llm:gpus=4,pp=2,vp=2,dp=2,zero=1,mb=1" --n-micro 2 && check_plan vp_dp2_z1 ref_deep4
    # The embedding and the head a block each in the split (split=ends, Llama 3 405B's layout): 4 + 2
    # slots over 2 ranks x 3 one-slot chunks: rank 0 holds the embedding alone, layer 1, layer 3; rank 1
    # layer 0, layer 2, the head alone; with tp 2, sequence parallelism and full recomputation
    plan vp_ends disaggregated "vision:gpus=1;llm:gpus=2,pp=2,vp=3,split=ends,mb=1" --n-micro 4 && check_plan vp_ends ref_deep4 \
        && check_memory vp_ends run_memory_is_predicted_vp_ends
    plan vp_ends_tp2 disaggregated "vision:gpus=1;llm:gpus=4,pp=2,vp=3,split=ends,tp=2,seqpar=1,rc=full,mb=1" --n-micro 4 \
        && check_plan vp_ends_tp2 ref_deep4
    plan vp_ends_z2 disaggregated "vision:gpus=2,dp=2;llm:gpus=4,pp=2,vp=3,split=ends,dp=2,zero=2,mb=1" --n-micro 2 \
        && check_plan vp_ends_z2 ref_deep4
    plan vp_ends_z3 disaggregated "vision:gpus=2,dp=2;llm:gpus=4,pp=2,vp=3,split=ends,dp=2,zero=3,mb=1" --n-micro 2 \
        && check_plan vp_ends_z3 ref_deep4 && check_memory vp_ends_z3 run_memory_is_predicted_vp_ends_z3
fi
# Uneven chunks: 5 layers on 2 stages of 2 and 3 blocks, chunks of 1 + 1 and
# 2 + 1 (virtual stages: layer 0, layers 1-2, layer 3, layer 4).
if llm_reference deep5 5; then
    plan vp_uneven disaggregated "vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1" --n-micro 4 && check_plan vp_uneven ref_deep5
    # and recomputing the first block of each chunk only (rc_layers=1): layer 1 of chunk 1-2
    # recomputes, layer 2 keeps its activations
    plan vp_uneven_part disaggregated "vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1,rc=full,rc_layers=1" --n-micro 4 \
        && check_plan vp_uneven_part ref_deep5 && check_memory vp_uneven_part run_memory_is_predicted_vp_uneven_part
fi
unset MODEL

# Context parallelism of the LLM (sp > 1). Ulysses where tp * sp divides the
# heads (tiny-vl: 4 heads, 2 kv heads over sp = 2): colocated, disaggregated,
# with ZeRO-3 over dp x sp, selective recomputation and pipeline stages. Ring
# attention (load-balanced causal chunks) where it does not: sp = 2 with tp = 2
# and Megatron sequence parallelism, and a variant of 3 heads and 1 kv head
# against its own 1-rank run, with ZeRO-1 and full recomputation.
plan cp_ulysses colocated "vision:sp=2;llm:sp=2" --gpus 2 && check_plan cp_ulysses
plan cp_ulysses_dis disaggregated "vision:gpus=1;llm:gpus=2,sp=2" --n-micro 4 && check_plan cp_ulysses_dis
plan cp_ulysses_z3 colocated "vision:dp=4;llm:sp=2,dp=2,zero=3" --gpus 4 && check_plan cp_ulysses_z3
plan cp_ulysses_rc colocated "vision:dp=2;llm:sp=2,rc=selective" --gpus 2 && check_plan cp_ulysses_rc
plan cp_ulysses_pp colocated "vision:dp=4;llm:pp=2,sp=2" --gpus 4 && check_plan cp_ulysses_pp
plan cp_ring_tp2 colocated "vision:dp=4;llm:sp=2,tp=2,seqpar=1" --gpus 4 && check_plan cp_ring_tp2
# ring asked for where Ulysses would run (--strategy cp=ring: Megatron-Core's and torchtitan's context
# parallelism), the plan file keeping it and the run taking it
if plan cp_ring_asked colocated "vision:sp=2;llm:sp=2,cp=ring" --gpus 2 \
   && grep -q '"cp":[[:space:]]*"ring"' "$T/cp_ring_asked.json" && grep -q "context parallelism: ring attention over sp 2" "$T/cp_ring_asked.plan.out"; then
    # the run holds ring attention's buffers (two K/V blocks in flight), as simulate predicts for a ring
    check_plan cp_ring_asked && check_memory cp_ring_asked run_memory_is_predicted_cp_ring_asked
else fail run_plan_cp_ring_asked "$(head -c 300 "$T/cp_ring_asked.plan.out")"; fi
variant ring heads=3,kv_heads=1 llm
export MODEL="$T/ring.model.json"
if plan ref_ring colocated "vision:dp=1;llm:dp=1" --gpus 1 && train ref_ring; then
    losses "$T/ref_ring.log" >"$T/ref_ring.losses"
    plan cp_ring colocated "vision:dp=2;llm:sp=2" --gpus 2 && check_plan cp_ring ref_ring
    plan cp_ring_z1_rc colocated "vision:dp=2;llm:sp=2,zero=1,rc=full" --gpus 2 && check_plan cp_ring_z1_rc ref_ring
    plan cp_ring_dis_pp disaggregated "vision:gpus=1;llm:gpus=4,pp=2,sp=2,mb=1" --n-micro 4 && check_plan cp_ring_dis_pp ref_ring
else fail run_reference_ring "$(tail -c 300 "$T/ref_ring.err")"; fi
unset MODEL

# Several encoders feeding one LLM (tiny-omni: vision and audio, as
# Qwen2.5-Omni's thinker) and an audio encoder alone (tiny-audio), on the
# samples' clips (64 mel frames: 32 rows after the conv stem). Omni: each
# encoder on its own group (disaggregated, with the LLM's tensor or context
# parallelism), all on the same ranks (colocated, with ring attention over a
# sequence whose chunks cut through the vision and audio rows), a frozen audio
# encoder (forward only) against its own 1-rank run; tiny-audio with the
# LLM's pipeline and its Ulysses context parallelism.
"$DHP" data synth --out "$T/adata" --samples 64 --window 0 --audio >/dev/null || fail run_audio_data "dhp data synth --audio failed"
SETUP_VL=$SETUP
export DATA="$T/adata"
SETUP="$SETUP --audio-frames 32"
variant_of() {   # variant_of NAME ZOO-MODEL KIND: the zoo model with module KIND frozen
    /usr/bin/python3 -c "
import json, sys
m = json.load(open(sys.argv[2]))
for mod in m['modules']:
    if mod['kind'] == sys.argv[3]: mod['frozen'] = True
m['name'] += '-frozen-' + sys.argv[3]
json.dump(m, open(sys.argv[1], 'w'))" "$T/$1.model.json" "$HERE/../models/zoo/$2.json" "$3"
}
variant_of frozen_audio tiny-omni audio
for m in tiny-omni tiny-audio "$T/frozen_audio.model.json"; do
    export MODEL=$m
    case $m in tiny-omni) r=ref_omni;; tiny-audio) r=ref_audio;; *) r=ref_frozen_audio;; esac
    spec="audio:dp=1;llm:dp=1"; [ "$m" = tiny-audio ] || spec="vision:dp=1;$spec"
    if plan "$r" colocated "$spec" --gpus 1 && train "$r"; then losses "$T/$r.log" >"$T/$r.losses"
    else fail "run_reference_$r" "$(tail -c 300 "$T/$r.err")"; continue; fi
    case $m in
    tiny-omni)
        plan omni_dis_tp disaggregated "vision:gpus=1;audio:gpus=1;llm:gpus=2,tp=2,seqpar=0" --n-micro 4 && check_plan omni_dis_tp $r
        plan omni_dis_cp disaggregated "vision:gpus=1,zero=1;audio:gpus=2,sp=2;llm:gpus=2,sp=2" --n-micro 2 && check_plan omni_dis_cp $r
        plan omni_col colocated "vision:dp=2;audio:sp=2;llm:dp=2,zero=2" --gpus 2 && check_plan omni_col $r
        plan omni_col_ring colocated "vision:dp=4;audio:dp=2,sp=2;llm:sp=2,tp=2,seqpar=1" --gpus 4 && check_plan omni_col_ring $r;;
    tiny-audio)
        plan audio_dis_pp disaggregated "audio:gpus=1;llm:gpus=2,pp=2,mb=1" --n-micro 4 && check_plan audio_dis_pp $r
        plan audio_cp colocated "audio:sp=2;llm:sp=2,zero=3" --gpus 2 && check_plan audio_cp $r;;
    *)
        plan frozen_audio_dis disaggregated "vision:gpus=1;audio:gpus=2,sp=2;llm:gpus=1" --n-micro 4 && check_plan frozen_audio_dis $r
        plan frozen_audio_col colocated "vision:dp=2,zero=3;audio:dp=2,zero=3;llm:pp=2,zero=1" --gpus 2 && check_plan frozen_audio_col $r;;
    esac
done
# Window attention (tiny-vl-window: an 8 x 8-patch image is 2 x 2 windows of
# 2 x 2 merge groups): the merged tokens leave the vision encoder in window
# order and reach the LLM in raster order (Qwen2.5-VL's reverse_indices; the
# hand-off moves whole window rows as blocks, planner/handoff.c, and the rest
# as row runs): the vision encoder's sequence split cuts the images in whole
# window rows (disaggregated, Ulysses LLM) and mid-window-row (colocated, ring
# attention over tp 2 x sp 2 with 2 kv heads).
"$DHP" data synth --out "$T/wdata" --samples 64 --window 16 >/dev/null || fail run_window_data "dhp data synth --window 16 failed"
SETUP=$SETUP_VL
export DATA="$T/wdata" MODEL=tiny-vl-window
if plan ref_window colocated "vision:dp=1;llm:dp=1" --gpus 1 && train ref_window; then
    losses "$T/ref_window.log" >"$T/ref_window.losses"
    plan window_dis disaggregated "vision:gpus=2,sp=2;llm:gpus=2,sp=2" --n-micro 2 && check_plan window_dis ref_window
    plan window_col_ring colocated "vision:sp=4;llm:sp=2,tp=2,seqpar=1" --gpus 4 && check_plan window_col_ring ref_window
else fail run_reference_ref_window "$(tail -c 300 "$T/ref_window.err")"; fi
# LLaVA (tiny-llava: a CLIP tower, its class row in every image's 17 rows and
# dropped before the projector, feeding a Llama LLM) on 16 px images of
# unmerged 4 px patches: tensor and data parallelism, ZeRO, a pipelined tower
# and a disaggregated one; the tower runs without sp (refused by the planner).
"$DHP" data synth --out "$T/cdata" --samples 64 --image-size 16 --merge 1 --window 0 >/dev/null || fail run_llava_data "dhp data synth failed"
export DATA="$T/cdata" MODEL=tiny-llava
SETUP="$SETUP_VL --vision-tokens 16"
if plan ref_llava colocated "vision:dp=1;llm:dp=1" --gpus 1 && train ref_llava; then
    losses "$T/ref_llava.log" >"$T/ref_llava.losses"
    plan llava_col_tp2 colocated "vision:dp=2;llm:tp=2,dp=1,seqpar=0" --gpus 2 && check_plan llava_col_tp2 ref_llava
    plan llava_col_vtp2_z3 colocated "vision:tp=2,dp=2,zero=3;llm:dp=4,zero=2" --gpus 4 && check_plan llava_col_vtp2_z3 ref_llava
    plan llava_dis_tp2 disaggregated "vision:gpus=1;llm:gpus=2,tp=2,seqpar=1" --n-micro 4 && check_plan llava_dis_tp2 ref_llava
    plan llava_dis_vpp2 disaggregated "vision:gpus=2,pp=2,mb=1;llm:gpus=1" --n-micro 4 && check_plan llava_dis_vpp2 ref_llava
else fail run_reference_ref_llava "$(tail -c 300 "$T/ref_llava.err")"; fi
expect_err run_llava_refuses_vision_sp 'vision: sp 2: a tower with a class row per image runs without sequence parallelism' \
    "$DHP" plan $SETUP --model tiny-llava --placement colocated --strategy "vision:sp=2;llm:dp=2" --gpus 2 -o "$T/x.json"
export DATA="$T/adata"
unset MODEL
SETUP="$SETUP_VL --audio-frames 32"
# memory: what `dhp simulate` predicts per rank and category is what the run allocated (parameters, gradients,
# optimizer, hand-off and pipeline buffers, ZeRO buffers to the byte; activations within 0.1%: the
# executor's few sequence-offset integers per slot, as for vision-only plans)
for name in omni_dis_tp omni_col_ring frozen_audio_dis audio_dis_pp vp_dis vp_tp2 vp_uneven llava_col_vtp2_z3 llava_dis_vpp2; do
    check_memory "$name" "run_memory_is_predicted_$name"
done
# audio data for a model without an audio encoder, a model with one without audio, and clips the plan did not plan for:
# one line naming the field, exit 2, before any rank allocates
expect_err run_refuses_audio_data_for_a_model_without_an_audio_encoder "data set has audio \(mel_bins 16, mel_frames 64\) but model tiny-vl has no audio encoder" \
    "$DHP" run "$T/ref.json" --data "$T/adata" --steps 2
expect_err run_refuses_an_audio_model_without_audio_data "model tiny-omni has an audio encoder \(audio\) but the data set has no audio" \
    "$DHP" run "$T/ref_omni.json" --data "$T/data" --steps 2
sed -E 's/"audio_frames":([[:space:]]*)32/"audio_frames":\116/' "$T/ref_omni.json" >"$T/omni_bad.json"
expect_err run_refuses_clips_the_plan_did_not_plan_for "plan has 16 audio frames per sample, the data set's clips give 32" \
    "$DHP" run "$T/omni_bad.json" --data "$T/adata" --steps 2
unset MODEL DATA
SETUP=$SETUP_VL

# resume: 10 steps, stop, resume for 10 more == 20 straight (bit for bit), on
# stages too (each stage loads its blocks from the whole-tensor checkpoint): resume_check (run_lib.sh)
resume_check dis_sp2_dp2 run_resume_is_bit_identical
resume_check pp_enc_dis run_resume_on_pipeline_stages_is_bit_identical

# bad input: one clear line, non-zero exit, no corrupted checkpoint
expect_err run_rejects_wrong_rank_count "needs 2 ranks, this run has 1" "$DHP" run "$T/dp2.json" --data "$T/data" --steps 2
cp -r "$T/data" "$T/bad"; truncate -s 1000 "$T/bad/shard-00000.bin"
expect_err run_rejects_truncated_data "shard-00000.bin: truncated" "$DHP" run "$T/ref.json" --data "$T/bad" --steps 2
"$DHP" data synth --out "$T/data8" --samples 64 --patch 8 --window 0 >/dev/null
expect_err run_rejects_data_of_another_model "patch 4, merge 2, window 0; the data set 8" "$DHP" run "$T/ref.json" --data "$T/data8" --steps 2
expect_err plan_refuses_a_split_that_does_not_hold_the_blocks "the stages hold 3 blocks, the module has 2" \
    "$DHP" plan --model tiny-vl --cluster 8xh100 --batch 8 --placement colocated --strategy "vision:dp=2;llm:split=1:2" --gpus 2
# a plan whose LLM's sequence (16 + 50 = 66 positions) the ring's 4 chunks cannot split: refused before any rank allocates
sed -E 's/"text_tokens":([[:space:]]*)48/"text_tokens":\150/' "$T/cp_ring_tp2.json" >"$T/cp_bad.json"
expect_err run_refuses_a_sequence_the_context_parallelism_cannot_split "sequence .66 tokens. divisible by 4" \
    "$DHP" run "$T/cp_bad.json" --data "$T/data" --steps 2
cp -r "$T/ref.ck" "$T/badck"; f="$T/badck/$(cat "$T/badck/latest")/llm.safetensors"; truncate -s 4000 "$f"
expect_exit run_rejects_a_truncated_checkpoint 2 "$DHP" run "$T/ref.json" --data "$T/data" --steps $STEPS --ckpt "$T/badck" --resume
grep -q "llm.safetensors" "$T/err" || fail run_truncated_checkpoint_message "stderr does not name the file: $(head -c 200 "$T/err")"
"$DHP" run "$T/ref.json" --data "$T/data" --steps 30 --lr 1e4 --min-lr 1e4 --grad-clip 0 --warmup 0 \
    --ckpt "$T/nan.ck" --ckpt-every 1 >"$T/out" 2>"$T/err"
rc=$?
last=$(cat "$T/nan.ck/latest" 2>/dev/null)
if [ "$rc" = 1 ] && grep -qE "step [0-9]+: .*nan|diverged" "$T/err" && [ -n "$last" ] \
   && $DIFF "$T/nan.ck" "$T/nan.ck" >/dev/null 2>&1; then ok run_stops_on_nan_loss_keeping_the_last_good_checkpoint
else fail run_stops_on_nan_loss_keeping_the_last_good_checkpoint "exit $rc, latest '$last': $(head -c 300 "$T/err")"; fi

# --trace: the measured step in Chrome trace format, event for event the simulator's, on one time base for all ranks
n=$(world "$T/dis_1_tp2.json")
if timeout 120 mpirun --oversubscribe -np "$n" "$DHP" run "$T/dis_1_tp2.json" --data "$T/data" --steps 2 --trace "$T/run.trace" >/dev/null 2>"$T/err" \
   && "$DHP" simulate "$T/dis_1_tp2.json" --trace "$T/sim.trace" >/dev/null 2>>"$T/err"; then
    if /usr/bin/python3 - "$T/run.trace" "$T/sim.trace" 2>"$T/err" <<'PY'
import json, sys
def ops(f):
    e = json.load(open(f))
    e = e if isinstance(e, list) else e["traceEvents"]
    return sorted((x["pid"], x["tid"], x["name"]) for x in e if x.get("ph") == "X")
a, b = ops(sys.argv[1]), ops(sys.argv[2])
if a != b or not a:
    sys.exit(f"{len(a)} measured vs {len(b)} simulated events differ")
# One time base for all ranks: no hand-off is received before it was sent
# (1 ms of slack; a host's ranks read one clock), and the step starts at 0.
import re
ev = json.load(open(sys.argv[1]))
ev = [x for x in (ev if isinstance(ev, list) else ev["traceEvents"]) if x.get("ph") == "X"]
assert min(x["ts"] for x in ev) == 0, "the first op does not start at 0"
def chunk(x): return re.search(r" c(\d+)", x["name"]).group(1)
for kind in ("act", "grad"):
    sent = {}
    for x in ev:
        if x["name"].startswith("send_" + kind):
            sent[chunk(x)] = min(sent.get(chunk(x), float("inf")), x["ts"])
    got = [x for x in ev if x["name"].startswith("recv_" + kind)]
    assert got and all(x["ts"] + x["dur"] >= sent[chunk(x)] - 1000 for x in got), (kind, sent, got)
PY
    then ok run_trace_matches_the_simulated_events; else fail run_trace_matches_the_simulated_events "$(tail -c 300 "$T/err")"; fi
else fail run_trace_matches_the_simulated_events "$(head -c 300 "$T/err")"; fi
