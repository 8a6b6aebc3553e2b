#!/usr/bin/env python3
"""Fidelity of dhp's predictions on this machine (issue: simulator and profiler).

For each rank count the plans use, `mpirun -np N dhp profile --quick` measures
this host into a cluster file; then for every plan of a small model (colocated
and disaggregated, SP / TP / DP / ZeRO-1 mixes, 1-4 ranks) it runs
`dhp simulate` (predicted) and `dhp run` (measured: median step time of the
steps after warm-up, per-rank peak bytes per category as the executor
allocated them) and prints both with the error of each, and whether the
planner's ranking of the plans matches the measured one.

Usage: bench/fidelity.py [--dhp ./dhp] [--steps 30] [--full-profile] [--json OUT]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SETUP = ["--model", "tiny-vl", "--batch", "16", "--vision-tokens", "64", "--text-tokens", "48",
         "--precision", "fp32"]
PLANS = [  # name, placement, strategy, extra dhp plan options
    ("c1", "colocated", "vision:dp=1,mb=16;llm:dp=1,mb=16", ["--gpus", "1"]),
    ("c2_dp", "colocated", "vision:dp=2,mb=8,zero=0;llm:dp=2,mb=8,zero=0", ["--gpus", "2"]),
    ("c2_sp_tp", "colocated", "vision:sp=2,dp=1,mb=16;llm:tp=2,dp=1,mb=16,seqpar=0", ["--gpus", "2"]),
    ("d2_1_1", "disaggregated", "vision:gpus=1;llm:gpus=1", ["--n-micro", "4"]),
    ("d3_1_tp2", "disaggregated", "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", ["--n-micro", "4"]),
    ("d3_2_1", "disaggregated", "vision:gpus=2,dp=2;llm:gpus=1", ["--n-micro", "2"]),
    ("c4_dp_zero1", "colocated", "vision:dp=4,mb=4,zero=1;llm:dp=4,mb=4,zero=1", ["--gpus", "4"]),
    ("d4_sp2_dp2", "disaggregated", "vision:gpus=2,sp=2;llm:gpus=2,dp=2,zero=1", ["--n-micro", "2"]),
]
# Executor categories (executor log "peak_bytes") and the simulator's terms they hold.
CATS = [("params", ["params"]), ("grads", ["grads"]), ("optim", ["optim"]),
        ("activations", ["activations", "logits"]), ("comm", ["comm"])]


def sh(cmd, env, **kw):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def mpirun(n, args):
    return ["mpirun", "--oversubscribe", "-np", str(n)] + args


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dhp", default=os.path.join(os.path.dirname(__file__), "..", "dhp"))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--full-profile", action="store_true")
    ap.add_argument("--json")
    a = ap.parse_args()
    dhp = os.path.abspath(a.dhp)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", OMPI_MCA_mpi_yield_when_idle="1")
    tmp = tempfile.mkdtemp(prefix="dhp-fidelity.")
    data = os.path.join(tmp, "data")
    sh([dhp, "data", "synth", "--out", data, "--samples", "1024", "--window", "0"], env)

    clusters = {}
    rows = []
    for name, placement, spec, extra in PLANS:
        plan = os.path.join(tmp, name + ".json")
        probe = sh([dhp, "plan"] + SETUP + ["--cluster", "8xh100", "--placement", placement,
                   "--strategy", spec] + extra + ["-o", plan, "--json"], env)
        n = json.loads(probe)["world_size"]
        if n not in clusters:
            clusters[n] = os.path.join(tmp, f"cpu-{n}.json")
            sh(mpirun(n, [dhp, "profile", "-o", os.path.join(tmp, f"gpu-{n}.json"), "--cluster-out", clusters[n]]
                      + ([] if a.full_profile else ["--quick"])), env)
        sh([dhp, "plan"] + SETUP + ["--cluster", clusters[n], "--placement", placement, "--strategy", spec]
           + extra + ["-o", plan], env)
        sim = json.loads(sh([dhp, "simulate", plan, "--json"], env))
        log = sh(mpirun(n, [dhp, "run", plan, "--data", data, "--steps", str(a.steps), "--log-json"]), env)
        steps = [json.loads(l) for l in log.splitlines() if l.startswith("{")]
        measured = statistics.median(s["step_s"] for s in steps[a.warmup:])
        mem = []
        for q in range(n):
            got = steps[-1]["ranks"][q]["peak_bytes"]
            pred = sim["ranks"][q]["memory"]
            mem.append({c: (sum(pred[t] for t in terms), got[c]) for c, terms in CATS})
        rows.append({"plan": name, "ranks": n, "predicted_s": sim["step_time_s"], "measured_s": measured,
                     "memory": mem})

    print(f"{'plan':<13} {'ranks':>5} {'predicted s':>12} {'measured s':>11} {'error':>7}")
    worst_t = 0.0
    for r in rows:
        e = r["predicted_s"] / r["measured_s"] - 1
        worst_t = max(worst_t, abs(e))
        print(f"{r['plan']:<13} {r['ranks']:>5} {r['predicted_s']:>12.5f} {r['measured_s']:>11.5f} {e:>+7.1%}")
    print()
    print("peak memory per rank, KiB predicted / measured (error)")
    print(f"{'plan':<13} {'rank':>4} " + " ".join(f"{c:>24}" for c, _ in CATS))
    worst_m = {c: 0.0 for c, _ in CATS}
    for r in rows:
        for q, m in enumerate(r["memory"]):
            cells = []
            for c, _ in CATS:
                p, g = m[c]
                e = (p - g) / g if g else (0.0 if p == 0 else float("inf"))
                worst_m[c] = max(worst_m[c], abs(e))
                cells.append(f"{p / 1024:>8.1f} / {g / 1024:>7.1f} ({e:>+5.1%})")
            print(f"{r['plan']:<13} {q:>4} " + " ".join(f"{x:>24}" for x in cells))
    pred_rank = [r["plan"] for r in sorted(rows, key=lambda r: r["predicted_s"])]
    meas_rank = [r["plan"] for r in sorted(rows, key=lambda r: r["measured_s"])]
    print()
    print("ranking by predicted step time:", " < ".join(pred_rank))
    print("ranking by measured step time: ", " < ".join(meas_rank))
    print(f"ranking matches: {'yes' if pred_rank == meas_rank else 'no'}")
    print(f"worst step-time error {worst_t:.1%} (target 15%); worst memory error per category: "
          + ", ".join(f"{c} {v:.1%}" for c, v in worst_m.items()) + " (target 5%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


main()
