#!/usr/bin/env bash
# Planner speed. Prints the planner's wall time for
#   (a) Qwen2.5-VL-32B on 8 x H100 (target < 0.5 s), against exhaustive
#       enumeration of the same candidates measured in the same run, and
#   (b) Qwen2.5-Omni-7B thinker (vision + audio + LLM) on 1,024 GPUs of two
#       types (64 x 8 H100 + 64 x 8 A100, target < 5 s).
set -euo pipefail
cd "$(dirname "$0")/.."
DHP=${DHP:-./dhp}
out=$(mktemp)   # the plan file (not /dev/null: a dhp older than its in-place writes would rename over it)
trap 'rm -f "$out"' EXIT
calc() { awk "BEGIN { print $1 }"; }
secs() { local t0 t1; t0=$(date +%s.%N); "$@" >/dev/null; t1=$(date +%s.%N); calc "$t1 - $t0"; }
best_of() { local best=; for _ in 1 2 3; do t=$(secs "$@"); if [ -z "$best" ] || [ "$(calc "$t < $best")" = 1 ]; then best=$t; fi; done; echo "$best"; }
verdict() { [ "$(calc "$1 < $2")" = 1 ] && echo met || echo MISSED; }

milp=$(best_of "$DHP" plan --no-baselines --top 0 -o "$out" --vision-tokens 16384 --batch 8)
exh=$(best_of "$DHP" plan --no-baselines --exhaustive -o "$out" --vision-tokens 16384 --batch 8)
printf 'plan  8 GPUs, 2 modules:      MILP %.3f s, exhaustive %.3f s, exhaustive/MILP %.2fx, target 0.5 s: %s\n' \
    "$milp" "$exh" "$(calc "$exh / $milp")" "$(verdict "$milp" 0.5)"
big=$(best_of "$DHP" plan --no-baselines --top 0 -o "$out" --model qwen2.5-omni-7b --cluster bench/cluster-1024-h100-a100.json \
      --batch 1024 --vision-tokens 4096 --audio-frames 1500)
printf 'plan  1,024 GPUs, 2 GPU types, 3 modules: MILP %.3f s, target 5 s: %s (%.2fx of the budget)\n' \
    "$big" "$(verdict "$big" 5)" "$(calc "$big / 5")"
