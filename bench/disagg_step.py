#!/usr/bin/env python3
"""The disaggregated step: the analytic price against the simulated schedule.

For 16 models and clusters, `dhp plan --placement disaggregated --top 8`
gives 9 plans, each with its analytic step (plan_evaluate's chunk-by-chunk
recurrence, what the MILP's terms approximate) and its simulated one (the
schedule the executor runs, op by op). Prints both per plan and the median,
90th percentile and worst |analytic / simulated - 1|. With --base OTHER_DHP,
the same for that binary in the same run, and the best plan each finds
(simulated step) side by side.

Usage: bench/disagg_step.py [--dhp ./dhp] [--base OTHER_DHP]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

CASES = [
    ("qwen2.5-vl-7b", "8xh100", ["--batch", "8"]),
    ("qwen2.5-vl-7b", "8xh100", ["--batch", "32", "--vision-tokens", "4096"]),
    ("qwen2.5-vl-7b", "2x8xh100", ["--batch", "64", "--vision-tokens", "4096"]),
    ("qwen2.5-vl-32b", "16x8xa100", ["--batch", "64"]),
    ("qwen2.5-vl-32b", "2x8xh100", ["--batch", "32", "--vision-tokens", "4096"]),
    ("qwen2.5-vl-32b", "mixed-h100-a100", ["--batch", "32"]),
    ("internvl2.5-78b", "mixed-h100-a100", ["--batch", "64"]),
    ("internvl2.5-26b", "2x8xh100", ["--batch", "32"]),
    ("llava-1.5-7b", "8xh100", ["--batch", "256"]),
    ("llava-1.5-13b", "2x8xh100", ["--batch", "512"]),
    ("qwen2.5-omni-7b", "8xh100", ["--batch", "16"]),
    ("qwen2-audio-7b", "8xh100", ["--batch", "32"]),
    ("llama-3.2-vision-11b", "8xh100", ["--batch", "32"]),
    ("llama-3.2-vision-90b", "16x8xa100", ["--batch", "64"]),
    ("qwen2.5-vl-72b", "16x8xa100", ["--batch", "128"]),
    ("qwen2.5-vl-3b", "8xa100-80g", ["--batch", "32"]),
]


def plans(dhp, model, cluster, extra):
    """(analytic, simulated) per plan, the chosen one first; None if no plan."""
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([dhp, "plan", "--model", model, "--cluster", cluster, "--placement", "disaggregated",
                            "--json", "--no-baselines", "--top", "8", "-o", os.path.join(tmp, "plan.json")] + extra,
                           capture_output=True, text=True)
    if r.returncode != 0:
        return None
    d = json.loads(r.stdout)
    preds = [d["plan"]["prediction"]] + d["alternatives"]
    return [(p["analytic_step_time_s"], p["step_time_s"]) for p in preds]


def summary(errs):
    errs = sorted(abs(e) for e in errs)
    if not errs:
        return "no plans"
    return "%d plans: median %.1f%%, 90th percentile %.1f%%, worst %.1f%%" % (
        len(errs), 100 * statistics.median(errs), 100 * errs[int(0.9 * len(errs))], 100 * errs[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dhp", default="./dhp")
    ap.add_argument("--base", help="another dhp binary, run the same way beside it")
    a = ap.parse_args()
    bins = [a.dhp] + ([a.base] if a.base else [])
    errs = {b: [] for b in bins}
    print("model                  cluster           best simulated step (s) per binary; analytic / simulated - 1 per plan")
    for model, cluster, extra in CASES:
        cells = []
        for b in bins:
            ps = plans(b, model, cluster, extra)
            if ps is None:
                cells.append("no plan")
                continue
            for an, sim in ps:
                errs[b].append(an / sim - 1)
            cells.append("%.3f | %s" % (min(s for _, s in ps), " ".join("%+.1f%%" % (100 * (an / sim - 1)) for an, sim in ps)))
        print("%-22s %-16s %s" % (model, cluster, "   ||   ".join(cells)))
    for b in bins:
        print("%s: %s" % (b, summary(errs[b])))


if __name__ == "__main__":
    sys.exit(main())
