#!/usr/bin/env python3
"""bench/gpu_check.sh's figures from its runs' logs (stdlib only: it runs on
the GPU machine's python3).

  compare A.log B.log TOL [MIN]   every step's loss of B within TOL relative of A's
                                  (and, with MIN, somewhere further apart than MIN)
  train PLAN MEMORY LOG WARMUP    a training run: step time, tokens/s, FLOP rate and
                                  MFU, predicted vs measured, peak memory per category
  blocks WARMUP PLAN_A LOG_A PLAN_B LOG_B
                                  the transformer blocks' own rate: two runs of one LLM
                                  that differ only in their number of blocks
  llmc LLMC_LOG WARMUP TOKENS PLAN LOG
                                  llm.c's train_gpt2cu beside dhp on the same shape

Model FLOPs are the plan's own (the planner's count, its prediction's
model_flops, dhp plan's MFU's numerator), so a measured rate is that count
over the measured step. MFU is quoted against the GPU's dense BF16
datasheet peak (costdb/gpus, matched by the name nvidia-smi gives, GPU_NAME)
where the GPU is known; the plan's own peak (a profiled file's: the fastest
fp32 rate it measured, rounded up) is what dhp plan's MFU column uses."""
import glob, json, os, statistics, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def steps_of(log):
    return [json.loads(line) for line in open(log) if line.startswith("{")]


def timed(steps, warmup):
    """The steps after the warm-up (at least the last one)."""
    return steps[min(warmup, len(steps) - 1):]


def plan_flops_per_step(plan):
    """Model FLOPs of one step, as the planner counts them (its MFU's numerator)."""
    return plan["prediction"]["model_flops"]


def datasheet_peak():
    """(name, dense BF16 FLOP/s) of the costdb GPU file whose family the visible GPU's name carries, else None."""
    seen = os.environ.get("GPU_NAME", "")
    for path in sorted(glob.glob(os.path.join(ROOT, "costdb", "gpus", "*.json"))):
        g = json.load(open(path))
        family = g["name"].split("-")[0]          # H100, H200, A100, L40S
        if family and family in seen:
            return g["name"], g["peak_flops"]["value"]
    return None


def rate_line(label, flops, seconds):
    rate = flops / seconds
    ds = datasheet_peak()
    mfu = f"MFU {100 * rate / ds[1]:.1f}% of {ds[0]}'s dense BF16 peak ({ds[1] / 1e12:.0f} TFLOP/s)" if ds \
        else f"no datasheet peak for this GPU ('{os.environ.get('GPU_NAME', '')}')"
    return f"  {label:11s} {rate / 1e12:.3g} TFLOP/s; {mfu}"


def cmd_compare(a_log, b_log, tol, least=None):
    a, b = ([s["loss"] for s in steps_of(f)] for f in (a_log, b_log))
    if len(a) != len(b) or not a:
        print(f"{len(a)} vs {len(b)} steps")
        return 1
    worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    ok = worst <= float(tol) and (least is None or worst > float(least))
    apart = f", and must exceed {float(least):.0e}" if least is not None else ""
    print(f"losses {a[-1]:.6f} and {b[-1]:.6f} at step {len(a)}, worst relative difference {worst:.2e} "
          f"(allowed {float(tol):.2e}{apart})")
    return 0 if ok else 1


def cmd_train(plan_path, mem_path, log, warmup):
    plan, mem = json.load(open(plan_path)), json.load(open(mem_path))
    steps = steps_of(log)
    run = timed(steps, int(warmup))
    pred = plan["prediction"]
    step_s = statistics.median(s["step_s"] for s in run)
    tok_s = statistics.median(s["tokens_per_s"] for s in run)
    vis_s = statistics.median(s["vision_tokens_per_s"] for s in run)
    flops = plan_flops_per_step(plan)
    print(f"  loss {steps[0]['loss']:.4f} -> {steps[-1]['loss']:.4f}; median of steps {len(steps) - len(run) + 1}..{len(steps)}:")
    print(f"  step time   predicted {pred['step_time_s']:.4f} s, measured {step_s:.4f} s "
          f"({100 * (pred['step_time_s'] / step_s - 1):+.1f}%)")
    print(f"  tokens/s    {tok_s:.0f} LLM, {vis_s:.0f} vision (predicted {pred['tokens_per_s']:.0f}, "
          f"{pred['vision_tokens_per_s']:.0f})")
    print(rate_line("measured", flops, step_s))
    print(rate_line("predicted", flops, pred["step_time_s"]))
    print(f"  MFU         {100 * pred['mfu'] * pred['step_time_s'] / step_s:.1f}% of the plan's peak "
          f"(predicted {100 * pred['mfu']:.1f}%; dhp plan's figure)")
    # peak memory per category: rank 0's allocator counters against the planner's terms
    want = {"params": ["parameters"], "grads": ["gradients"], "optim": ["optimizer"], "zero_buffers": ["zero_buffers"],
            "activations": ["activations", "logits"], "comm": ["comm_buffers"]}
    got = steps[-1]["ranks"][0]["peak_bytes"]
    # the encoder -> LLM hand-off's buffers and messages, which no module holds: communication memory
    handoff = mem["peak_bytes"] - mem["modules_peak_bytes"]
    print("  peak memory predicted / measured (MiB):")
    for cat, terms in want.items():
        p = (sum(m.get(t, 0) for m in mem["modules"] for t in terms) + (handoff if cat == "comm" else 0)) / 2**20
        g = got.get(cat, 0) / 2**20
        print(f"    {cat:13s} {p:10.2f} {g:10.2f}" + (f"  ({100 * (p / g - 1):+.1f}%)" if g > 0 else ""))
    print(f"    {'(plan total)':13s} {mem['peak_bytes'] / 2**20:10.1f}   incl. reserved and fragmentation")
    return 0


def layers_of(plan):
    return next(m for m in plan["model"]["modules"] if m["kind"] == "llm")["layers"]


def cmd_blocks(warmup, plan_a, log_a, plan_b, log_b):
    """(F_b - F_a) / (t_b - t_a): the step's FLOPs and seconds that the extra blocks add, so the
    embedding, the head, the loss and the optimizer's fixed part drop out."""
    runs = []
    for plan_path, log in ((plan_a, log_a), (plan_b, log_b)):
        plan = json.load(open(plan_path))
        step_s = statistics.median(s["step_s"] for s in timed(steps_of(log), int(warmup)))
        runs.append((layers_of(plan), plan_flops_per_step(plan), step_s, plan["prediction"]["step_time_s"]))
    (la, fa, ta, pa), (lb, fb, tb, pb) = runs
    for layers, flops, step_s, pred in runs:
        print(f"  {layers:3d} blocks  step predicted {pred:.4f} s, measured {step_s:.4f} s ({100 * (pred / step_s - 1):+.1f}%); "
              f"{flops / step_s / 1e12:.3g} TFLOP/s whole model")
    if lb == la or tb <= ta:
        print(f"  blocks: no difference to take ({la} and {lb} blocks, {ta:.4f} and {tb:.4f} s)")
        return 1
    per_block, per_block_pred = (tb - ta) / (lb - la), (pb - pa) / (lb - la)
    print(f"  one block   predicted {1e3 * per_block_pred:.3f} ms, measured {1e3 * per_block:.3f} ms "
          f"({100 * (per_block_pred / per_block - 1):+.1f}%)")
    print(rate_line("blocks", fb - fa, tb - ta))
    return 0


def cmd_llmc(llmc_log, warmup, tokens, plan_path, log):
    """llm.c prints 'step N/M | ... | X ms | ...' per step; its step is `tokens` tokens."""
    ms = [float(part.split()[0]) for line in open(llmc_log) if line.startswith("step ")
          for part in line.split("|") if part.strip().endswith(" ms")]
    if not ms:
        print(f"  llm.c: no step lines in {llmc_log}")
        return 1
    llmc_s = statistics.median(ms[min(int(warmup), len(ms) - 1):]) / 1e3
    plan = json.load(open(plan_path))
    dhp_s = statistics.median(s["step_s"] for s in timed(steps_of(log), int(warmup)))
    dhp_tokens = plan["workload"]["global_batch"] * (plan["workload"]["text_tokens"])
    a, b = int(tokens) / llmc_s, dhp_tokens / dhp_s
    print(f"  llm.c       {a:.0f} tokens/s ({1e3 * llmc_s:.1f} ms a step of {int(tokens)} tokens)")
    print(f"  dhp         {b:.0f} tokens/s ({1e3 * dhp_s:.1f} ms a step of {dhp_tokens} tokens); "
          f"{b / a:.2f}x llm.c's")
    print(rate_line("dhp", plan_flops_per_step(plan), dhp_s))
    return 0


COMMANDS = {"compare": cmd_compare, "train": cmd_train, "blocks": cmd_blocks, "llmc": cmd_llmc}

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        sys.exit(__doc__)
    sys.exit(COMMANDS[sys.argv[1]](*sys.argv[2:]))
