#!/usr/bin/env python3
"""A pipeline's bubble, predicted and measured.

Runs one plan's step through `dhp simulate --trace` and `dhp run --trace`
(the last of --steps measured steps), and for every rank prints the share of
the step its compute ops leave idle, both ways, beside the textbook 1F1B
bubble (pp - 1) / (m + pp - 1) of an LLM stage with m micro-batches (Narayanan
et al., arXiv 2104.04473, sec. 2.2; (pp - 1) / (vp m + pp - 1) interleaved).
The two traces hold the same events (the executor writes its measured step
with the simulator's writer), so the comparison is event for event.

Usage: bench/pipeline_bubble.py PLAN.json --data DIR [--dhp ./dhp] [--steps 6]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def sh(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def compute_share(trace_path):
    """Per rank: (step span, seconds in compute-lane events) of the trace."""
    with open(trace_path) as f:
        ev = json.load(f)
    ev = ev if isinstance(ev, list) else ev["traceEvents"]
    lanes = {(e["pid"], e["tid"]): e["args"]["name"] for e in ev if e.get("ph") == "M" and e.get("name") == "thread_name"}
    t0 = min(e["ts"] for e in ev if e.get("ph") == "X")
    t1 = max(e["ts"] + e["dur"] for e in ev if e.get("ph") == "X")
    busy = {}
    for e in ev:
        if e.get("ph") == "X" and lanes.get((e["pid"], e["tid"]), "") == "compute":
            busy[e["pid"]] = busy.get(e["pid"], 0.0) + e["dur"]
    return (t1 - t0) / 1e6, {r: b / 1e6 for r, b in busy.items()}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan")
    ap.add_argument("--data", required=True)
    ap.add_argument("--dhp", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "dhp"))
    ap.add_argument("--steps", type=int, default=6)
    a = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    with open(a.plan) as f:
        plan = json.load(f)
    tmp = tempfile.mkdtemp(prefix="dhp-bubble.")
    sim_trace, run_trace = os.path.join(tmp, "sim.json"), os.path.join(tmp, "run.json")
    sh([a.dhp, "simulate", a.plan, "--trace", sim_trace], env)
    # ranks bound to cores round-robin, as `dhp profile` ran when it measured
    # the cluster file the plan was priced on (bench/fidelity.py does the same)
    sh(["mpirun", "--oversubscribe", "--bind-to", "core:overload-allowed", "-np", str(plan["world_size"]), a.dhp, "run",
        a.plan, "--data", a.data, "--steps", str(a.steps), "--trace", run_trace], env)
    sim_step, sim_busy = compute_share(sim_trace)
    run_step, run_busy = compute_share(run_trace)
    llm = next(m for m in plan["modules"] if m["module"] == "llm")
    per_rank = plan["workload"]["global_batch"] / llm["dp"]
    m = int(-(-per_rank // llm["micro_batch"]))
    pp, vp = llm["pp"], llm.get("vp", 1)
    print(f"step: simulated {sim_step:.4f} s, measured {run_step:.4f} s (last of {a.steps} steps)")
    if vp > 1:   # interleaved: the fill and drain shrink to (pp - 1) / vp stage times (Narayanan et al. SC'21 sec. 2.2.2)
        print(f"interleaved 1F1B bubble of the LLM's stages, (pp - 1) / (vp m + pp - 1) with pp = {pp}, vp = {vp}, m = {m}: "
              f"{(pp - 1) / (vp * m + pp - 1):.1%}")
    else:
        print(f"1F1B bubble of the LLM's stages, (pp - 1) / (m + pp - 1) with pp = {pp}, m = {m}: {(pp - 1) / (m + pp - 1):.1%}")
    print("rank  module(s)          idle share of the step: simulated  measured")
    for r in range(plan["world_size"]):
        mods = [x["module"] + (f" stage {(r - x['first_rank']) // (x['dp'] * x['sp'] * x['tp'])}" if x["pp"] > 1 else "")
                for x in plan["modules"] if x["first_rank"] <= r < x["first_rank"] + x["n_ranks"]]
        si = 1 - sim_busy.get(r, 0.0) / sim_step
        ri = 1 - run_busy.get(r, 0.0) / run_step
        print(f"{r:4d}  {', '.join(mods):<20} {si:26.1%} {ri:9.1%}")


if __name__ == "__main__":
    main()
