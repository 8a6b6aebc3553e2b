#!/usr/bin/env python3
"""Fidelity of dhp's predictions on this machine (issues: simulator and profiler; the memory-saving strategies).

For each rank count the plans use, `mpirun -np N dhp profile` measures this
host into a cluster file; for every plan of a small model (colocated and
disaggregated, SP / TP / DP / ZeRO-1/2/3 mixes, recomputation, Megatron
sequence parallelism, a frozen encoder, 1-4 ranks) `dhp simulate` predicts
the step from it and `dhp run` measures it (step times after warm-up; per-rank
peak bytes per category as the executor allocated them). It prints both with
the error of each, and whether the planner's ranking of the plans matches the
measured one.

How it measures, and why:
- The profile keeps the best of several trials of every kernel, spread over
  its run: the machine undisturbed. The measured step is read the same way:
  the 10th percentile of the plan's step times (the median is printed too).
- The full profile by default (about 40 s per rank count): this shared VM
  switches between a fast and a ~1.4x slower state every few seconds, and the
  few-second `--quick` profile (`--quick-profile`) often sees only the slow one.
- Rounds: each plan runs in `--rounds` interleaved rounds of `--steps` steps,
  its step times pooled, so every plan sees the host's fast and slow phases.
  Many short rounds rather than a few long ones: a round of a 13 ms plan lasts
  a fraction of a second, inside one phase of each core (the two cores change
  phase independently), and with 5 rounds c2_dp once had none with both fast.
- The profiles are taken again after the runs and the plans re-simulated on
  them: the two columns say how far the host's speed moved while the bench
  ran. A disturbance only slows a profile down (which is why the profile
  keeps the best of its trials), so the prediction is the lower of the two.
- Ranks are bound to cores (`mpirun --bind-to core:overload-allowed`, ranks
  round-robin over the cores), for the profile and the run alike: ranks that
  share a core then share it for the whole run, which the profile records
  (compute_sets, compute_speed, compute_handoff_s) and the simulator models; unbound, the OS
  moves 3-4 ranks over 2 cores as it likes and no two runs agree.

- One OpenBLAS (and kernel) thread per rank by default, as the tests run;
  `--threads 2 --plans c1` checks the one-rank plan on both cores, the way a
  user who runs `dhp profile` and `dhp run` without OPENBLAS_NUM_THREADS does.

Usage: bench/fidelity.py [--dhp ./dhp] [--rounds 10] [--steps 15] [--warmup 3] [--quick-profile] [--no-bind]
                         [--threads 1] [--plans c1,d2_1_1,...] [--json OUT] [--backend cpu|cuda]
--backend cuda profiles the GPUs (dhp profile --backend cuda) and trains on them (dhp run --backend
cuda): the same comparison on a GPU host, one rank per GPU.
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
OMNI = ["--model", "tiny-omni", "--audio-frames", "32"]   # clips of 64 mel frames (dhp data synth --audio)
PLANS = [  # name, placement, strategy, extra dhp plan options
    ("c1", "colocated", "vision:dp=1,mb=16;llm:dp=1,mb=16", ["--gpus", "1"]),
    ("c2_dp", "colocated", "vision:dp=2,mb=8,zero=0;llm:dp=2,mb=8,zero=0", ["--gpus", "2"]),
    ("c2_sp_tp", "colocated", "vision:sp=2,dp=1,mb=16;llm:tp=2,dp=1,mb=16,seqpar=0", ["--gpus", "2"]),
    ("d2_1_1", "disaggregated", "vision:gpus=1;llm:gpus=1", ["--n-micro", "4"]),
    ("d3_1_tp2", "disaggregated", "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0", ["--n-micro", "4"]),
    ("d3_2_1", "disaggregated", "vision:gpus=2,dp=2;llm:gpus=1", ["--n-micro", "2"]),
    ("c4_dp_zero1", "colocated", "vision:dp=4,mb=4,zero=1;llm:dp=4,mb=4,zero=1", ["--gpus", "4"]),
    ("d4_sp2_dp2", "disaggregated", "vision:gpus=2,sp=2;llm:gpus=2,dp=2,zero=1", ["--n-micro", "2"]),
    # the memory-saving strategies: ZeRO-2/3, recomputation, Megatron sequence parallelism, a frozen encoder
    ("c2_zero2", "colocated", "vision:dp=2,mb=8,zero=2;llm:dp=2,mb=8,zero=2", ["--gpus", "2"]),
    ("c2_zero3", "colocated", "vision:dp=2,mb=8,zero=3;llm:dp=2,mb=8,zero=3", ["--gpus", "2"]),
    ("c2_seqpar_rc", "colocated", "vision:dp=2,mb=8,rc=selective;llm:tp=2,mb=16,seqpar=1,rc=full", ["--gpus", "2"]),
    ("c4_z3_sp_tp", "colocated", "vision:sp=2,dp=2,mb=8,zero=3;llm:tp=2,dp=2,mb=8,zero=3,seqpar=1", ["--gpus", "4"]),
    ("d3_z2_rc", "disaggregated", "vision:gpus=1,rc=full;llm:gpus=2,dp=2,zero=2", ["--n-micro", "4"]),
    ("c2_frozen_z3", "colocated", "vision:dp=2,mb=8,zero=3;llm:dp=2,mb=8,zero=3", ["--gpus", "2", "--model", "@frozen-vision"]),
    # pipeline parallelism (1F1B): the LLM on stages, an encoder pipeline feeding it, 4 stages of a 4-block LLM
    ("d3_pp2", "disaggregated", "vision:gpus=1;llm:gpus=2,pp=2,mb=2", ["--n-micro", "4"]),
    ("d4_pp2_pp2", "disaggregated", "vision:gpus=2,pp=2;llm:gpus=2,pp=2,mb=2", ["--n-micro", "4"]),
    ("c4_pp2_tp", "colocated", "vision:dp=4,mb=4;llm:pp=2,tp=2,mb=16,seqpar=1", ["--gpus", "4"]),
    ("d5_pp4", "disaggregated", "vision:gpus=1;llm:gpus=4,pp=4,mb=1", ["--n-micro", "8", "--model", "@deep-llm"]),
    # ZeRO-3 on stages: both modules on 2 stages x dp 2, each stage's units gathered every micro-batch
    ("c4_pp2_z3", "colocated", "vision:dp=2,pp=2,mb=2,zero=3;llm:pp=2,dp=2,mb=2,zero=3", ["--gpus", "4"]),
    # interleaved virtual stages (Megatron's interleaved 1F1B): the 4-block LLM as 2 one-block chunks on each of 2 ranks
    ("d3_pp2_vp2", "disaggregated", "vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=2", ["--n-micro", "4", "--model", "@deep-llm"]),
    # the LLM's context parallelism: Ulysses over 2 ranks, ring attention beside TP 2 (2 kv heads do not divide by 4)
    ("c2_cp_ulysses", "colocated", "vision:sp=2,mb=16;llm:sp=2,mb=16", ["--gpus", "2"]),
    ("c4_cp_ring_tp", "colocated", "vision:dp=4,mb=4;llm:sp=2,tp=2,mb=16,seqpar=1", ["--gpus", "4"]),
    # several encoders (tiny-omni: vision + audio feeding one LLM), on the audio data set
    ("c2_omni_dp", "colocated", "vision:dp=2,mb=8;audio:dp=2,mb=8;llm:dp=2,mb=8", ["--gpus", "2"] + OMNI),
    ("d4_omni_tp2", "disaggregated", "vision:gpus=1;audio:gpus=1;llm:gpus=2,tp=2,seqpar=0", ["--n-micro", "4"] + OMNI),
]
# Executor categories (executor log "peak_bytes") and the simulator's terms they hold.
CATS = [("params", ["params"]), ("grads", ["grads"]), ("optim", ["optim"]),
        ("activations", ["activations", "logits"]), ("comm", ["comm"]), ("zero_buffers", ["zero_buffers"])]


def tiny_vl_variant(tmp, name, kind, key, value):
    """tiny-vl with one field of its `kind` module changed (models/SCHEMA.md)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "models", "zoo", "tiny-vl.json")) as f:
        m = json.load(f)
    for mod in m["modules"]:
        if mod["kind"] == kind:
            mod[key] = value
    m["name"] = name
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def sh(cmd, env):
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr[-2000:]}")
    return r.stdout


def quantile(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def kendall_tau(a, b):
    """Rank agreement of two orderings of the same names: 1 identical, -1 reversed."""
    pa, pb = {n: i for i, n in enumerate(a)}, {n: i for i, n in enumerate(b)}
    names, s, pairs = list(a), 0, 0
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            x, y = names[i], names[j]
            s += 1 if (pa[x] - pa[y]) * (pb[x] - pb[y]) > 0 else -1
            pairs += 1
    return s / pairs if pairs else 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dhp", default=os.path.join(os.path.dirname(__file__), "..", "dhp"))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)   # the first 2-3 steps allocate
    ap.add_argument("--quick-profile", action="store_true")
    ap.add_argument("--no-bind", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="OpenBLAS threads per rank")
    ap.add_argument("--plans", help="comma-separated subset of: " + ",".join(p[0] for p in PLANS))
    ap.add_argument("--json")
    ap.add_argument("--backend", default="cpu", choices=["cpu", "cuda"],
                    help="the backend dhp profile measures and dhp run trains on (cuda: one rank per GPU)")
    a = ap.parse_args()
    if a.threads < 1:
        sys.exit("--threads must be at least 1")
    if a.plans:
        wanted = a.plans.split(",")
        unknown = [w for w in wanted if w not in {p[0] for p in PLANS}]
        if unknown:
            sys.exit(f"unknown plan(s): {', '.join(unknown)}")
        PLANS[:] = [p for p in PLANS if p[0] in wanted]
    dhp = os.path.abspath(a.dhp)
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS=str(a.threads), OMPI_MCA_mpi_yield_when_idle="1")
    # A rank of several threads is not bound to one core (its threads would share it).
    bind = [] if a.no_bind else ["--bind-to", "none"] if a.threads > 1 else ["--bind-to", "core:overload-allowed"]

    def mpirun(n, args):
        return ["mpirun", "--oversubscribe"] + bind + ["-np", str(n)] + args

    tmp = tempfile.mkdtemp(prefix="dhp-fidelity.")
    variants = {"@frozen-vision": tiny_vl_variant(tmp, "tiny-vl-frozen-vision", "vision", "frozen", True),
                "@deep-llm": tiny_vl_variant(tmp, "tiny-vl-deep-llm", "llm", "layers", 4)}
    PLANS[:] = [(n, pl, spec, [variants.get(x, x) for x in extra]) for n, pl, spec, extra in PLANS]
    data = os.path.join(tmp, "data")
    sh([dhp, "data", "synth", "--out", data, "--samples", "1024", "--window", "0"], env)
    audio_data = os.path.join(tmp, "audio-data")
    if any("tiny-omni" in extra for _, _, _, extra in PLANS):
        sh([dhp, "data", "synth", "--out", audio_data, "--samples", "1024", "--window", "0", "--audio"], env)
    data_of = {name: audio_data if "tiny-omni" in extra else data for name, _, _, extra in PLANS}
    plans = {}
    for name, placement, spec, extra in PLANS:
        probe = sh([dhp, "plan"] + SETUP + ["--cluster", "8xh100", "--placement", placement, "--strategy", spec]
                   + extra + ["-o", os.path.join(tmp, name + ".json"), "--json"], env)
        plans[name] = json.loads(probe)["world_size"]

    def profile_and_simulate(tag):
        """Profiles every rank count, plans and simulates every plan on it: {plan: simulate JSON}."""
        clusters = {}
        for n in sorted(set(plans.values())):
            clusters[n] = os.path.join(tmp, f"cpu-{n}{tag}.json")
            sh(mpirun(n, [dhp, "profile", "--backend", a.backend, "--cluster-out", clusters[n]]
                      + (["--quick"] if a.quick_profile else [])), env)
        out = {}
        for name, placement, spec, extra in PLANS:
            plan = os.path.join(tmp, f"{name}{tag}.json")
            sh([dhp, "plan"] + SETUP + ["--cluster", clusters[plans[name]], "--placement", placement, "--strategy", spec]
               + extra + ["-o", plan], env)
            out[name] = json.loads(sh([dhp, "simulate", plan, "--json"], env))
        return out

    sims = profile_and_simulate("")
    times = {name: [] for name in plans}
    per_round = {name: [] for name in plans}   # each round's 10th percentile
    last = {}
    for rnd in range(a.rounds):
        for name, *_ in PLANS:
            log = sh(mpirun(plans[name], [dhp, "run", os.path.join(tmp, f"{name}.json"), "--data", data_of[name],
                                          "--steps", str(a.steps), "--backend", a.backend, "--log-json"]), env)
            steps = [json.loads(l) for l in log.splitlines() if l.startswith("{")]
            times[name] += [s["step_s"] for s in steps[a.warmup:]]
            per_round[name].append(quantile([s["step_s"] for s in steps[a.warmup:]], 0.1))
            last[name] = steps[-1]
    # The same profiles again after the runs. A profile is a measurement whose
    # disturbances only slow it down (the profile keeps the best of its own
    # trials for that reason), so the prediction is the lower of the two.
    again = profile_and_simulate("-after")
    rows = []
    for name, *_ in PLANS:
        n, sim = plans[name], sims[name]
        mem = []
        for q in range(n):
            got = last[name]["ranks"][q]["peak_bytes"]
            pred = sim["ranks"][q]["memory"]
            mem.append({c: (sum(pred[t] for t in terms), got.get(c, 0)) for c, terms in CATS})
        measured = quantile(times[name], 0.1)
        first, after = sim["step_time_s"], again[name]["step_time_s"]
        rows.append({"plan": name, "ranks": n, "profile1_s": first, "profile2_s": after,
                     "predicted_s": min(first, after), "measured_s": measured,
                     "median_s": statistics.median(times[name]), "steps": len(times[name]),
                     "round_p10_s": per_round[name], "error": min(first, after) / measured - 1, "memory": mem})

    print(f"profile {'--quick' if a.quick_profile else 'full'}, ranks {'unbound' if a.no_bind or a.threads > 1 else 'bound to cores'}, "
          f"{a.threads} thread{'s' if a.threads > 1 else ''} per rank; "
          f"measured = 10th percentile of {a.rounds} rounds x {a.steps - a.warmup} steps")
    print(f"{'plan':<13} {'ranks':>5} {'profile 1 s':>12} {'profile 2 s':>12} {'predicted s':>12} {'measured s':>11} "
          f"{'median s':>9} {'error':>7}")
    worst_t = 0.0
    for r in rows:
        worst_t = max(worst_t, abs(r["error"]))
        print(f"{r['plan']:<13} {r['ranks']:>5} {r['profile1_s']:>12.5f} {r['profile2_s']:>12.5f} {r['predicted_s']:>12.5f} "
              f"{r['measured_s']:>11.5f} {r['median_s']:>9.5f} {r['error']:>+7.1%}")
    print("(profile 1 before the runs, profile 2 after them; predicted = the lower, as a disturbed profile only "
          "reads slower)")
    print()
    print("peak memory per rank, KiB predicted / measured (error)")
    print(f"{'plan':<13} {'rank':>4} " + " ".join(f"{c[:24]:>24}" for c, _ in CATS))
    worst_m = {c: 0.0 for c, _ in CATS}
    for r in rows:
        for q, m in enumerate(r["memory"]):
            cells = []
            for c, _ in CATS:
                p, g = m[c]
                e = (p - g) / g if g else (0.0 if p == 0 else float("inf"))
                if p == 0 and g == 0:
                    cells.append(f"{'-':>24}")
                    continue
                worst_m[c] = max(worst_m[c], abs(e))
                cells.append(f"{p / 1024:>8.1f} / {g / 1024:>7.1f} ({e:>+5.1%})")
            print(f"{r['plan']:<13} {q:>4} " + " ".join(f"{x:>24}" for x in cells))
    pred_rank = [r["plan"] for r in sorted(rows, key=lambda r: r["predicted_s"])]
    meas_rank = [r["plan"] for r in sorted(rows, key=lambda r: r["measured_s"])]
    print()
    print("ranking by predicted step time:", " < ".join(pred_rank))
    print("ranking by measured step time: ", " < ".join(meas_rank))
    print(f"ranking matches: {'yes' if pred_rank == meas_rank else 'no'} (Kendall tau {kendall_tau(pred_rank, meas_rank):+.2f})")
    # A pair the measurement resolves: every round orders the two plans the same way.
    pred = {r["plan"]: r["predicted_s"] for r in rows}
    names = [r["plan"] for r in rows]
    resolved, agree, unresolved = 0, 0, []
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            x, y = per_round[names[i]], per_round[names[j]]
            signs = {(u > v) - (u < v) for u, v in zip(x, y)}
            if len(signs) == 1 and 0 not in signs:
                resolved += 1
                agree += (pred[names[i]] > pred[names[j]]) == (signs == {1})
            else:
                unresolved.append(f"{names[i]}/{names[j]}")
    print(f"pairs every round orders the same way: {resolved} of {resolved + len(unresolved)}; the predicted order "
          f"agrees on {agree} of them" + (f" (unresolved: {', '.join(unresolved)})" if unresolved else ""))
    print(f"worst step-time error {worst_t:.1%} (target 15%); worst memory error per category: "
          + ", ".join(f"{c} {v:.1%}" for c, v in worst_m.items()) + " (target 5%)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


main()
