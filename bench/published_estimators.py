#!/usr/bin/env python3
"""The estimators users already have, on the cases bench/published.py gives it.

Runs inside the bench's virtual environment (build/bench-venv): reads a JSON
list of cases on stdin, writes {key: {"llm_analysis": ..., "deepspeed": ...}}
on stdout. Each estimator that cannot be imported is reported once under
"_missing" and the others go on.

- llm-analysis (PyPI llm-analysis, cli99/llm-analysis): LLMAnalysis.training
  with its own shipped GPU description, flops_efficiency and
  hbm_memory_efficiency set to the same MAMF and copy-bandwidth ratios dhp's
  costdb uses (costdb/gpus/*.json), so both start from the same hardware
  numbers. Time: latency_per_iter; memory: weights + gradients + optimizer
  state + activations per GPU; and its transformer layers' own share of
  both (its weight/activation breakdown per layer, without the embedding,
  the final layer norm and the embedding output), for sources that count
  the layers only.
- DeepSpeed (PyPI deepspeed, imported on the CPU):
  estimate_zero2_model_states_mem_needs_all_cold /
  estimate_zero3_model_states_mem_needs_all_cold, the per-GPU figure of the
  no-offload row (offload_param=none, offload_optimizer=none, zero_init=1).
"""
import contextlib
import dataclasses
import io
import json
import os
import re
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")


def llm_analysis_case(c):
    from llm_analysis.analysis import ActivationRecomputation, DSZeRO, LLMAnalysis
    from llm_analysis.constant import BYTES_FP32
    from llm_analysis.config import DtypeConfig, ModelConfig, ParallelismConfig, get_gpu_config_by_name
    m = c["model"]
    mc = ModelConfig(name=c["key"], num_layers=m["layers"], n_head=m["heads"], hidden_dim=m["hidden"],
                     vocab_size=m["vocab"], max_seq_len=c["seq"], num_key_value_heads=m.get("kv_heads", m["heads"]),
                     ffn_embed_dim=m["ffn"], expansion_ratio=m["ffn"] / m["hidden"])
    gc = get_gpu_config_by_name(c["la_gpu"])
    gc = dataclasses.replace(gc, mem_per_GPU_in_GB=c["hbm_gib"])
    pc = ParallelismConfig(tp_size=c["tp"], pp_size=c["pp"], dp_size=c["dp"],
                           sp_size=c["tp"] if c["seqpar"] else 1)
    la = LLMAnalysis(mc, gc, DtypeConfig(), pc, flops_efficiency=c["gemm_eff"],
                     hbm_memory_efficiency=c["mem_eff"])
    rc = {"none": 0, "selective": 1, "full": 2, "op": 1}[c["rc"]]   # per-op SAC: its nearest, selective
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        s = la.training(batch_size_per_gpu=c["mb"], global_batch_size=c["gb"], seq_len=c["seq"],
                        activation_recomputation=ActivationRecomputation(rc), ds_zero=DSZeRO(min(c["zero"], 3)),
                        flash_attn=c["attention"] == "flash", softmax_dropout=c.get("dropout", False),
                        mlp_gated_linear_units=m["ffn_kind"] == "swiglu")
    states = s["weight_memory_per_gpu"] + s["gradient_memory_per_gpu"] + s["optimizer_state_memory_per_gpu"]
    # the layers alone: LLMAnalysis.training sums the layers' weights (attn + mlp + layernorm) with the
    # embedding's and the last layer norm's, and the layers' activations with the embedding output's
    # and one more layer norm's; its per-layer optimizer state and gradient times its layers per GPU
    zero = DSZeRO(min(c["zero"], 3))
    optim_layer, grad_layer = la.get_memory_optimizer_state_and_gradient_per_layer(ds_zero=zero)
    layers_states = (s["weight_memory_attn_per_gpu"] + s["weight_memory_mlp_per_gpu"]
                     + s["weight_memory_layernorm_per_gpu"] + (optim_layer + grad_layer) * (m["layers"] // c["pp"]))
    layers_act = (s["activation_memory_per_gpu"] - s["activation_memory_embedding_output_per_gpu"]
                  - la.get_activation_memory_per_layernorm(c["mb"], c["seq"], ActivationRecomputation(rc), BYTES_FP32))
    return {"step_s": s["latency_per_iter"], "states_bytes": states,
            "act_bytes": s["activation_memory_per_gpu"], "mem_bytes": states + s["activation_memory_per_gpu"],
            "layers_states_bytes": layers_states, "layers_act_bytes": layers_act}


_DS_ROW = re.compile(r"^\s*([\d.]+)GB\s*\|\s*([\d.]+)GB\s*\|\s*offload_param=none, offload_optimizer=none, zero_init=1")


def deepspeed_case(c):
    if c["zero"] not in (2, 3) or c["tp"] != 1 or c["pp"] != 1:
        return None   # the estimators describe ZeRO-2/3 data parallelism alone
    nodes = max(1, c["gpus"] // 8)
    per_node = c["gpus"] // nodes
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if c["zero"] == 3:
            from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
            estimate_zero3_model_states_mem_needs_all_cold(total_params=c["params"],
                                                           largest_layer_params=c["largest_layer"],
                                                           num_gpus_per_node=per_node, num_nodes=nodes)
        else:
            from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold
            estimate_zero2_model_states_mem_needs_all_cold(total_params=c["params"], num_gpus_per_node=per_node,
                                                           num_nodes=nodes)
    for line in out.getvalue().splitlines():
        hit = _DS_ROW.match(line)
        if hit:   # DeepSpeed prints bytes / 2**30 with the unit "GB"
            return {"states_bytes": float(hit.group(2)) * 2**30}
    raise RuntimeError("no offload-free row in DeepSpeed's output")


def main():
    cases = json.load(sys.stdin)
    res = {"_missing": {}}
    for name, fn, mod in (("llm_analysis", llm_analysis_case, "llm_analysis.analysis"),
                          ("deepspeed", deepspeed_case, "deepspeed.runtime.zero.stage3")):
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                __import__(mod)
        except Exception as e:  # noqa: BLE001 - any import failure means the estimator is missing
            res["_missing"][name] = f"{type(e).__name__}: {e}"[:200]
            continue
        for c in cases:
            try:
                r = fn(c)
            except Exception as e:  # noqa: BLE001 - an estimator refusing a case is reported per case
                r = {"error": f"{type(e).__name__}: {e}"[:160]}
            if r is not None:
                res.setdefault(c["key"], {})[name] = r
    json.dump(res, sys.stdout)


if __name__ == "__main__":
    main()
