#!/usr/bin/env bash
# Whatever `dhp plan` chooses, `dhp run` runs and `dhp simulate` prices: every
# tiny zoo model (vision, audio, both encoders at once), planned on CPU clusters of 1, 2, 4 and 8 ranks (the measured
# cpu-4 host with its node widened or narrowed), colocated and disaggregated;
# the chosen plan and its four next-best alternatives in fp32, and the chosen plan
# under dhp plan's default precision (bf16-mixed), each simulate and train 3 steps
# under mpirun (in the sanitizer build, DHP_SANITIZED, make test-asan: 2 steps,
# step 3 runs step 2's code again, and the fp32 pick 0 only).
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip zoo_run "mpirun not found"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
HERE=$(cd "$(dirname "$0")" && pwd)
STEPS=3
[ -n "${DHP_SANITIZED:-}" ] && STEPS=2
MODELS=${ZOO_MODELS:-"tiny-vl tiny-vl-window tiny-audio tiny-omni tiny-llava"}

# cpu-N: the cpu-4 profile with N ranks on the node (processor sets alternate as measured)
for n in 1 2 4 8; do
    /usr/bin/python3 - "$HERE/../costdb/clusters/cpu-4.json" "$T/cpu-$n.json" "$n" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); n = int(sys.argv[3])
c["name"] = "cpu-%d" % n
p = c["pools"][0]
p["gpus_per_node"] = n
p["compute_sets"]["value"] = [i % 2 for i in range(n)]
p["compute_speed"]["value"] = p["compute_speed"]["value"][:n]
json.dump(c, open(sys.argv[2], "w"))
PY
done

# data per model: tiny-vl-window's images are cut in 4x4-patch windows
"$DHP" data synth --out "$T/data-w0" --samples 64 --window 0 >/dev/null || { fail zoo_run_data "dhp data synth failed"; exit 0; }
"$DHP" data synth --out "$T/data-w16" --samples 64 --window 16 >/dev/null || { fail zoo_run_data "dhp data synth failed"; exit 0; }
# the audio models': a clip of 64 mel frames per sample, 32 rows after the conv stem
"$DHP" data synth --out "$T/data-audio" --samples 64 --window 0 --audio >/dev/null || { fail zoo_run_data "dhp data synth --audio failed"; exit 0; }
# tiny-llava's CLIP tower: 16 px images of 4 px patches, unmerged, in raster order (16 patches + the class row)
"$DHP" data synth --out "$T/data-clip" --samples 64 --image-size 16 --merge 1 --window 0 >/dev/null || { fail zoo_run_data "dhp data synth failed"; exit 0; }
data_of() { case "$1" in *window*) echo "$T/data-w16";; *audio*|*omni*) echo "$T/data-audio";; *llava*) echo "$T/data-clip";; *) echo "$T/data-w0";; esac; }
modules_of() { /usr/bin/python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['modules']))" "$HERE/../models/zoo/$1.json"; }
workload_of() { case "$1" in *audio*|*omni*) echo "--audio-frames 32";; *llava*) echo "--vision-tokens 16";; esac; }

strategy_of() {
    /usr/bin/python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
print(p['placement'], ' '.join('%s:dp=%d,tp=%d,sp=%d,pp=%d,zero=%d,mb=%d,rc=%s%s' % (m['module'], m['dp'], m['tp'], m['sp'], m['pp'],
      m['zero'], m['micro_batch'], m['recompute'], ',seqpar' if m['seq_parallel'] else '') for m in p['modules']))" "$1"
}

# one plan: pick K of the search under PRECISION ("" = dhp plan's default, bf16-mixed), simulated and
# trained; returns 1 when the search has no plan K (fewer plans than 5 is its answer, not a failure)
run_pick() {
    local model=$1 n=$2 pl=$3 k=$4 prec=$5 name f s w
    name="zoo_run_${model}_cpu${n}_${pl}_pick$k${prec:+_$prec}"
    f="$T/$model-$n-$pl-$k-${prec:-default}.json"
    if ! "$DHP" plan --model "$model" --cluster "$T/cpu-$n.json" --batch 8 --vision-tokens 64 --text-tokens 48 \
           ${prec:+--precision $prec} $(workload_of "$model") --placement "$pl" --pick "$k" --no-baselines -o "$f" >"$T/plan.out" 2>&1; then
        grep -q "the search found" "$T/plan.out" && [ "$k" -gt 0 ] && return 1
        fail "$name" "$(head -c 300 "$T/plan.out")"; return 0
    fi
    s=$(strategy_of "$f")
    w=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['world_size'])" "$f")
    if ! "$DHP" simulate "$f" >"$T/sim.out" 2>&1; then fail "$name" "$s: simulate: $(head -c 300 "$T/sim.out")"; return 0; fi
    if timeout 300 mpirun --oversubscribe -np "$w" "$DHP" run "$f" --data "$(data_of "$model")" --steps $STEPS --log-json \
           >"$T/run.log" 2>"$T/run.err" && [ "$(grep -c '^{' "$T/run.log")" = "$STEPS" ]; then
        echo "# $model cpu-$n $pl pick $k ${prec:-default precision}: $s"
        ok "$name"
    else fail "$name" "$s: dhp run failed: $(grep -m1 -v '^ *$' "$T/run.err" | head -c 300)"; fi
}

# fp32: the chosen plan and its next four (only the chosen one under the sanitizers: the
# alternatives' strategies are t_run's, sanitized there); dhp plan's default precision: the chosen plan
PICKS="0 1 2 3 4"
[ -n "${DHP_SANITIZED:-}" ] && PICKS="0"
for model in $MODELS; do
    for n in 1 2 4 8; do
        for pl in colocated disaggregated; do
            # a disaggregated plan gives every module a group of its own: as many ranks at least
            [ "$pl" = disaggregated ] && [ "$n" -lt "$(modules_of "$model")" ] && continue
            for k in $PICKS; do run_pick "$model" "$n" "$pl" "$k" fp32 || break; done
            run_pick "$model" "$n" "$pl" 0 ""
        done
    done
done
