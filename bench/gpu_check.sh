#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one prepared run (issue 21, "On a
# GPU machine"); under 8 minutes on one H100 by design:
#   0. dhp itself: built here (make dhp), or GPU_BUNDLE=DIR|DIR.tar.gz from
#      scripts/gpu_bundle.sh on a machine that has only the driver and CUDA
#      (the lent GPU machines: no GLPK, OpenBLAS or Open MPI, no package
#      manager to fetch them);
#   1. dhp profile --backend cuda: the CUDA kernels checked against the CPU
#      backend on the device, then the executor's own kernels (the GEMMs in
#      fp32, TF32 and bf16; the attention in fp32 and bf16) and (2+ GPUs,
#      under mpirun) NCCL; the cluster it writes is what the plans below are
#      priced on;
#   2. equivalence, tiny zoo models on one GPU: fp32 `--backend cuda` against
#      `--backend cpu` within 1e-5; bf16-mixed on both backends within 2^-12
#      (the same roundings, other summation orders: tests/t_bf16.sh (c)), and
#      the CUDA bf16-mixed run against the CPU fp32 one within 2^-6 but not
#      within 1e-6 (t_bf16.sh (b)); with 2+ GPUs dp / tp / ZeRO-3 plans over
#      NCCL against the CPU over MPI;
#   3. the 100-step tiny-vl loss curve of bf16-mixed on the GPU against fp32,
#      held to the trajectory's sensitivity S measured beside it
#      (bench/bf16_curve.sh);
#   4. a ~1B-parameter plan (bench/dhp-1b.json: ViT 12 x 768 + LLM 18 x 2048,
#      980M parameters) trained for STEPS steps on one GPU in each of
#      PRECISIONS (bf16-mixed, then fp32): tokens/s, the FLOP rate and MFU,
#      predicted vs measured step time and peak memory per category;
#   5. the LLM's transformer blocks at BLOCK_SEQ (4096) tokens in bf16-mixed:
#      the same LLM alone with BLOCK_LAYERS (8 and 16) blocks, the difference
#      of the two steps being the blocks' own time, their MFU against the
#      GPU's dense BF16 peak (issue 21's target: >= 45%);
#   6. with LLMC (an llm.c train_gpt2cu binary, scripts/gpu_bundle.sh builds
#      it): llm.c's GPT-2 (LLMC_DEPTH 24: 1024 wide) beside dhp on an LLM of
#      the same shape, tokens/s of each at batch LLMC_BATCH x LLMC_SEQ (1024) tokens.
# Without a usable GPU it says so in one line after the build and exits 0.
# Everything it prints goes to $OUT/gpu_check.log (OUT default
# /tmp/dhp-gpu-check), each step's full output to $OUT/<step>.txt.
# Knobs (a test runs the whole logic through the CPU emulator with
# DHP=build/dhp-emu and tiny models): DHP, GPU_BUNDLE, MODEL, BATCH, IMAGE,
# PATCH, MERGE, TEXT, STEPS, WARMUP, PRECISIONS, EQ_MODELS, EQ_STEPS,
# CURVE_STEPS (0: no curve), BLOCK_LAYERS, BLOCK_SEQ, BLOCK_BATCH,
# BLOCK_STEPS, LLMC, LLMC_DEPTH, LLMC_BATCH, LLMC_STEPS, LLMC_SEQ (<= 1024),
# LLMC_VOCAB (dhp's side: GPT-2's padded 50304), PROFILE_ARGS, GPUS,
# GPU_NAME (default: nvidia-smi's).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhp-gpu-check}
mkdir -p "$OUT" || exit 1
LOG=$OUT/gpu_check.log
: >"$LOG"
MODEL=${MODEL:-bench/dhp-1b.json}
BATCH=${BATCH:-8} IMAGE=${IMAGE:-448} PATCH=${PATCH:-14} MERGE=${MERGE:-2} TEXT=${TEXT:-512}
STEPS=${STEPS:-30} WARMUP=${WARMUP:-5} PRECISIONS=${PRECISIONS:-"bf16-mixed fp32"}
EQ_MODELS=${EQ_MODELS:-"tiny-vl tiny-llava tiny-omni"} EQ_STEPS=${EQ_STEPS:-4}
CURVE_STEPS=${CURVE_STEPS:-100}
BLOCK_LAYERS=${BLOCK_LAYERS:-"8 16"} BLOCK_SEQ=${BLOCK_SEQ:-4096} BLOCK_BATCH=${BLOCK_BATCH:-2} BLOCK_STEPS=${BLOCK_STEPS:-12}
LLMC_DEPTH=${LLMC_DEPTH:-24} LLMC_BATCH=${LLMC_BATCH:-16} LLMC_STEPS=${LLMC_STEPS:-30} LLMC_SEQ=${LLMC_SEQ:-1024}
LLMC_VOCAB=${LLMC_VOCAB:-50304}
PROFILE_ARGS=${PROFILE_ARGS:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# the CPU runs here are tiny models' references: one BLAS thread each (16 would mostly wait on each other)
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
REPORT="python3 bench/gpu_check_report.py"
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }
# step NAME CMD...: runs CMD with its output in $OUT/NAME.txt; prints exit code, seconds and its tail
step() {
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    say "== $name: exit $rc, $((SECONDS - t0)) s"
    tail -n "${TAIL:-25}" "$OUT/$name.txt" | tee -a "$LOG"
    return $rc
}
failed() { FAILED=1; say "gpu_check: FAILED: $*"; }
# report NAME ARGS...: a bench/gpu_check_report.py figure into the log; a failure is the check's
report() { $REPORT "$@" 2>&1 | tee -a "$LOG"; }

# ---- 0. dhp: the bundle, or a build here ----
if [ -n "${GPU_BUNDLE:-}" ]; then
    case $GPU_BUNDLE in
        *.tar.gz) rm -rf /tmp/dhp-gpu-bundle && mkdir -p /tmp/dhp-gpu-bundle \
                      && tar xzf "$GPU_BUNDLE" -C /tmp/dhp-gpu-bundle || { say "gpu_check: FAILED: unpacking $GPU_BUNDLE"; exit 1; }
                  GPU_BUNDLE=$(dirname "$(ls /tmp/dhp-gpu-bundle/*/env.sh | head -n 1)");;
    esac
    [ -f "$GPU_BUNDLE/env.sh" ] || { say "gpu_check: FAILED: $GPU_BUNDLE has no env.sh (scripts/gpu_bundle.sh makes it)"; exit 1; }
    . "$GPU_BUNDLE/env.sh"
    LLMC=${LLMC:-$([ -x "$GPU_BUNDLE/llmc/train_gpt2cu" ] && echo "$GPU_BUNDLE/llmc/train_gpt2cu")}
    unresolved=$(ldd "$DHP" | grep 'not found' | awk '{print $1}' | tr '\n' ' ')
    [ -z "$unresolved" ] || { say "gpu_check: FAILED: the bundle's dhp needs what this machine lacks: $unresolved"; exit 1; }
    say "gpu_check: dhp from the bundle $GPU_BUNDLE"
elif [ "${GPU_CHECK_BUILD:-1}" = 1 ]; then
    TAIL=5 step build make -j"$(nproc)" dhp || { say "gpu_check: FAILED: build"; exit 1; }
fi
DHP=${DHP:-./dhp}
LLMC=${LLMC:-}
[ -x "$DHP" ] || { say "gpu_check: FAILED: $DHP not built"; exit 1; }

# ---- 1. profile: the kernel checks, then the executor's kernels and collectives ----
"$DHP" profile --backend cuda --tf32 $PROFILE_ARGS -o "$OUT/gpu.json" --cluster-out "$OUT/cluster-1.json" \
    >"$OUT/profile.txt" 2>&1
rc=$?
if [ "$rc" != 0 ] && grep -qE "no CUDA device|without CUDA" "$OUT/profile.txt"; then
    say "gpu_check: no usable GPU ($(tail -n 1 "$OUT/profile.txt")): built only, nothing measured"
    exit 0
fi
say "== profile (kernel checks + dhp profile --backend cuda): exit $rc"
tee -a "$LOG" <"$OUT/profile.txt"
[ "$rc" = 0 ] || { failed "dhp profile --backend cuda"; exit 1; }
export GPU_NAME=${GPU_NAME:-$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)}
GPUS=${GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')}
say "gpu: ${GPU_NAME:-unnamed}, $GPUS visible"
if [ "${GPUS:-0}" -gt 1 ] && command -v mpirun >/dev/null; then
    step "profile_nccl_$GPUS" mpirun -np "$GPUS" "$DHP" profile --backend cuda --quick --cluster-out "$OUT/cluster-$GPUS.json" \
        || failed "dhp profile --backend cuda on $GPUS GPUs (NCCL)"
fi

# ---- 2. equivalence: the CUDA backend against the CPU backend, same plans ----
"$DHP" data synth --out "$OUT/eq-data" --samples 32 --window 0 >/dev/null \
    && "$DHP" data synth --out "$OUT/eq-audio" --samples 32 --window 0 --audio >/dev/null \
    && "$DHP" data synth --out "$OUT/eq-clip" --samples 32 --image-size 16 --merge 1 --window 0 >/dev/null \
    || failed "dhp data synth"
eq_data() { case "$1" in *omni*|*audio*) echo "$OUT/eq-audio";; *llava*) echo "$OUT/eq-clip";; *) echo "$OUT/eq-data";; esac; }
eq_workload() { case "$1" in *omni*|*audio*) echo "--vision-tokens 64 --audio-frames 32";; *llava*) echo "--vision-tokens 16";; *) echo "--vision-tokens 64";; esac; }
# eq_run NAME NP PLAN DATA BACKEND [run options]: EQ_STEPS steps into $OUT/eq-NAME-BACKEND.log
eq_run() {
    local name=$1 np=$2 plan=$3 data=$4 be=$5; shift 5
    local launch=()
    [ "$np" -gt 1 ] && launch=(mpirun -np "$np")
    "${launch[@]}" "$DHP" run "$plan" --data "$data" --steps "$EQ_STEPS" --backend "$be" "$@" --log-json \
        >"$OUT/eq-$name-$be.log" 2>"$OUT/eq-$name-$be.err" \
        || { failed "equivalence $name: the $be run: $(tail -n 1 "$OUT/eq-$name-$be.err")"; return 1; }
}
# eq_check LABEL A.log B.log TOL [MIN]: the verdict line of gpu_check_report.py compare
eq_check() {
    local label=$1 verdict; shift
    if verdict=$($REPORT compare "$@"); then say "  equivalence $label: ok, $verdict"
    else failed "equivalence $label: $verdict"; fi
}
say "== equivalence: $EQ_STEPS steps, --backend cuda against --backend cpu"
for m in $EQ_MODELS; do
    for prec in fp32 bf16-mixed; do
        plan="$OUT/eq-$m-$prec.json"
        "$DHP" plan --model "$m" --cluster "$OUT/cluster-1.json" --batch 8 --text-tokens 48 --precision "$prec" --target dhp \
            $(eq_workload "$m") --placement colocated --no-baselines -o "$plan" >"$OUT/eq-$m-$prec.plan.txt" 2>&1 \
            || { failed "equivalence $m: dhp plan --precision $prec: $(tail -n 1 "$OUT/eq-$m-$prec.plan.txt")"; continue; }
        eq_run "$m-$prec" 1 "$plan" "$(eq_data "$m")" cpu && eq_run "$m-$prec" 1 "$plan" "$(eq_data "$m")" cuda || continue
        a="$OUT/eq-$m-$prec-cpu.log" b="$OUT/eq-$m-$prec-cuda.log"
        if [ "$prec" = fp32 ]; then eq_check "$m fp32" "$a" "$b" 1e-5
        else
            eq_check "$m bf16-mixed, cuda vs cpu" "$a" "$b" 2.44140625e-4
            [ -s "$OUT/eq-$m-fp32-cpu.log" ] && eq_check "$m bf16-mixed (cuda) vs fp32 (cpu)" "$OUT/eq-$m-fp32-cpu.log" "$b" 0.015625 1e-6
        fi
    done
done
if [ "${GPUS:-0}" -gt 1 ] && command -v mpirun >/dev/null; then
    for spec in "dp2:vision:dp=2;llm:dp=2,zero=0" "tp2:vision:sp=2,dp=1;llm:tp=2,dp=1,seqpar=0" \
                "z3_dp2:vision:dp=2,zero=3;llm:dp=2,zero=3"; do
        name=${spec%%:*} strategy=${spec#*:}
        plan="$OUT/eq-$name.json"
        if "$DHP" plan --model tiny-vl --cluster "$OUT/cluster-$GPUS.json" --batch 8 --vision-tokens 64 --text-tokens 48 \
               --precision fp32 --placement colocated --strategy "$strategy" --gpus 2 -o "$plan" >"$OUT/eq-$name.plan.txt" 2>&1; then
            eq_run "$name-nccl" 2 "$plan" "$OUT/eq-data" cpu && eq_run "$name-nccl" 2 "$plan" "$OUT/eq-data" cuda --comm nccl \
                && eq_check "$name over NCCL" "$OUT/eq-$name-nccl-cpu.log" "$OUT/eq-$name-nccl-cuda.log" 1e-5
        else failed "equivalence $name: dhp plan: $(tail -n 1 "$OUT/eq-$name.plan.txt")"; fi
    done
fi

# ---- 3. the 100-step bf16-mixed curve on the GPU against fp32 ----
if [ "$CURVE_STEPS" -gt 0 ]; then
    TAIL=8 step curve env DHP="$DHP" CURVE_STEPS="$CURVE_STEPS" CURVE_BACKEND=cuda CURVE_TWO_RANKS=0 \
        bash bench/bf16_curve.sh "$OUT/curve" || failed "the bf16-mixed loss curve on the GPU (bench/bf16_curve.sh)"
fi

# ---- 4. a ~1B-parameter plan, STEPS steps on one GPU, in each precision ----
"$DHP" data synth --out "$OUT/train-data" --samples $((BATCH * 4)) --image-size "$IMAGE" --patch "$PATCH" \
    --merge "$MERGE" --window 0 --text-tokens "$TEXT" --shards 1 >/dev/null || failed "dhp data synth (training)"
for prec in $PRECISIONS; do
    say "== train: $MODEL, batch $BATCH, image $IMAGE px (patch $PATCH, merge $MERGE), $TEXT text tokens, $prec, $STEPS steps on 1 GPU"
    p="$OUT/train-$prec"
    if "$DHP" plan --model "$MODEL" --cluster "$OUT/cluster-1.json" --batch "$BATCH" --image-size "$IMAGE" --text-tokens "$TEXT" \
           --precision "$prec" --target dhp --placement colocated --strategy "vision:dp=1;llm:dp=1" --gpus 1 -o "$p-plan.json" \
           >"$p-plan.txt" 2>&1 \
       && "$DHP" memory "$p-plan.json" --json >"$p-memory.json" 2>"$p-memory.err"; then
        head -n 1 "$p-plan.txt" | tee -a "$LOG"
        t0=$SECONDS
        if "$DHP" run "$p-plan.json" --data "$OUT/train-data" --steps "$STEPS" --backend cuda --log-json >"$p.log" 2>"$p.err"; then
            say "  $STEPS steps in $((SECONDS - t0)) s ($(head -n 1 "$p.err"))"
            report train "$p-plan.json" "$p-memory.json" "$p.log" "$WARMUP" || failed "the $prec training report"
        else failed "dhp run $MODEL $prec: $(tail -n 2 "$p.err")"; fi
    else failed "planning $MODEL $prec: $(tail -n 2 "$p-plan.txt" "$p-memory.err" 2>/dev/null)"; fi
done

# ---- 5. the LLM's blocks at BLOCK_SEQ tokens, bf16-mixed: two depths, their difference ----
# llm_alone LAYERS FILE [hidden heads ffn vocab]: MODEL's LLM alone (or reshaped), LAYERS blocks deep
llm_alone() {
    python3 - "$OUT/model.json" "$@" <<'PY'
import json, sys
src, layers, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
m = json.load(open(src))
llm = next(x for x in m["modules"] if x["kind"] == "llm")
llm["layers"] = layers
if len(sys.argv) > 4:   # another shape: hidden, heads, ffn, vocab
    h, heads, ffn, vocab = (int(x) for x in sys.argv[4:8])
    llm.update(hidden=h, heads=heads, kv_heads=heads, head_dim=h // heads, ffn=ffn, vocab=vocab, tied_embeddings=True)
json.dump({"schema": m["schema"], "name": f"{m['name']}-llm-{layers}", "published_params": 0,
           "source": f"{m['source']}; its LLM alone, {layers} blocks (bench/gpu_check.sh)", "modules": [llm]},
          open(out, "w"), indent=1)
PY
}
# text_run NAME MODEL_FILE BATCH SEQ DATA STEPS: a bf16-mixed plan of a text-only model, run on the GPU
text_run() {
    local name=$1 model=$2 batch=$3 seq=$4 data=$5 steps=$6
    "$DHP" plan --model "$model" --cluster "$OUT/cluster-1.json" --batch "$batch" --text-tokens "$seq" --precision bf16-mixed \
        --target dhp --strategy "llm:dp=1,rc=none,mb=$batch" --gpus 1 --no-baselines -o "$OUT/$name-plan.json" \
        >"$OUT/$name-plan.txt" 2>&1 || { failed "planning $name: $(tail -n 1 "$OUT/$name-plan.txt")"; return 1; }
    "$DHP" run "$OUT/$name-plan.json" --data "$data" --steps "$steps" --backend cuda --log-json >"$OUT/$name.log" 2>"$OUT/$name.err" \
        || { failed "dhp run $name: $(tail -n 2 "$OUT/$name.err")"; return 1; }
}
set -- $BLOCK_LAYERS
# MODEL as a file (a path) or the zoo's description of it (a name)
{ [ -f "$MODEL" ] && cp "$MODEL" "$OUT/model.json"; } || "$DHP" models "$MODEL" >"$OUT/model.json" || failed "dhp models $MODEL"
say "== blocks: the LLM of $MODEL alone, $1 and $2 blocks, batch $BLOCK_BATCH x $BLOCK_SEQ tokens, bf16-mixed, $BLOCK_STEPS steps each"
# text-only data: the loader's images are not read by a model without an encoder
"$DHP" data synth --out "$OUT/text-data" --samples $((BLOCK_BATCH * 4)) --image-size 16 --patch 4 --merge 2 --window 0 \
    --text-tokens "$BLOCK_SEQ" --shards 1 >/dev/null || failed "dhp data synth (text)"
llm_alone "$1" "$OUT/llm-$1.json" && llm_alone "$2" "$OUT/llm-$2.json" \
    && text_run "blocks-$1" "$OUT/llm-$1.json" "$BLOCK_BATCH" "$BLOCK_SEQ" "$OUT/text-data" "$BLOCK_STEPS" \
    && text_run "blocks-$2" "$OUT/llm-$2.json" "$BLOCK_BATCH" "$BLOCK_SEQ" "$OUT/text-data" "$BLOCK_STEPS" \
    && { report blocks "$WARMUP" "$OUT/blocks-$1-plan.json" "$OUT/blocks-$1.log" "$OUT/blocks-$2-plan.json" "$OUT/blocks-$2.log" \
         || failed "the blocks' report"; }

# ---- 6. llm.c beside dhp on the same shape ----
if [ -n "$LLMC" ] && [ -x "$LLMC" ]; then
    LLMC=$(cd "$(dirname "$LLMC")" && pwd)/$(basename "$LLMC")   # it runs in $OUT
    # llm.c's GPT-2 depths and their widths and heads (train_gpt2.cu, gpt2_set_hyperparameters)
    case $LLMC_DEPTH in 6) width=384 heads=6;; 12) width=768 heads=12;; 24) width=1024 heads=16;;
        36) width=1280 heads=20;; 48) width=1600 heads=25;; *) width=0 heads=0;; esac
    say "== llm.c: GPT-2 d$LLMC_DEPTH ($width wide), batch $LLMC_BATCH x $LLMC_SEQ tokens, $LLMC_STEPS steps, beside dhp's LLM of that shape"
    # llm.c's token file: 256 int32 of header (magic 20240520, version 1, count), then uint16 tokens
    [ "$width" -gt 0 ] || failed "LLMC_DEPTH $LLMC_DEPTH: not one of llm.c's GPT-2 depths 6, 12, 24, 36, 48"
    [ "$width" -gt 0 ] && python3 - "$OUT/llmc.bin" $((LLMC_BATCH * LLMC_SEQ * (LLMC_STEPS + 2) + 1)) <<'PY'
import random, struct, sys
n = int(sys.argv[2])
rng = random.Random(1)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
PY
    [ "$width" -gt 0 ] && (cd "$OUT" && "$LLMC" -i llmc.bin -j llmc.bin -e "d$LLMC_DEPTH" -b "$LLMC_BATCH" -t "$LLMC_SEQ" -x "$LLMC_STEPS" -v 1000000 -m 1 -s 0 -h 0 -r 0) \
        >"$OUT/llmc.txt" 2>&1 || failed "llm.c: $(tail -n 2 "$OUT/llmc.txt")"
    # dhp on GPT-2's shape: its heads, an MLP of GPT-2's FLOPs (SwiGLU: 3 matrices 8/3 the width), its padded vocabulary
    [ "$width" -gt 0 ] && "$DHP" data synth --out "$OUT/llmc-data" --samples $((LLMC_BATCH * 4)) --image-size 16 --patch 4 --merge 2 --window 0 \
        --text-tokens "$LLMC_SEQ" --shards 1 >/dev/null \
        && llm_alone "$LLMC_DEPTH" "$OUT/gpt2-d$LLMC_DEPTH.json" "$width" "$heads" $((width * 8 / 3)) "$LLMC_VOCAB" \
        && text_run "gpt2-d$LLMC_DEPTH" "$OUT/gpt2-d$LLMC_DEPTH.json" "$LLMC_BATCH" "$LLMC_SEQ" "$OUT/llmc-data" "$LLMC_STEPS" \
        && { report llmc "$OUT/llmc.txt" "$WARMUP" $((LLMC_BATCH * LLMC_SEQ)) "$OUT/gpt2-d$LLMC_DEPTH-plan.json" \
                 "$OUT/gpt2-d$LLMC_DEPTH.log" || failed "the llm.c comparison"; }
else
    say "== llm.c: not given (LLMC=path to train_gpt2cu, or a bundle made with LLMC: scripts/gpu_bundle.sh)"
fi

if [ "$FAILED" = 0 ]; then say "gpu_check: all passed (log: $LOG)"; else say "gpu_check: some checks FAILED (log: $LOG)"; fi
exit "$FAILED"
