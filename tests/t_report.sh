#!/usr/bin/env bash
# dhp plan --report and dhp simulate --report: the HTML loads in headless
# Chromium (Debian's; make deps installs it) with no console error, its script
# draws every section, and a screenshot is taken; the file fetches nothing.
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's own allocations under the ASan build
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then fail report_chromium "chromium not installed: run make deps"; exit 0; fi

# report_loads NAME FILE: Chromium's console has no error and the page rendered.
report_loads() {
    local name=$1 file=$2
    # The script's last statement marks the body; window.onerror would mark an error instead.
    timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --enable-logging=stderr --v=0 \
        --virtual-time-budget=5000 --dump-dom "file://$file" >"$T/$name.dom" 2>"$T/$name.log"
    if grep -E "CONSOLE|Uncaught|SyntaxError|TypeError|ReferenceError" "$T/$name.log" >"$T/$name.errs"; then
        fail "$name" "console: $(head -c 300 "$T/$name.errs")"; return
    fi
    local svgs; svgs=$(grep -o "<svg" "$T/$name.dom" | wc -l)
    if ! grep -q 'data-rendered="ok"' "$T/$name.dom" || [ "$svgs" -lt 3 ]; then
        fail "$name" "not rendered ($svgs svg): $(grep -o 'data-rendered="[^"]*"' "$T/$name.dom")"; return
    fi
    timeout 120 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1000 \
        --screenshot="$T/$name.png" "file://$file" >/dev/null 2>&1
    if [ -s "$T/$name.png" ] && [ "$(head -c 4 "$T/$name.png" | od -An -c | tr -d ' ')" = "211PNG" ]; then ok "$name"
    else fail "$name" "no screenshot"; fi
}

# Qwen2.5-VL-32B's plan on 8 GPUs: its step is not one the simulator runs, the page says why.
if "$DHP" plan --report "$T/plan.html" -o "$T/plan.json" >/dev/null 2>"$T/err"; then
    report_loads report_plan "$T/plan.html"
    grep -q 'No simulated timeline' "$T/report_plan.dom" && grep -q 'rank 7' "$T/report_plan.dom" &&
        grep -q 'zero3 (colocated)' "$T/report_plan.dom" && grep -q 'gemm: ' "$T/report_plan.dom" && ok report_plan_content ||
        fail report_plan_content "sections missing in the rendered page"
else fail report_plan "$(head -c 300 "$T/err")"; fi
if grep -qE '(src|href)="(https?:)?//' "$T/plan.html"; then fail report_self_contained "the page links outside itself"
else ok report_self_contained; fi

# A module's strategy line names ring attention where its sp runs one (the LLM's cp=ring)
if "$DHP" plan --model tiny-vl --cluster 8xh100 --batch 8 --vision-tokens 64 --text-tokens 64 \
       --strategy 'vision:sp=2;llm:sp=2,cp=ring' --gpus 2 --report "$T/ring.html" -o "$T/ring.json" >/dev/null 2>"$T/err" \
   && grep -q 'sp 2 pp 1, ZeRO [0-9], recompute none, micro-batch [0-9]*, ring attention over sp' "$T/ring.html"
then ok report_names_ring_attention
else fail report_names_ring_attention "$(head -c 300 "$T/err")"; fi

# A plan dhp run executes: simulated and measured steps side by side.
"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null 2>&1
"$DHP" plan --model tiny-vl --cluster cpu-4 --batch 16 --vision-tokens 64 --text-tokens 48 --precision fp32 \
    --placement disaggregated --n-micro 4 --strategy 'vision:gpus=1;llm:gpus=2,tp=2,seqpar=0' -o "$T/tiny.json" \
    >/dev/null 2>"$T/err" || fail report_tiny_plan "$(head -c 300 "$T/err")"
if timeout 120 mpirun --oversubscribe -np 3 "$DHP" run "$T/tiny.json" --data "$T/data" --steps 2 \
        --trace "$T/run.trace" >/dev/null 2>"$T/err" &&
   "$DHP" simulate "$T/tiny.json" --report "$T/sim.html" --measured "$T/run.trace" >/dev/null 2>>"$T/err"; then
    report_loads report_simulate_measured "$T/sim.html"
    grep -q 'predicted: ' "$T/report_simulate_measured.dom" && grep -q 'measured: ' "$T/report_simulate_measured.dom" &&
        ok report_timeline_both || fail report_timeline_both "predicted and measured panels missing"
else fail report_simulate_measured "$(head -c 300 "$T/err")"; fi

# Names from user files cannot end the page's script.
sed 's/"name":[[:space:]]*"tiny-vl"/"name": "<\/script><b>x"/' "$T/tiny.json" >"$T/evil.json"
if ! grep -q '</script><b>x' "$T/evil.json"; then fail report_escapes_names "the test could not plant the name"
elif "$DHP" simulate "$T/evil.json" --report "$T/evil.html" >/dev/null 2>"$T/err"; then
    report_loads report_escapes_names "$T/evil.html"
    grep -q 'on cpu-4' "$T/report_escapes_names.dom" || fail report_escapes_names_title "title missing"
else fail report_escapes_names "$(head -c 300 "$T/err")"; fi

printf '{"traceEvents": 3}' >"$T/bad.trace"
expect_err report_bad_trace "bad.trace: not a JSON array of trace events" \
    "$DHP" simulate "$T/tiny.json" --report "$T/x.html" --measured "$T/bad.trace"
if [ -e "$T/x.html" ]; then fail report_bad_trace_no_file "report written despite the bad trace"; fi
expect_err report_measured_needs_report "--measured goes with --report" "$DHP" simulate "$T/tiny.json" --measured "$T/run.trace"
