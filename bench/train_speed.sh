#!/usr/bin/env bash
# Training-step speed on the CPU: `dhp run` (fp32, OpenBLAS GEMMs + executor/cpu_kernels.c)
# against PyTorch float32 (bench/torch_train_step.py) for the same model, the same
# batch geometry and the same thread count, measured in this run.
# A step is forward + backward + gradient-norm clip + AdamW + zeroing the gradients
# in both. Each side runs ROUNDS processes (dhp and torch alternating, so a noisy
# neighbour hits both), each WARMUP steps then STEPS timed ones (dhp: step_s of
# --log-json); the median of all timed steps is reported with min-max. Prints threads,
# geometry, parameters, s/step of each and torch/dhp (> 1: dhp is faster).
# Environment knobs: MODEL BATCH IMAGE TEXT THREADS WARMUP STEPS ROUNDS
# PYTHON (default /usr/bin/python3, Debian's python3-torch) DHP, TORCH_ARGS (extra
# torch_train_step.py options, e.g. "--foreach 1 --set-to-none 1"; its defaults are
# the fastest settings measured here).
#
# PyTorch threads: torch.set_num_threads(N) (OpenMP element-wise ops) and
# OPENBLAS_NUM_THREADS=N (its GEMMs call the same OpenBLAS as dhp). Debian's torch
# links the pthread OpenBLAS next to libgomp; with both spinning on 2 cores a step
# is ~10x slower, so the torch side runs with OMP_WAIT_POLICY=PASSIVE (its best
# setting here). dhp runs with OPENBLAS_NUM_THREADS=N, which also sizes the thread
# pool of its own loops (executor/cpu_kernels.c).
set -euo pipefail
cd "$(dirname "$0")/.."
DHP=${DHP:-./dhp}
PY=${PYTHON:-/usr/bin/python3}
MODEL=${MODEL:-dhp-100m}
BATCH=${BATCH:-2}
IMAGE=${IMAGE:-64}
TEXT=${TEXT:-64}
THREADS=${THREADS:-"2 1"}
WARMUP=${WARMUP:-2}
STEPS=${STEPS:-5}
ROUNDS=${ROUNDS:-2}
MODEL_JSON=models/zoo/$MODEL.json

if ! "$PY" -c 'import torch' 2>/dev/null; then
    echo "skipped: $PY cannot import torch (apt-get install python3-torch)"
    exit 0
fi
[ -x "$DHP" ] || { echo "train_speed: $DHP not built (make)" >&2; exit 1; }
[ -f "$MODEL_JSON" ] || { echo "train_speed: no $MODEL_JSON" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# patch and merge come from the model, so the data's vision tokens match it
read -r PATCH MERGE < <("$PY" -c '
import json, sys
v = next(m for m in json.load(open(sys.argv[1]))["modules"] if m["kind"] == "vision")
print(v["patch"], v["merge"])' "$MODEL_JSON")
GRID=$((IMAGE / PATCH))
PATCHES=$((GRID * GRID))
MERGED=$((PATCHES / (MERGE * MERGE)))

"$DHP" plan --model "$MODEL" --cluster 8xh100 --batch "$BATCH" --image-size "$IMAGE" --text-tokens "$TEXT" \
    --precision fp32 --strategy "vision:dp=1;llm:dp=1" --gpus 1 -o "$tmp/plan.json" >/dev/null
"$DHP" data synth --out "$tmp/data" --samples $((BATCH * (WARMUP + STEPS))) --image-size "$IMAGE" \
    --patch "$PATCH" --merge "$MERGE" --window 0 --text-tokens "$TEXT" --shards 1 >/dev/null

# Each appends its timed steps' seconds (after the warm-up) to a file, one per line,
# and prints the parameter count (dhp: params bytes / 4 on one rank).
dhp_steps() {
    OPENBLAS_NUM_THREADS=$1 "$DHP" run "$tmp/plan.json" --data "$tmp/data" \
        --steps $((WARMUP + STEPS)) --log-json --no-progress >"$tmp/dhp.log"
    "$PY" -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
with open(sys.argv[3], "a") as f:
    f.writelines(str(r["step_s"]) + "\n" for r in rows[int(sys.argv[2]):])
print(rows[0]["ranks"][0]["peak_bytes"]["params"] // 4)' "$tmp/dhp.log" "$WARMUP" "$2"
}

torch_steps() {
    OPENBLAS_NUM_THREADS=$1 OMP_NUM_THREADS=$1 OMP_WAIT_POLICY=PASSIVE "$PY" bench/torch_train_step.py \
        --model "$MODEL_JSON" --threads "$1" --batch "$BATCH" --image-size "$IMAGE" --text-tokens "$TEXT" \
        --warmup "$WARMUP" --steps "$STEPS" ${TORCH_ARGS:-} >"$tmp/torch.json"
    "$PY" -c '
import json, sys
r = json.load(open(sys.argv[1]))
with open(sys.argv[2], "a") as f:
    f.writelines(str(t) + "\n" for t in r["steps_s"])
print(r["params"], r["torch"])' "$tmp/torch.json" "$2"
}

# "median min max" of a file of step times
stats() { "$PY" -c '
import statistics, sys
t = [float(x) for x in open(sys.argv[1])]
print(statistics.median(t), min(t), max(t))' "$1"; }

printf 'train step  %s, batch %d x (1 image %dx%d -> %d patches -> %d merged tokens + %d text tokens), fp32 CPU\n' \
    "$MODEL" "$BATCH" "$IMAGE" "$IMAGE" "$PATCHES" "$MERGED" "$TEXT"
printf '            median of %d x %d steps (%d warm-up steps per process, dhp and torch alternating), same run\n' \
    "$ROUNDS" "$STEPS" "$WARMUP"
printf '%-8s %-12s %-12s %-22s %-22s %s\n' threads dhp-params torch-params "dhp s/step (min-max)" \
    "torch s/step (min-max)" "torch/dhp"
for n in $THREADS; do
    : >"$tmp/dhp.$n"
    : >"$tmp/torch.$n"
    for _ in $(seq "$ROUNDS"); do
        dhp_params=$(dhp_steps "$n" "$tmp/dhp.$n")
        read -r torch_params torch_ver < <(torch_steps "$n" "$tmp/torch.$n")
    done
    read -r dhp_s dhp_lo dhp_hi < <(stats "$tmp/dhp.$n")
    read -r torch_s torch_lo torch_hi < <(stats "$tmp/torch.$n")
    note=
    [ "$dhp_params" = "$torch_params" ] || note="  (parameter counts differ!)"
    printf '%-8s %-12s %-12s %-22s %-22s %.2fx%s\n' "$n" "$dhp_params" "$torch_params" \
        "$(printf '%.3f (%.2f-%.2f)' "$dhp_s" "$dhp_lo" "$dhp_hi")" \
        "$(printf '%.3f (%.2f-%.2f)' "$torch_s" "$torch_lo" "$torch_hi")" \
        "$(awk "BEGIN { print $torch_s / $dhp_s }")" "$note"
done
echo "            torch $torch_ver; ratio > 1: dhp is faster (target >= 1)"
