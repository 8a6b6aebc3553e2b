#!/usr/bin/env bash
# All benchmarks. Each prints ratios against a baseline measured in the same run.
set -euo pipefail
cd "$(dirname "$0")"
for b in plan_speed.sh train_speed.sh; do echo "== $b"; bash "$b"; done
echo "== attn_threads"; ../build/attn_threads
echo "== fidelity.py"; /usr/bin/python3 fidelity.py --dhp ../dhp
echo "== published.py"; /usr/bin/python3 published.py --dhp ../dhp
echo "== disagg_step.py"; /usr/bin/python3 disagg_step.py --dhp ../dhp
