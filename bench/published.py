#!/usr/bin/env python3
"""dhp's GPU predictions against published training runs (issue 22).

Reads bench/published.tsv (120 published runs and kernel / collective
measurements with their sources; the repository's copy of
../shared/calibration/published.tsv, corrected where a source says otherwise:
each correction is in the row's notes). Every row becomes one of:

* a check row: a training run dhp can express. The row's exact
  configuration goes through `dhp plan --strategy ... --target megatron`
  (a model JSON with just an `llm` module and a cluster JSON are written per
  row); the published figure is turned into a step time with the source's
  own FLOP formula where it reports TFLOP/s or MFU, and compared with dhp's
  predicted step time; peak memory and the fits/OOM verdict where the source
  states memory or an OOM. Memory is compared on the quantity the source
  states: Korthikanti et al.'s figure 1 (rows 32-39) counts the transformer
  layers alone (its sec. 4.3 leaves the embedding, the last layer norm and
  the output layer out, "Equation 5 ... we will use it in the rest of this
  paper"; the figures are its formulas to the byte), so those rows set dhp's
  block_states / block_activations (`dhp memory --json`) and each
  estimator's own transformer-layer terms against it.
* a fit row: a kernel or collective measurement that sets a costdb number
  (GEMM efficiency, attention efficiency, NCCL bus bandwidth, the A100's
  sustained GEMM rate from Zero Bubble's profiled weight-gradient GEMMs). No
  training row's step time is used to fit anything: the training rows are
  for checking only (the Zero Bubble rows' runs are the W profiles' runs).
* a row dhp cannot express (FP8, MoE-style features, a configuration the
  source does not give), listed with the reason.

Rows whose notes begin "held out" (of rows 121-135: MT-NLG, BLOOM, IBM's
fms-fsdp, Llama 3 405B; Zero Bubble's 1F1B baseline was held out until its
runs' W profiles set a costdb number) were added after the cost model was
tuned and nothing was fitted to them; the terms added since (DeepSpeed's
pipeline engine and the gradient accumulation of 2021, looked for because of
MT-NLG's and BLOOM's gap) come from the software's source, and the split
that makes Llama 3 405B's layout expressible (split=ends: the embedding and
the head a block each, Megatron-Core's and the paper's own) was built because
issue 22 names its uneven stages; its V = 8 and micro-batch 1 are inferred
(printed). They are marked * and summarized apart (median and worst per
source and overall, llm-analysis on the same rows, memory), the out-of-sample
check of issue 22's goals. A row whose run dhp's nearest configuration would
not fit for a reason the row states (Llama 3's sharded gradients beside
pipeline stages) is marked ^ and left out of the fits count, with the reason.

Side by side on the same rows: llm-analysis (time and memory), DeepSpeed's
estimate_zero2/3_model_states_mem_needs_all_cold (model states under
ZeRO-2/3) and Megatron-LM's theoretical memory formula (reimplemented below
from megatron/training/theoretical_memory_usage.py). The first two are
installed into build/bench-venv from PyPI; the bench says in one line which
could not be installed and goes on.

Fields the source leaves unstated are filled by a rule named in the row's
"inferred" list (printed), never silently.

The rows -> cases part (the sources' FLOP formulas, the model builders, the
inference rules) is bench/published_rows.py; this file runs dhp, the
estimators and Megatron-LM's formula on the cases and prints the report.
"""
import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from published_rows import (GIB, GPU_FILE, HERE, ROOT, Skip, cluster_json, family, interpret, load_json,
                            model_params, num, stated_ooms)


# ---------------------------------------------------------------- dhp
def strategy_of(c):
    kv = [f"dp={c['dp']}", f"tp={c['tp']}", f"pp={c['pp']}", f"zero={c['zero']}", f"mb={c['mb']}", f"rc={c['rc']}",
          f"seqpar={1 if c['seqpar'] else 0}"]
    if c["vp"] > 1:
        kv.append(f"vp={c['vp']}")
    if c.get("split_ends"):
        kv.append("split=ends")
    if c.get("rc_layers"):
        kv.append(f"rc_layers={c['rc_layers']}")
    if c.get("sp", 1) > 1:
        kv.append(f"sp={c['sp']}")
    if c.get("cp"):
        kv.append(f"cp={c['cp']}")
    return "llm:" + ",".join(kv)


# The Megatron target's framework options (planner/framework.h) a row may set, each its dhp plan flag.
FRAMEWORK_OPTIONS = ("zero3", "adamw", "optim_dtype", "grad_reduce", "tp_style", "pipe_engine", "grad_accum", "fp8",
                     "loss")


def run_dhp(dhp, c, tmp):
    llm = dict(name="llm", kind="llm", **c["model"])
    if c["attention"] == "unfused":
        llm["unfused_attention"] = True
    if c["dropout"]:
        llm["dropout"] = True
    model = {"schema": "dhp.model/1", "name": f"row{c['idx']}", "modules": [llm]}
    mpath, cpath, ppath = (os.path.join(tmp, f"{c['idx']}-{x}.json") for x in ("model", "cluster", "plan"))
    with open(mpath, "w") as f:
        json.dump(model, f)
    with open(cpath, "w") as f:
        json.dump(cluster_json(c["gpu"], c["gpus"], c["hbm_gib"] if c["hbm_gib"] != 80 else None, c.get("hbm_bw"),
                               c.get("node_gbps")), f)
    cmd = [dhp, "plan", "--model", mpath, "--cluster", cpath, "--batch", str(c["gb"]), "--text-tokens", str(c["seq"]),
           "--precision", c["precision"], "--target", "megatron", "--gpus", str(c["gpus"]),
           "--strategy", strategy_of(c)]
    for key in FRAMEWORK_OPTIONS:   # the row's software, where interpret() named it
        if c.get(key):
            cmd += ["--" + key.replace("_", "-"), c[key]]
    if c.get("tp_comm_overlap"):
        cmd.append("--tp-comm-overlap")
    if c.get("attn_kernel"):
        cmd += ["--attention", c["attn_kernel"]]
    cmd += ["-o", ppath, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        return {"error": (p.stderr or p.stdout).strip().splitlines()[-1][:200]}
    pred = json.loads(p.stdout)["prediction"]
    q = subprocess.run([dhp, "memory", ppath, "--json"], capture_output=True, text=True)
    mem = json.loads(q.stdout)["modules"][0] if q.returncode == 0 else {}
    parts = json.loads(p.stdout).get("step_parts")
    return {"step_s": pred["step_time_s"], "fits": pred["fits"], "mfu": pred["mfu"], "mem": mem,
            "parts": parts[0] if isinstance(parts, list) and parts else None}


# ---------------------------------------------------------------- Megatron-LM's formula
def megatron_theoretical(c):
    """megatron/training/theoretical_memory_usage.py (NVIDIA/Megatron-LM, commit 38644dd):
    compute_weight_and_optimizer_memory and compute_activation_memory, reimplemented.
    The activation formula assumes sequence parallelism and selective recomputation
    (report_theoretical_memory returns nothing otherwise): None there."""
    m = c["model"]
    L, h, H, G, f = m["layers"], m["hidden"], m["heads"], m["kv_heads"], m["ffn"]
    tp, pp, dp = c["tp"], c["pp"], c["dp"]
    div = 128 * tp                         # --make-vocab-size-divisible-by 128, times tp
    Vp = -(-m["vocab"] // div) * div
    untie = not m["tied_embeddings"]
    layers_p = 2 * L * h * h * (1 + f / h + G / H + 2 / h + 1 / (L * h))
    emb = h * Vp
    most = (layers_p / pp + emb) / tp
    if untie and pp == 1:
        most += emb / tp
    per_param = 6 + 12 / dp if c["zero"] == 1 else 18
    weights = most * per_param
    # its transformer-layer terms alone (num_parameters_in_transformer_layers; the activations'
    # per-layer s b h (18 + 4 ffn/h) L, before the embedding's and the output layer's terms)
    layers = layers_p / pp / tp * per_param
    if not (c["seqpar"] and c["rc"] == "selective"):
        return {"states_bytes": weights, "act_bytes": None, "layers_states_bytes": layers, "layers_act_bytes": None}
    s, b = c["seq"], c["mb"]
    act = s * b * h * (18 + 4 * (f / h)) * L
    layer_act = act
    act += 8 * s * b * pp + s * b * h * pp
    if c["vp"] > 1:
        scale = 1 + (pp - 1) / (pp * c["vp"])
    elif pp > 1:
        scale = min(1, (c["gb"] // (b * dp)) / pp)
    else:
        scale = 1
    act *= scale
    if pp == 1:
        act += s * b * h * 4 * (1 + Vp / h)
    return {"states_bytes": weights, "act_bytes": act / tp, "layers_states_bytes": layers,
            "layers_act_bytes": layer_act * scale / tp}


# ---------------------------------------------------------------- estimators' environment
# llm-analysis's names of the presets' GPUs
LA_GPU = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb"}


def plain(v):
    return v["value"] if isinstance(v, dict) else v


def gpu_numbers(fam):
    g = load_json(os.path.join(ROOT, "costdb", "gpus", GPU_FILE[fam] + ".json"))
    return {k: plain(v) for k, v in g.items() if k not in ("schema", "name")}


def largest_layer(m):
    """DeepSpeed's largest_layer_params: the largest single module (embedding or one linear)."""
    h, f = m["hidden"], m["ffn"]
    return max(m["vocab"] * h, h * f, h * 3 * h)


# (name, module to import, the package itself, installed without its pins; its other requirements)
EST_PACKAGES = [("deepspeed", "deepspeed.runtime.zero.stage3", "deepspeed==0.19.8",
                 ["einops", "hjson", "msgpack", "ninja", "packaging", "psutil", "py-cpuinfo", "pydantic>=2", "tqdm"]),
                ("llm-analysis", "llm_analysis.analysis", "llm-analysis==0.2.2", ["fire>=0.5,<0.6"])]


def estimator_venv(venv):
    """build/bench-venv with the system site packages (torch for DeepSpeed's import);
    packages installed without their dependency pins (DeepSpeed pins torch>=2, whose
    CPU-only wheels PyPI does not carry; its estimators run on the system's torch).
    Returns (python, [what could not be installed])."""
    py = os.path.join(venv, "bin", "python")
    failed = []
    if not os.path.exists(py):
        r = subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", venv], capture_output=True)
        if r.returncode:
            return None, ["the virtual environment (python3 -m venv failed)"]
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    for name, mod, pkg, deps in EST_PACKAGES:
        if subprocess.run([py, "-c", f"import {mod}"], capture_output=True, env=env).returncode == 0:
            continue
        pip = [py, "-m", "pip", "install", "-q"]
        if subprocess.run(pip + deps, capture_output=True).returncode or \
                subprocess.run(pip + ["--no-deps", pkg], capture_output=True).returncode:
            failed.append(name)
    return py, failed


def run_estimators(py, cases):
    if not py:
        return {"_missing": {}}
    payload = []
    for c in cases:
        gn = gpu_numbers(c["gpu"])
        payload.append(dict(key=str(c["idx"]), model=c["model"], seq=c["seq"], tp=c["tp"], pp=c["pp"], dp=c["dp"],
                            seqpar=c["seqpar"], rc=c["rc"], zero=c["zero"], mb=c["mb"], gb=c["gb"], gpus=c["gpus"],
                            attention=c["attention"], dropout=c["dropout"], la_gpu=LA_GPU[c["gpu"]],
                            hbm_gib=c["hbm_gib"], gemm_eff=gn["gemm_eff_max"], mem_eff=gn["mem_eff"],
                            params=model_params(c["model"]), largest_layer=largest_layer(c["model"])))
    r = subprocess.run([py, os.path.join(HERE, "published_estimators.py")], input=json.dumps(payload),
                       capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    if r.returncode:
        return {"_missing": {"estimators": (r.stderr.strip().splitlines() or ["failed"])[-1][:200]}}
    return json.loads(r.stdout)


# ---------------------------------------------------------------- report
def err(pred, pub):
    return None if pred is None or pub is None or pub == 0 else (pred - pub) / pub


def fmt_err(e):
    return "     -" if e is None else f"{e * 100:+6.1f}%"


def stats(errs):
    e = [abs(x) for x in errs if x is not None]
    if not e:
        return None
    return {"n": len(e), "median": statistics.median(e), "worst": max(e)}


def fmt_stats(s):
    return "n/a" if not s else f"n={s['n']:2d} median {s['median'] * 100:5.1f}% worst {s['worst'] * 100:5.1f}%"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dhp", default=os.path.join(ROOT, "dhp"))
    ap.add_argument("--tsv", default=os.path.join(HERE, "published.tsv"))
    ap.add_argument("--venv", default=os.path.join(ROOT, "build", "bench-venv"))
    ap.add_argument("--no-estimators", action="store_true", help="dhp only")
    ap.add_argument("--json", help="write every row's figures here")
    a = ap.parse_args()
    if not os.path.exists(a.tsv):
        sys.exit(f"published.py: {a.tsv} not found (--tsv PATH)")
    with open(a.tsv) as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    cases, skipped = [], []
    for i, r in enumerate(rows, 1):
        try:
            cases.append(interpret(r, i))
        except Skip as s:
            skipped.append((i, r, s.kind, str(s)))
    cases += stated_ooms(rows, len(rows))
    py, failed = (None, []) if a.no_estimators else estimator_venv(a.venv)
    est = {"_missing": {}} if a.no_estimators else run_estimators(py, cases)
    missing = sorted(set(failed) | set(est.get("_missing", {})))
    if a.no_estimators:
        print("estimators: skipped (--no-estimators)")
    elif missing:
        print(f"estimators: could not install or import {', '.join(missing)}; going on without")
    else:
        print(f"estimators: {', '.join(p for _, _, p, _ in EST_PACKAGES)} in {os.path.relpath(a.venv, ROOT)}")
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases:
            c["dhp"] = run_dhp(a.dhp, c, tmp)
            c["est"] = est.get(str(c["idx"]), {})
            c["meg"] = megatron_theoretical(c)
            if c["family"] == "zero-bubble" and "error" not in c["dhp"]:
                c["dhp"]["stage_ms"] = middle_stage_ms(a.dhp, os.path.join(tmp, f"{c['idx']}-plan.json"), tmp)
    report(cases, skipped)
    fit_rows(a.dhp, skipped)
    stage_profiles(cases, skipped)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "skipped": [dict(row=i, kind=k, reason=w, source=r["source"], model=r["model"])
                                                   for i, r, k, w in skipped]}, f, indent=1, default=str)


# ---------------------------------------------------------------- stage profiles
def middle_stage_ms(dhp, plan, tmp):
    """dhp simulate's mean forward and backward op of one micro-batch on a middle pipeline stage
    (rank pp / 2 of a tp 1, dp 1 pipeline), ms; None when the simulation fails."""
    trace = os.path.join(tmp, "stage-trace.json")
    q = subprocess.run([dhp, "simulate", plan, "--trace", trace], capture_output=True, text=True)
    if q.returncode:
        return None
    with open(trace) as f:
        t = json.load(f)
    events = t["traceEvents"] if isinstance(t, dict) else t
    with open(plan) as f:
        pp = json.load(f)["modules"][0]["pp"]
    dur = {"forward": [], "backward": []}
    for e in events:
        name = e.get("name", "").split(" ")[0]
        if e.get("ph") == "X" and e.get("pid") == pp // 2 and name in dur:
            dur[name].append(e["dur"] / 1e3)
    if not dur["forward"] or not dur["backward"]:
        return None
    return tuple(sum(v) / len(v) for v in (dur["forward"], dur["backward"]))


def stage_profiles(cases, skipped):
    """Zero Bubble's profiled stage times (the W fit rows' notes: the settings tuple of mem.py's
    iclr_mem, f, b and w in microseconds) beside dhp's middle stage of the same run: F, the forward
    of one micro-batch, and B + W, its backward (input and weight gradients). A check, not a fit:
    only W set a costdb number (gemm_sustained)."""
    out = []
    for i, r, kind, _ in skipped:
        if kind != "fit" or family(r["source"]) != "zb-wgrad":
            continue
        m = re.search(r"\(p, n, f, b, w, c, h, a, l\) = \((\d+), (\d+), (\d+), (\d+), (\d+)", r["notes"])
        size = re.search(r"(\d+(?:\.\d+)?B)", r["model"])
        if not m or not size:
            continue
        f, b, w = (int(m.group(k)) / 1e3 for k in (3, 4, 5))
        run = next((c for c in cases if c["family"] == "zero-bubble" and size.group(1) in c["name"]
                    and c["dhp"].get("stage_ms")), None)
        out.append((i, size.group(1), f, b + w, run["dhp"]["stage_ms"] if run else None))
    if not out:
        return
    print("\nZero Bubble stage profiles (a middle stage, one micro-batch, ms): profiled vs dhp simulate")
    print(f"{'row':>3} {'model':<6} {'F':>8} {'dhp':>8} {'error':>7}   {'B+W':>8} {'dhp':>8} {'error':>7}")
    for i, size, f, bw, d in out:
        if d is None:
            print(f"{i:>3} {size:<6} {f:8.2f} {'-':>8} {'-':>7}   {bw:8.2f} {'-':>8} {'-':>7}")
            continue
        print(f"{i:>3} {size:<6} {f:8.2f} {d[0]:8.2f} {fmt_err(err(d[0], f))}   {bw:8.2f} {d[1]:8.2f} {fmt_err(err(d[1], bw))}")


# ---------------------------------------------------------------- fit rows
def wgrad_ms(dhp, preset, r):
    """dhp's time, ms, for a stage's weight-gradient GEMMs as a training step prices them (at
    gemm_sustained): per layer dW = X^T dY of QKV (h x 3h), the projection (h x h), fc1 (h x f) and
    fc2 (f x h), each reducing over the micro-batch's tokens."""
    L, h, f = int(num(r["layers"])), int(num(r["hidden"])), int(num(r["ffn"]))
    t = int(num(r["micro_batch"])) * int(num(r["seq"]))
    total = 0.0
    for m, n in ((h, 3 * h), (h, h), (h, f), (f, h)):
        q = subprocess.run([dhp, "clusters", preset, "--price", f"gemm:{m},{n},{t}"], capture_output=True, text=True)
        if q.returncode:
            return None
        total += json.loads(q.stdout)["seconds"]
    return L * total * 1e3


def fit_rows(dhp, skipped):
    """The kernel and collective rows set costdb numbers (which ones: the
    'fit' column); dhp's price of each next to the measurement. Rows whose
    hardware the costdb does not describe are listed as such."""
    out = []
    for i, r, kind, _ in skipped:
        if kind != "fit":
            continue
        fam, gpu, v = family(r["source"]), r["gpu"], num(r["value"])
        preset, spec, fit, unit = None, None, "", 1e12
        if fam == "gemm":
            shape = re.search(r"(\d+)x(\d+)x(\d+)", r["model"])
            fp8 = "fp8" in r["precision"].lower()
            preset = "8xa100-80g" if gpu.startswith("A100") else "8xh100" if gpu.startswith("H100") else \
                "8xh200" if gpu.startswith("H200") and fp8 else None
            spec = ("gemm8:" if fp8 else "gemm:") + ",".join(shape.groups())
            fit = ("gemm_eff_max_fp8" if fp8 else "gemm_eff_max") if preset else ""
        elif fam == "attention" and "head_dim" in r["model"]:
            d = int(re.search(r"head_dim (\d+)", r["model"]).group(1))
            preset, spec, fit = "8xh100", f"attention:{int(num(r['seq']))},{int(num(r['heads']))},{d},0", "attn_hd_half (ratio to d=128)"
        elif fam == "attention":   # FlashAttention-2's best case on A100, head dim 128
            preset, spec = "8xa100-80g", "attention:16384,16,128,0"
        elif fam == "nccl":
            n = int(num(r["gpus"]))
            S = float(re.search(r"payload (\d+)", r["model"]).group(1)) * {"MiB": 2**20, "GiB": 2**30}[
                re.search(r"payload \d+(MiB|GiB)", r["model"]).group(1)]
            preset = "8xa100-80g" if gpu.startswith("A100") else "8xh200" if gpu.startswith("H200") else None
            spec, unit = f"allreduce:{int(S)},{n}", 1e9
            fit = "intra link" if preset and n == 8 and "SHARP" not in r["source"] else ""
        elif fam == "zb-wgrad":
            preset, fit, unit = "8xa100-80g", "gemm_sustained (A100)", 1e-3
        row = {"row": i, "what": r["model"][:34], "gpu": gpu.split(" (")[0][:22], "measured": v, "fit": fit}
        if fam == "zb-wgrad":
            row["dhp"] = wgrad_ms(dhp, preset, r)
        elif preset:
            q = subprocess.run([dhp, "clusters", preset, "--price", spec], capture_output=True, text=True)
            if q.returncode == 0:
                j = json.loads(q.stdout)
                # a GEMM benchmark (MAMF) times bursts: dhp's burst rate, without gemm_sustained
                row["dhp"] = (j.get("burst_flops_per_s") or j.get("flops_per_s") or j.get("busbw")) / unit
        out.append(row)
    ref = {x["row"]: x for x in out}
    base = next((dict(x) for x in out if "head_dim 128" in x["what"] and "dhp" in x), None)
    for x in out:   # the attention rows are fitted as ratios to head dim 128 (FlashAttention-3 there, FA2 in dhp)
        if "head_dim" in x["what"] and base and "dhp" in x:
            x["measured"], x["dhp"] = x["measured"] / base["measured"], x["dhp"] / base["dhp"]
    print("\nfit rows: kernel and collective measurements that set costdb numbers (no training row's step time sets any)")
    print(f"{'row':>3} {'what':<34} {'gpu':<22} {'measured':>9} {'dhp':>9} {'error':>7}  used to fit")
    for x in out:
        d = x.get("dhp")
        e = err(d, x["measured"])
        print(f"{x['row']:>3} {x['what']:<34} {x['gpu']:<22} {x['measured']:9.3f} " +
              (f"{d:9.3f} {fmt_err(e)}" if d is not None else f"{'-':>9} {'-':>7}") +
              f"  {x['fit'] or ('no costdb entry for this GPU' if d is None else 'check only')}")
    print("  (GEMM, attention: TFLOP/s; attention rows as ratios to head dim 128; all-reduce: bus bandwidth GB/s;")
    print("  GEMM rows at dhp's burst rate, as MAMF times them: a training step's GEMMs are priced at gemm_sustained of it;")
    print("  W rows: ms, a pipeline stage's weight-gradient GEMMs timed in training, priced at gemm_sustained)")
    seq_curve(dhp)
    return ref


# pytorch/benchmark PR 2391 (commit ff65cb6): H100 attention forward, head dim 128, 16 heads,
# batch x seq = 16k tokens; TFLOP/s of FlashAttention-3 and of Triton's FlashAttention-2 tutorial.
FA_SEQ_CURVE = [(512, 430.32, 328.882), (1024, 517.099, 389.723), (2048, 565.544, 433.721),
                (4096, 590.233, 458.359), (8192, 614.234, 470.732), (16384, 620.73, 476.753)]


def seq_curve(dhp):
    """The points costdb's attn_row_scores is fitted to, as ratios to 16k, beside dhp's
    (the batch folded into the heads: the same rows and scores)."""
    rate = {}
    for s, _, _ in FA_SEQ_CURVE:
        q = subprocess.run([dhp, "clusters", "8xh100", "--price", f"attention:{s},{16 * 16384 // s},128,0"],
                           capture_output=True, text=True)
        if q.returncode == 0:
            rate[s] = json.loads(q.stdout)["flops_per_s"]
    print("\nattention by sequence length (fit points of attn_row_scores; H100 forward, head dim 128, 16k tokens;")
    print("pytorch/benchmark PR 2391), as ratios to seq 16k:")
    print(f"{'seq':>6} {'FA3':>6} {'FA2':>6} {'dhp':>6}")
    for s, fa3, fa2 in FA_SEQ_CURVE:
        d = f"{rate[s] / rate[16384]:6.3f}" if s in rate and 16384 in rate else f"{'-':>6}"
        print(f"{s:>6} {fa3 / FA_SEQ_CURVE[-1][1]:6.3f} {fa2 / FA_SEQ_CURVE[-1][2]:6.3f} {d}")


def held_out_summary(cases, by_fam, mem_held):
    """The rows marked 'held out' in their notes (marked * above): published runs added after the
    cost model's terms were in, no number fitted to them, summarized apart from the rows above
    (by_fam: errors by (family, held out), a family's check rows and held-out rows apart)."""
    fams = [k for k in sorted(by_fam) if k[1]]
    if not fams:
        return
    print("summary, held-out rows (*: notes begin 'held out'; no number was fitted to them; the terms added since "
          "they were\n  added, each from its software's source, are in the README's 'Terms added')")
    allerr = []
    for key in fams:
        allerr += by_fam[key]
        refused = sum(1 for x in by_fam[key] if x is None)
        print(f"  {key[0]:<20} {fmt_stats(stats(by_fam[key]))}" + (f"  ({refused} refused)" if refused else ""))
    print(f"  {'held out overall':<20} {fmt_stats(stats(allerr))}")
    rows = [c for c in cases if c["held_out"] and c.get("err_la") is not None]
    print(f"  same rows, llm-analysis: {fmt_stats(stats([c['err_la'] for c in rows]))}; "
          f"dhp: {fmt_stats(stats([c['err'] for c in rows]))}")
    for k, v in mem_held.items():
        if v:
            print(f"  memory, {k:<13} {fmt_stats(stats([e for _, _, e in v]))}")


# dhp plan --json's step_parts, grouped: (heading, keys)
PART_GROUPS = [("GEMM", ["gemm_s"]), ("attn", ["attention_s"]), ("other", ["other_compute_s"]),
               ("recomp", ["recompute_s"]), ("TP/SP", ["tp_comm_s", "sp_comm_s"]), ("ZeRO", ["zero_comm_s"]),
               ("DP", ["dp_sync_s"]), ("pipe", ["stage_handoff_s", "pipeline_bubble_s"]), ("optim", ["optimizer_s"])]


def print_parts(cases):
    """Where each row's predicted step goes (dhp plan's step_parts), as shares of it, beside the error:
    which term a miss would have to come from."""
    print("\nwhere dhp's predicted step goes (% of it; dhp plan's 'where the step goes'), beside its error")
    print(f"{'row':>3} {'source':<18} {'dhp':>7} " + " ".join(f"{h:>6}" for h, _ in PART_GROUPS))
    for c in cases:
        parts = c["dhp"].get("parts")
        if c["pub_step_s"] is None or "error" in c["dhp"] or not parts or not parts.get("total_s"):
            continue
        shares = [100 * sum(parts.get(k, 0) for k in keys) / parts["total_s"] for _, keys in PART_GROUPS]
        print(f"{c['idx']:>3}{'*' if c['held_out'] else ' '}{c['family']:<18} {fmt_err(c.get('err'))} "
              + " ".join(f"{x:6.1f}" for x in shares))


def report(cases, skipped):
    print("\nstep time: published (source's FLOP formula where it gives TFLOP/s or MFU) vs predicted")
    print(f"{'row':>3} {'source':<18} {'model':<14} {'gpus':>5} {'tp':>2} {'pp':>3} {'dp':>5} {'z':>1} {'mb':>2} "
          f"{'rc':<4} {'pub s':>8} {'dhp s':>8} {'dhp':>7} {'llm-an.':>7}  fits")
    by_fam, la_rows, dhp_la_rows = {}, [], []   # by_fam: errors by (family, held out)
    fit_agree, fit_total = 0, 0
    for c in cases:
        if c["pub_step_s"] is None:
            continue
        key = (c["family"], c["held_out"])
        d = c["dhp"]
        if "error" in d:
            print(f"{c['idx']:>3} {c['family']:<18} {c['name'][:14]:<14} dhp refused: {d['error']}")
            by_fam.setdefault(key, []).append(None)
            continue
        e = err(d["step_s"], c["pub_step_s"])
        la = c["est"].get("llm_analysis", {})
        ela = err(la.get("step_s"), c["pub_step_s"])
        c["err"], c["err_la"] = e, ela
        by_fam.setdefault(key, []).append(e)
        if ela is not None and not c["held_out"]:
            la_rows.append(ela)
            dhp_la_rows.append(e)
        if not c.get("fits_unchecked"):   # a run the row's configuration dhp cannot express holds
            fit_total += 1
            fit_agree += d["fits"]
        print(f"{c['idx']:>3}{'*' if c['held_out'] else ' '}{c['family']:<18} {c['name'][:14]:<14} {c['gpus']:>5} {c['tp']:>2} {c['pp']:>3} "
              f"{c['dp']:>5} {c['zero']:>1} {c['mb']:>2} {c['rc'][:4]:<4} {c['pub_step_s']:8.3f} {d['step_s']:8.3f} "
              f"{fmt_err(e)} {fmt_err(ela)}  {'yes' if d['fits'] else 'OOM'}{'^' if c.get('fits_unchecked') else ''}")
    print_parts(cases)
    print("\nmemory per GPU, GiB: published vs predicted (dhp, llm-analysis, DeepSpeed, Megatron-LM formula);")
    print("  /layers: the source counts the transformer layers alone (no embedding, final norm, output layer or")
    print("  logits), and so does every column (dhp memory's block_states / block_activations); DeepSpeed's")
    print("  estimators give model states only, which on a peak row stand against the whole peak")
    mem_err = {"dhp": [], "llm-analysis": [], "deepspeed": [], "megatron": []}
    mem_held = {k: [] for k in mem_err}
    for c in cases:
        d = c["dhp"]
        if not c["mem"] or "error" in d:
            continue
        mem, la, ds, meg = d["mem"], c["est"].get("llm_analysis", {}), c["est"].get("deepspeed", {}), c["meg"]
        states = (mem.get("parameters", 0) + mem.get("gradients", 0) + mem.get("optimizer", 0)) / GIB
        layers = c.get("mem_scope") == "layers"
        for what, pub in c["mem"].items():
            if what == "act_gib" and layers:   # the blocks' saved tensors, each estimator's layer terms
                ours, la_v = mem.get("block_activations", 0) / GIB, la.get("layers_act_bytes")
                ds_v, meg_v = None, meg.get("layers_act_bytes")
            elif what == "act_gib":
                ours, la_v = (mem.get("activations", 0) + mem.get("logits", 0)) / GIB, la.get("act_bytes")
                ds_v, meg_v = None, meg.get("act_bytes")
            elif what == "states_gib" and layers:   # DeepSpeed's estimators do not split by layer
                ours, la_v = mem.get("block_states", 0) / GIB, la.get("layers_states_bytes")
                ds_v, meg_v = None, meg.get("layers_states_bytes")
            elif what == "states_gib":
                ours, la_v, ds_v, meg_v = states, la.get("states_bytes"), ds.get("states_bytes"), meg.get("states_bytes")
            else:   # peak: the allocator's peak (torch max reserved), without the CUDA context
                ours = (mem.get("total", 0) - mem.get("reserved", 0)) / GIB
                la_v, ds_v, meg_v = la.get("mem_bytes"), ds.get("states_bytes"), None
            vals = {"dhp": ours, "llm-analysis": la_v and la_v / GIB, "deepspeed": ds_v and ds_v / GIB,
                    "megatron": meg_v and meg_v / GIB}
            scope = what[:-4] + ("/layers" if layers else "")
            line = f"{c['idx']:>3}{'*' if c['held_out'] else ' '}{c['family']:<18} {c['name'][:14]:<14} {scope:<13} pub {pub:7.2f}"
            for k, v in vals.items():
                e = err(v, pub)
                if e is not None:
                    (mem_held if c["held_out"] else mem_err)[k].append((c["idx"], what, e))
                line += f"  {k} " + ("     -" if v is None else f"{v:7.2f} {fmt_err(e)}")
            print(line)
    print("\nfits / OOM")
    print(f"  runs that ran (every check row): dhp predicts fits on {fit_agree} of {fit_total}")
    for c in cases:
        if c.get("fits_unchecked") and c["pub_step_s"] is not None and "error" not in c["dhp"]:
            print(f"  ^ row {c['idx']} not counted, dhp {'fits' if c['dhp']['fits'] else 'OOM'} "
                  f"({c['dhp']['mem'].get('total', 0) / GIB:.1f} GiB): {c['fits_unchecked']}")
    stated = [c for c in cases if c["mem"].get("peak_gib") and "error" not in c["dhp"]]
    ok = sum(1 for c in stated if c["dhp"]["fits"])
    print(f"  rows stating per-GPU peak memory: fits on {ok} of {len(stated)}")
    for c in cases:
        if c.get("stated_oom") and "error" not in c["dhp"]:
            mem = c["dhp"]["mem"]
            print(f"  stated OOM: {c['name']} on {c['gpus']} GPUs (ZeRO-3, micro-batch {c['mb']}): dhp predicts "
                  f"{'OOM' if not c['dhp']['fits'] else 'fits'} ({mem.get('total', 0) / GIB:.1f} of "
                  f"{mem.get('capacity', 0) / GIB:.0f} GiB) -> {'agrees' if not c['dhp']['fits'] else 'disagrees'}")
    print("\nsummary: |step-time error| per source (check rows; no training row's step time was used to fit anything)")
    allerr = []
    for (fam, held), es in sorted(by_fam.items()):
        if held:
            continue
        allerr += es
        refused = sum(1 for x in es if x is None)
        print(f"  {fam:<20} {fmt_stats(stats(es))}" + (f"  ({refused} refused)" if refused else ""))
    print(f"  {'overall':<20} {fmt_stats(stats(allerr))}")
    print(f"  same rows, llm-analysis: {fmt_stats(stats(la_rows))}; dhp: {fmt_stats(stats(dhp_la_rows))}")
    held_out_summary(cases, by_fam, mem_held)
    print("summary: |memory error|")
    for k, v in mem_err.items():
        print(f"  {k:<13} {fmt_stats(stats([e for _, _, e in v]))}")
    for k in ("llm-analysis", "deepspeed", "megatron"):
        rows = {(i, w) for i, w, _ in mem_err[k]}
        ours = [e for i, w, e in mem_err["dhp"] if (i, w) in rows]
        if rows:
            print(f"  where {k} applies: {k} {fmt_stats(stats([e for _, _, e in mem_err[k]]))}; "
                  f"dhp {fmt_stats(stats(ours))}")
    print(f"\nrows not checked ({len(skipped)}):")
    kinds = {}
    for i, r, k, w in skipped:
        kinds.setdefault(k, []).append((i, r, w))
    for k, lst in kinds.items():
        print(f"  {k}: {len(lst)}")
        for i, r, w in lst:
            print(f"    {i:>3} {r['model'][:28]:<28} {w}")
    inferred = [c for c in cases if c["inferred"]]
    print(f"\ninferred fields ({len(inferred)} rows; rules in bench/published_rows.py, interpret):")
    seen = set()
    for c in inferred:
        for x in c["inferred"]:
            if (c["family"], x) not in seen:
                seen.add((c["family"], x))
                print(f"  {c['family']:<20} {x}")


if __name__ == "__main__":
    main()