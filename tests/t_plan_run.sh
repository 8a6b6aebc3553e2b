#!/usr/bin/env bash
# Plan, then run the plan: the plan `dhp plan` chooses for tiny-vl on the cpu-4
# cluster and its four next-best alternatives (--pick 0..4) each simulate and
# train 3 steps under mpirun; `dhp simulate` prices the default plan
# (Qwen2.5-VL-32B on 8x H100).
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip plan_run "mpirun not found"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
SETUP="--model tiny-vl --cluster cpu-4 --batch 16 --vision-tokens 64 --text-tokens 48 --precision fp32"

"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null || { fail plan_run_data "dhp data synth failed"; exit 0; }
for k in 0 1 2 3 4; do
    name="plan_run_pick_$k"
    if ! "$DHP" plan $SETUP --pick $k -o "$T/p$k.json" >"$T/plan$k.out" 2>&1; then fail "$name" "$(head -c 300 "$T/plan$k.out")"; continue; fi
    strategy=$(/usr/bin/python3 -c "
import json, sys
p = json.load(open(sys.argv[1]))
print(p['placement'], ' '.join('%s:dp=%d,tp=%d,sp=%d,pp=%d,zero=%d,mb=%d,rc=%s%s' % (m['module'], m['dp'], m['tp'], m['sp'], m['pp'],
      m['zero'], m['micro_batch'], m['recompute'], ',seqpar' if m['seq_parallel'] else '') for m in p['modules']))" "$T/p$k.json")
    n=$(/usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['world_size'])" "$T/p$k.json")
    if ! "$DHP" simulate "$T/p$k.json" >"$T/sim$k.out" 2>&1; then fail "$name" "simulate: $(head -c 300 "$T/sim$k.out")"; continue; fi
    if timeout 120 mpirun --oversubscribe -np "$n" "$DHP" run "$T/p$k.json" --data "$T/data" --steps 3 --log-json \
        >"$T/run$k.log" 2>"$T/run$k.err" && [ "$(grep -c '^{' "$T/run$k.log")" = 3 ]; then
        echo "# pick $k: $strategy"
        ok "$name"
    else fail "$name" "$strategy: dhp run failed: $(tail -c 300 "$T/run$k.err")"; fi
done

if "$DHP" plan -o "$T/default.json" >/dev/null 2>&1 && "$DHP" simulate "$T/default.json" >"$T/sim.out" 2>&1 \
   && grep -q "simulated step" "$T/sim.out"; then ok simulate_prices_the_default_plan
else fail simulate_prices_the_default_plan "$(head -c 300 "$T/sim.out")"; fi
