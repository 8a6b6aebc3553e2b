# Helpers of the dhp run equivalence scripts (t_run.sh, t_backend.sh): plans
# under $T, runs under mpirun with losses and checkpoints, and comparisons.
# The caller sets T (tests/lib.sh), HERE and STEPS; RUN_DHP (default $DHP) is
# the binary `train` runs.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
DIFF="/usr/bin/python3 $HERE/tools/ckpt_diff.py"
SETUP="--model tiny-vl --cluster 8xh100 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32"

# plan NAME PLACEMENT STRATEGY [extra dhp plan options]; MODEL=file overrides tiny-vl
plan() {
    local name=$1 pl=$2 spec=$3; shift 3
    "$DHP" plan $SETUP ${MODEL:+--model "$MODEL"} --placement "$pl" --strategy "$spec" "$@" -o "$T/$name.json" >"$T/$name.plan.out" 2>&1\
        || { fail "run_plan_$name" "$(head -c 300 "$T/$name.plan.out")"; return 1; }
}

world() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['world_size'])" "$1"; }

# train NAME [dhp run options]: $STEPS steps, losses to NAME.losses, checkpoint in NAME.ck
train() {
    local name=$1; shift
    local n; n=$(world "$T/$name.json")
    timeout 300 mpirun --oversubscribe -np "$n" "${RUN_DHP:-$DHP}" run "$T/$name.json" --data "${DATA:-$T/data}" --steps $STEPS \
        --ckpt "$T/$name.ck" --log-json "$@" >"$T/$name.log" 2>"$T/$name.err"
}

# losses and same_losses: tests/lib.sh


# check_memory NAME TEST: `dhp simulate`'s prediction of NAME.json per rank and category, for the backend
# the run said it used (NAME.err; the CUDA backend's cuBLASLt workspace), is what the run (NAME.log,
# --log-json) allocated: parameters, gradients, optimizer, hand-off and pipeline buffers, ZeRO buffers and
# the workspace to the byte; activations within 0.1% (the executor's few sequence-offset integers per slot)
check_memory() {
    local name=$1 test=$2 out be
    be=$(sed -n 's/^backend: \(cpu\|cuda\).*/\1/p' "$T/$name.err" "$T/$name.log" 2>/dev/null | head -1)
    [ -n "$be" ] || { fail "$test" "the run did not say its backend"; return; }
    "$DHP" simulate "$T/$name.json" --backend "$be" --json >"$T/$name.sim.json" 2>"$T/err" || { fail "$test" "$(head -c 300 "$T/err")"; return; }
    if out=$(/usr/bin/python3 - "$T/$name.sim.json" "$T/$name.log" 2>&1 <<'PY'
import json, sys
sim = json.load(open(sys.argv[1]))
last = [json.loads(l) for l in open(sys.argv[2]) if l.startswith("{")][-1]
cats = [("params", ["params"]), ("grads", ["grads"]), ("optim", ["optim"]), ("activations", ["activations", "logits"]),
        ("comm", ["comm"]), ("zero_buffers", ["zero_buffers"]), ("workspace", ["workspace"])]
worst = 0
for q, r in enumerate(last["ranks"]):
    for c, terms in cats:
        p, g = sum(sim["ranks"][q]["memory"][t] for t in terms), r["peak_bytes"].get(c, 0)
        tol = 1e-3 * g if c == "activations" else 0
        if abs(p - g) > tol: sys.exit(f"rank {q} {c}: predicted {p:.0f} B, allocated {g:.0f} B")
        if g: worst = max(worst, abs(p - g) / g)
print(f"{sim['backend']}, workspace {last['ranks'][0]['peak_bytes'].get('workspace', 0):.0f} B a rank, worst {worst:.1e}")
PY
    ); then echo "# $name memory: $out"; ok "$test"; else fail "$test" "$out"; fi
}

# resume_check PLAN TEST: STEPS / 2 steps, stop, resume for the rest == STEPS straight (PLAN's run, its
# checkpoint in PLAN.ck), bit for bit
resume_check() {
    local R=$1 t=$2 half=$((STEPS / 2))
    cp "$T/$R.json" "$T/resumed_$R.json"
    if ! train "resumed_$R" --stop-after $half; then fail "$t" "first half failed: $(tail -c 300 "$T/resumed_$R.err")"
    elif ! train "resumed_$R" --resume; then fail "$t" "resume failed: $(tail -c 300 "$T/resumed_$R.err")"
    else
        local a b first
        a=$(cat "$T/resumed_$R.ck/latest"); b=$(cat "$T/$R.ck/latest")
        first=$(grep -m1 '^{' "$T/resumed_$R.log" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
        if [ "$first" != $((half + 1)) ]; then fail "$t" "the resumed run's first step is $first, not $((half + 1))"
        elif [ "$a" = "$b" ] && cmp -s "$T/resumed_$R.ck/$a/llm.safetensors" "$T/$R.ck/$b/llm.safetensors" \
           && cmp -s "$T/resumed_$R.ck/$a/vision.safetensors" "$T/$R.ck/$b/vision.safetensors"; then
            ok "$t"
        else fail "$t" "checkpoints after $half + resume differ from $STEPS straight ($a vs $b)"; fi
    fi
}
