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
  (GEMM efficiency, attention efficiency, NCCL bus bandwidth). No training
  row is used to fit anything: the training rows are held out, for checking
  only.
* a row dhp cannot express (FP8, MoE-style features, a configuration the
  source does not give), listed with the reason.

Rows whose notes begin "held out" (rows 121-135: MT-NLG, BLOOM, Zero Bubble's
1F1B baseline, IBM's fms-fsdp, Llama 3 405B) were added after the cost model
was tuned and nothing was fitted to them or tuned on them: they are marked *
and summarized apart (median and worst per source and overall, llm-analysis
on the same rows, memory), the out-of-sample check of issue 22's goals.

Side by side on the same rows: llm-analysis (time and memory), DeepSpeed's
estimate_zero2/3_model_states_mem_needs_all_cold (model states under
ZeRO-2/3) and Megatron-LM's theoretical memory formula (reimplemented below
from megatron/training/theoretical_memory_usage.py). The first two are
installed into build/bench-venv from PyPI; the bench says in one line which
could not be installed and goes on.

Fields the source leaves unstated are filled by a rule named in the row's
"inferred" list (printed), never silently.
"""
import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = float(2**30)

# ---------------------------------------------------------------- hardware
# Link tiers come from the shipped cluster presets (their sources are there).
PRESET = {"a100": "16x8xa100.json", "h100": "2x8xh100.json"}
GPU_FILE = {"a100": "A100-SXM-80GB", "h100": "H100-SXM-80GB"}
LA_GPU = {"a100": "a100-sxm-80gb", "h100": "h100-sxm-80gb"}


def load_json(path):
    with open(path) as f:
        return json.load(f)


def plain(v):
    return v["value"] if isinstance(v, dict) else v


def gpu_numbers(fam):
    g = load_json(os.path.join(ROOT, "costdb", "gpus", GPU_FILE[fam] + ".json"))
    return {k: plain(v) for k, v in g.items() if k not in ("schema", "name")}


# The Grand Teton H100 of torchtitan's benchmarks (benchmarks/llama3_h100_202412_torchtitan.md and
# asyncTP_llama3_h100_2025-06_torchtitan.md, "Hardware"): "96GB HBM2e with 2.4 TB/sec peak memory
# bandwidth", 500 W; its peak TFLOP/s is "between SXM and NVL, and we don't know its exact value"
# (footnote 2), so the SXM file's compute figures stay.
GRAND_TETON_HBM_BW = 2.4e12
# Its compute at the 500 W power limit the source states ("We used the default 500W power limit, although
# tuning it up to 700W TDP can potentially provide further speedups"): between the two datasheet parts the
# source names, H100 SXM (989.5 dense BF16 TFLOP/s, up to 700 W) and H100 NVL (1,671 with sparsity = 835.5
# dense, 350-400 W; NVIDIA H100 datasheet). Same die, so the peak follows the sustainable clock, and dynamic
# power C V^2 f with V rising with f makes the clock a power law of the power limit: the two parts give the
# exponent ln(835.5 / 989.5) / ln(400 / 700) = 0.30 (the cube law's 1/3), and 500 W then 989.5 (500/700)^0.30.
# No training row enters it.
H100_SXM_PEAK, H100_SXM_W, H100_NVL_PEAK, H100_NVL_W = 989.5e12, 700.0, 835.5e12, 400.0
GRAND_TETON_W = 500.0
GRAND_TETON_PEAK = H100_SXM_PEAK * (GRAND_TETON_W / H100_SXM_W) ** (
    math.log(H100_NVL_PEAK / H100_SXM_PEAK) / math.log(H100_NVL_W / H100_SXM_W))


# The presets' NIC per GPU (their "inter" sources: DGX-A100 8x200G HDR, H100 NDR 400 Gb/s), for rows
# whose source states a slower network per node: the preset's bus bandwidth scaled by the NIC share.
PRESET_NIC_GBPS = {"a100": 200.0, "h100": 400.0}


def cluster_json(fam, gpus, hbm_gib=None, hbm_bw=None, node_gbps=None):
    """A one-pool cluster of ceil(gpus / 8) nodes of 8, links as the preset's (the inter-node
    bus bandwidth scaled to node_gbps / 8 per GPU where the row states its network per node)."""
    c = load_json(os.path.join(ROOT, "costdb", "clusters", PRESET[fam]))
    pool = c["pools"][0]
    pool["nodes"] = max(1, -(-gpus // 8))
    if node_gbps:
        inter = pool["inter"]
        inter["busbw"] *= node_gbps / 8 / PRESET_NIC_GBPS[fam]
        inter["source"] = (f"published.tsv row: {node_gbps:g} Gb/s per node of 8; the preset's bus bandwidth "
                           f"scaled by {node_gbps / 8:g} / {PRESET_NIC_GBPS[fam]:g} Gb/s per GPU")
    if hbm_gib or hbm_bw:
        g = load_json(os.path.join(ROOT, "costdb", "gpus", GPU_FILE[fam] + ".json"))
        g["name"] = GPU_FILE[fam] + (f"-{hbm_gib}G" if hbm_gib else "") + ("-hbm2e" if hbm_bw else "")
        if hbm_gib:
            g["hbm_bytes"] = {"value": hbm_gib * GIB, "source": "published.tsv row: the run's GPU memory"}
        if hbm_bw:
            g["hbm_bw"] = {"value": hbm_bw, "source": "torchtitan benchmarks, Hardware: 96GB HBM2e, 2.4 TB/s"}
            g["peak_flops"] = {"value": GRAND_TETON_PEAK,
                               "source": "torchtitan benchmarks, Hardware: 500 W power limit; SXM and NVL datasheet "
                                         "peaks interpolated by power (published.py GRAND_TETON_PEAK)"}
        pool["gpu"] = g
    c["name"] = f"{fam}-{gpus}"
    return c


# ---------------------------------------------------------------- models
def gpt_model(layers, hidden, heads, vocab, ffn=None):
    """Megatron-LM GPT (Narayanan et al., SC'21; Korthikanti et al.): LayerNorm, GELU
    MLP of 4h, biases on every linear, embedding tied to the output layer."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads, "ffn": ffn or 4 * hidden,
            "ffn_kind": "gelu", "norm": "layernorm", "qkv_bias": True, "out_bias": True, "mlp_bias": True,
            "vocab": vocab, "tied_embeddings": True}


def llama_model(layers, hidden, heads, kv, ffn, vocab):
    """Llama 3 (torchtitan): RMSNorm, SwiGLU, no biases, untied output layer."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv, "ffn": ffn, "ffn_kind": "swiglu",
            "norm": "rmsnorm", "vocab": vocab, "tied_embeddings": False}


def mpt_model(layers, hidden, heads, vocab):
    """MPT as llm-foundry's benchmarks ran it (scripts/train/benchmarking/submit_benchmarks.py at
    b2a43a147 runs llm-foundry v0.3.0 with the scripts/train/yamls/pretrain/mpt-*.yaml, which set
    no no_bias): llmfoundry/models/mpt/configuration_mpt.py v0.3.0 defaults no_bias False, so every
    linear and LayerNorm has a bias (the README's NumParams, e.g. 12,853,954,560 for 13b at seq 2048,
    is 12 h^2 L + 9 h L of biases + 4 h L + 2 h of LayerNorms + V h + 2048 h of learned positions);
    LayerNorm, GELU 4h, tied embeddings. The learned positions (one add per token) are left out."""
    return {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": heads, "ffn": 4 * hidden,
            "ffn_kind": "gelu", "norm": "layernorm", "qkv_bias": True, "out_bias": True, "mlp_bias": True,
            "vocab": vocab, "tied_embeddings": True}


def model_params(m):
    """Parameters (for the estimators' inputs and the sources' 6N formulas)."""
    h, L, f, V = m["hidden"], m["layers"], m["ffn"], m["vocab"]
    d = h // m["heads"]
    attn = h * (m["heads"] + 2 * m["kv_heads"]) * d + m["heads"] * d * h
    mlp = (3 if m["ffn_kind"] == "swiglu" else 2) * h * f
    norms = (4 if m["norm"] == "layernorm" else 2) * h
    bias = ((m["heads"] + 2 * m["kv_heads"]) * d + h if m.get("qkv_bias") else 0) + (f + h if m.get("mlp_bias") else 0)
    emb = V * h * (1 if m["tied_embeddings"] else 2)
    return L * (attn + mlp + norms + bias) + emb + norms // 2


def largest_layer(m):
    """DeepSpeed's largest_layer_params: the largest single module (embedding or one linear)."""
    h, f = m["hidden"], m["ffn"]
    return max(m["vocab"] * h, h * f, h * 3 * h)


# ---------------------------------------------------------------- FLOP formulas of the sources
def megatron_flops(B, s, l, h, V, recompute=True):
    """Narayanan et al. SC'21 sec. 5.1: F = 96 B s l h^2 (1 + s/6h + V/(16 l h)), activation
    recomputation included (4 passes); without it 3/4 of that (the FlashAttention repo's
    training/README: "model FLOPs = Megatron formula x 3/4")."""
    f = 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))
    return f if recompute else 0.75 * f


def korthikanti_model_flops(B, s, l, h, V):
    """Korthikanti et al. (arXiv 2205.05198) sec. 6: model FLOPs 72 B s l h^2 (1 + s/6h + V/(12 l h))."""
    return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * l * h))


def llmc_flops(N, L, C, T, tokens):
    """karpathy/llm.c train_gpt2.cu gpt2_estimate_mfu: (6 N + 6 L C T) per token."""
    return (6.0 * N + 6.0 * L * C * T) * tokens


# ---------------------------------------------------------------- the rows
def num(s):
    s = (s or "").strip().replace(",", "")
    m = re.match(r"^[~>]?\s*([0-9.]+)", s)
    return float(m.group(1)) if m else None


def vocab_of(s):
    s = (s or "").strip()
    if s.upper().startswith("128K"):
        return 128256, False
    v = num(s)
    if v is None:
        return 51200, True
    return int(v), "uncertain" in s


NARAYANAN_HEADS = {"GPT-1.7B": 24, "GPT-3.6B": 32, "GPT-7.5B": 32, "GPT-18.4B": 48, "GPT-39.1B": 64,
                   "GPT-76.1B": 80, "GPT-145.6B": 96, "GPT-310.1B": 128, "GPT-529.6B": 128, "GPT-1008B": 160}
# GPT-3 paper (Brown et al., arXiv 2005.14165) Table 2.1 sizes; FlashAttention's 2.7B uses head dim 128.
GPT3_DIMS = {"GPT3-125M": (12, 768, 12), "GPT3-1.3B": (24, 2048, 16), "GPT3-2.7B": (32, 2560, 20)}
MPT_HEADS = {"MPT-70b": 64, "MPT-30b": 56, "MPT-13b": 40, "MPT-7b": 32}


class Skip(Exception):
    """A row dhp cannot express, or that is a costdb input rather than a training run."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind


def family(src, gpu=""):
    if "torchtitan docs/performance.md" in src:   # its Llama 3 rows ran on A100s, its 405B row on Grand Teton H100s
        return "torchtitan-h100" if "H100" in gpu else "torchtitan-a100"
    keys = [("MT-NLG", "mt-nlg"), ("bigscience", "bloom"), ("Zero Bubble", "zero-bubble"), ("fms-fsdp", "fms-fsdp"),
            ("maximizing-training", "fms-fsdp"), ("Llama 3 Herd", "llama3-paper"),
            ("Narayanan et al. SC'21 Table 1", "narayanan-t1"), ("Narayanan et al. SC'21 Table 2", "narayanan-t2"),
            ("Table 5", "korthikanti-t5"), ("MLSys'23 abstract", "korthikanti-abs"), ("Fig.1", "korthikanti-fig1"),
            ("MegaScale", "megascale"), ("DistTrain", "disttrain"), ("NeMo", "nemo"), ("Megatron-Bridge", "nemo"),
            ("torchtitan docs/performance.md", "torchtitan-a100"), ("llama3_h100_202412", "torchtitan-h100"),
            ("asyncTP", "torchtitan-asynctp"), ("llm-foundry", "llm-foundry"), ("FlashAttention-2 paper Table 1", "fa2-t1"),
            ("flash-attention training/README", "fa-train"), ("DeepSpeed", "ulysses"), ("llm.c", "llm.c"),
            ("Aceso", "aceso"), ("lmms-engine", "lmms-engine"), ("MAMF", "gemm"), ("FlashAttention-3", "attention"),
            ("FlashAttention-2 paper Sec 4", "attention"), ("network/README", "nccl")]
    for k, f in keys:
        if k in src:
            return f
    return "other"


def interpret(r, idx):
    """Row -> case dict, or raises Skip."""
    src, fam = r["source"], family(r["source"], r["gpu"])
    prec, metric, notes = r["precision"].lower(), r["metric"], r["notes"]
    if fam == "gemm":
        if "fp8" in prec:
            raise Skip("fp8", "FP8 GEMM: dhp prices BF16 only")
        raise Skip("fit", "GEMM micro-benchmark: sets costdb gemm_eff_max (MAMF)")
    if fam == "attention":
        raise Skip("fit", "attention kernel benchmark: sets costdb attn_eff")
    if fam == "nccl":
        raise Skip("fit", "nccl-tests / all_reduce_bench bus bandwidth: sets the costdb link tiers")
    if "fp8" in prec:
        raise Skip("fp8", "FP8 training: dhp prices BF16/FP16 compute only")
    reasons = {"megascale": "parallel transformer block, sliding-window attention, LAMB; TP/PP/DP not given",
               "disttrain": "per-module configurations of the 72B MLLM not given",
               "ulysses": "no per-configuration figure (only '>175 TFLOP/s' over 1.2-30B models)",
               "aceso": "per-stage heterogeneous configurations searched by Aceso; GPU of the small setup not stated",
               "llama3-paper": "interleaved 1F1B with V and the micro-batch not given, uneven chunks (the first "
                               "chunk the embedding alone, the last the output layer alone; sec. 3.3.2): dhp's vp "
                               "needs every stage's blocks divisible by vp",
               "lmms-engine": "packed variable-length samples (per-document attention spans, images per sample) and "
                              "model dimensions not given; MFU given as a range"}
    if fam in reasons:
        raise Skip("unexpressible", reasons[fam])
    inferred = []
    c = {"idx": idx, "family": fam, "source": src, "name": r["model"], "metric": metric, "value": num(r["value"]),
         "notes": notes, "rc": "none", "zero": 0, "seqpar": False, "vp": 1, "attention": "flash", "dropout": False,
         "precision": "bf16-mixed", "mem": {}, "hbm_gib": 80}
    c["held_out"] = bool(re.match(r"held out\b", notes))
    nm = re.search(r"inter-node ([0-9.]+) Gb/s per node", notes)
    c["node_gbps"] = float(nm.group(1)) if nm else None
    if nm:
        inferred.append(f"inter-node links: the preset's bus bandwidth scaled to the source's {nm.group(1)} Gb/s per node")
    gpus = int(num(r["gpus"]) or 0)
    tp, pp, dp = int(num(r["tp"]) or 1), int(num(r["pp"]) or 1), int(num(r["dp"]) or 0)
    seq = int(num(r["seq"]) or 0)
    mb, gb = num(r["micro_batch"]), num(r["global_batch"])
    rc = r["recompute"].lower()
    c["rc"] = "full" if rc.startswith("full") else "selective" if rc.startswith("selective") else "none"
    L, h = int(num(r["layers"]) or 0), int(num(r["hidden"]) or 0)
    heads, kv, ffn = int(num(r["heads"]) or 0), int(num(r["kv_heads"]) or 0), int(num(r["ffn"]) or 0)
    V, vocab_unsure = vocab_of(r["vocab"])
    gpu = r["gpu"]
    c["gpu"] = "h100" if ("H100" in gpu or "H200" in gpu) else "a100"
    if "96GB" in gpu or "94GB" in gpu:
        c["hbm_gib"] = 96 if "96GB" in gpu else 94
    c["hbm_bw"] = None
    if "H100" in gpu and ("HBM2e" in gpu or "96GB" in gpu) and fam.startswith("torchtitan"):   # Grand Teton
        c["hbm_bw"] = GRAND_TETON_HBM_BW
        inferred.append("Grand Teton H100 HBM2e: 2.4 TB/s (the benchmarks' Hardware section); peak TFLOP/s "
                        f"unknown (between SXM and NVL, the source says): {GRAND_TETON_PEAK / 1e12:.0f} at its "
                        "500 W limit, the SXM and NVL datasheet peaks interpolated by power")
    zero = r["zero_or_fsdp"]
    c["zero"] = 3 if ("ZeRO-3" in zero or "FSDP" in zero and "FSDP=1" not in zero) else 1 if "ZeRO-1" in zero else 0
    cp = r["cp_or_sp"]
    if re.search(r"CP\s*([2-9])", cp):
        raise Skip("unexpressible", "context parallelism of the LLM is not priced by dhp yet")
    if "Megatron SP" in cp:
        c["seqpar"] = True
    if fam in ("narayanan-t1", "narayanan-t2", "korthikanti-t5", "korthikanti-abs", "korthikanti-fig1", "mt-nlg",
               "bloom"):
        # Megatron-LM 2021-22: fp16 mixed precision (18 B/param like bf16-mixed), attention
        # with the fused softmax (no FlashAttention, which came in 2022), dropout 0.1.
        c["attention"], c["dropout"] = "unfused", True
        inferred.append("attention unfused + dropout (Megatron-LM 2021-22, before FlashAttention)")
        if not heads:
            heads = NARAYANAN_HEADS.get(r["model"], 0)
            inferred.append(f"heads {heads} from Narayanan et al. Table 1")
        if vocab_unsure:
            inferred.append("vocab 51200 (the papers' GPT vocabulary)")
        c["model"] = gpt_model(L, h, heads, V, ffn or 4 * h)
        if mb is None:
            mb = 1
            inferred.append("micro-batch 1 (not in the source)")
        if fam in ("narayanan-t1", "narayanan-t2") and c["rc"] == "none":
            c["rc"] = "full"
            inferred.append("full recomputation (the paper's FLOP formula counts it: 4 passes)")
        if "interleaving=3" in notes:
            c["vp"] = 3
        elif fam in ("korthikanti-abs", "korthikanti-fig1") and r["model"] in ("GPT-3 175B", "MT-NLG 530B",
                                                                                "GPT-3 style 530B"):
            c["vp"] = 3
            inferred.append("3 interleaved stages for 175B / 530B (Calculon's Table 5 configs of the same runs)")
        if fam == "korthikanti-abs":
            gb = gpus
            inferred.append("global batch 2240 (Narayanan et al. Table 2's 530B run on 2240 GPUs)")
        if fam == "narayanan-t2" and c["zero"] == 3:
            tp = pp = 1
            c["zero3"] = "deepspeed-2021"
            inferred.append("DeepSpeed ZeRO-3 of the paper's date (arXiv 2104.04473, April 2021: DeepSpeed "
                            "v0.3.13-v0.3.16): --zero3 deepspeed-2021")
        if not dp:
            dp = gpus // (tp * pp)
    elif fam.startswith("torchtitan"):
        if "eager" in notes:
            raise Skip("unexpressible", "eager PyTorch: unfused element-wise ops (dhp prices fused kernels, as torch.compile)")
        c["model"] = llama_model(L, h, heads, kv, ffn, V)
        c["precision"] = "bf16-autocast"   # FSDP2 mixed precision: fp32 sharded weights, bf16 compute
        c["zero3"] = "fsdp2"
        inferred.append("FSDP2 (torchtitan's fully_shard, per-parameter sharding): --zero3 fsdp2, each gathered "
                        "block copied out of its all-gather buffer")
        if fam != "torchtitan-asynctp":
            # torchtitan/optimizer.py build_optimizers of 2024 (3faaa1a0d, 9dec370): fused =
            # optimizer.fused (a store_true flag, unset in the train_configs), foreach = not fused;
            # by 2025-06 (the async TP file) optimizer.implementation defaults to "fused"
            c["adamw"] = "foreach"
            inferred.append("AdamW foreach (torchtitan's optimizer.fused of 2024 defaults to false: foreach=True)")
        if fam == "torchtitan-asynctp":
            gb = mb * dp
            seq = 8192
            inferred.append("global batch = local batch x dp (torchtitan's batch_size is per dp rank)")
        if "selective (layer)" in r["recompute"]:
            raise Skip("unexpressible", "layer-wise SAC (every second block fully recomputed): dhp applies one "
                                        "recomputation to every block")
        if c["rc"] == "selective":   # torchtitan's selective_ac_option 'op' (train_configs/llama3_*.toml)
            c["rc"] = "op"
            if "per-op" not in r["recompute"] and "(op)" not in r["recompute"]:
                inferred.append("selective = torchtitan's per-op SAC (selective_ac_option 'op' of its Llama 3 configs)")
        if "torchtitan-a100" == fam:
            inferred.append("A100 cluster links as the 16x8xa100 preset")
        if tp > 1:
            c["seqpar"] = True     # torchtitan's TP shards the norms' rows (sequence parallel)
            # torchtitan's apply_tp (parallelize_llama.py): DTensor ColwiseParallel / RowwiseParallel with
            # SequenceParallel norms on [b, s, h], sharded on dim 1
            c["tp_style"] = "dtensor"
            inferred.append("PyTorch DTensor TP (torchtitan's apply_tp: Shard(1) sequence-parallel collectives, a "
                            "torch.cat beside each; the gathered input saved): --tp-style dtensor")
        mm = re.search(r"peak memory ([0-9.]+) GiB", notes)
        if mm:
            c["mem"]["peak_gib"] = float(mm.group(1))
    elif fam == "llm-foundry":
        heads = heads or MPT_HEADS[r["model"]]
        c["model"] = mpt_model(L, h, heads, V)
        c["precision"] = "bf16-pure" if "PURE" in r["precision"] else "bf16-autocast"
        # What the runs were (scripts/train/benchmarking/ at b2a43a147, where these rows entered the
        # README): sweep.sh's image mosaicml/pytorch:2.1.0_cu121 and submit_benchmarks.py's llm-foundry
        # v0.3.0 (Composer 0.16.3), no torch.compile, so eager PyTorch; unlike torchtitan's eager rows
        # (Llama: RMSNorm, RoPE, SwiGLU as chains of small kernels) MPT's element-wise work is one
        # kernel per op in eager too (F.layer_norm, GELU, the residual adds; FSDP's bf16 param_dtype
        # keeps the residual stream bf16), which is what dhp prices, so the rows are kept.
        c["adamw"] = "foreach"
        inferred.append("eager PyTorch 2.1 (sweep.sh image, no torch.compile): expressed, MPT's element-wise ops "
                        "are single kernels in eager too; its attention (attn_impl triton: llm-foundry v0.3.0's "
                        "Triton FlashAttention on triton-pre-mlir) is priced as FlashAttention-2, not modelled")
        inferred.append("Composer 0.16.3's DecoupledAdamW (a per-parameter loop of 8 unfused kernels): --adamw foreach")
        if "PURE" not in r["precision"]:
            c["grad_reduce"] = "bf16"
        inferred.append("MP Mode DEFAULT (the README's column; Composer 0.16.3 get_mixed_precision, "
                        "composer/trainer/mosaic_fsdp_utils.py: param and buffer dtype bf16, reduce_dtype unset, "
                        "which torch 2.1 FSDP takes from param_dtype, FlatParamHandle._init_param_reduce_dtypes): "
                        "bf16-autocast with --grad-reduce bf16 (bf16 reduce-scatters, fp32 shards). Inferred: "
                        "v0.3.0 asks for mosaicml>=0.16.3,<0.17 and Composer 0.16.4 (2023-10-11, #2628, 8 days before "
                        "the README commit) sets reduce_dtype float32 for DEFAULT; 0.16.3 taken, as v0.3.0's pin. "
                        "PURE (row 79) as bf16-pure, whose bf16 master weights FSDP does not keep (its shards stay fp32)")
        inferred.append("H100 cluster links as the 2x8xh100 preset" if c["gpu"] == "h100" else
                        "A100 links: 1600 Gb/s RoCE per node = 8 x 200G, as the 16x8xa100 preset")
    elif fam in ("fa2-t1", "fa-train"):
        L, h, heads = GPT3_DIMS[r["model"]]
        inferred.append(f"GPT-3 dims {L} layers x {h} (GPT-3 paper; head dim 128 as FlashAttention's configs)")
        c["model"] = gpt_model(L, h, heads, V)
        c["model"]["vocab"] = V
        c["zero"] = 2
        inferred.append("ZeRO-2 (apex DistributedFusedAdam in the FlashAttention training configs)")
        if fam == "fa-train":
            tokens = 2**19 if "0.5M" in r["global_batch"] else 2**20
        else:
            tokens = 2**20
            inferred.append("global batch 1M tokens (the FlashAttention training configs)")
        gb = tokens // seq
        mb = max(1, 16384 // seq)
        inferred.append(f"micro-batch {mb} (16k tokens per GPU per micro-batch)")
        dp = gpus
    elif fam == "llm.c":
        c["model"] = gpt_model(L, h, heads, 50304)
        c["model"]["tied_embeddings"] = True
        inferred.append("llm.c GPT-2 run: -b 16 -t 1024 -d 1048576, ZeRO-1, padded vocab 50304 (README of discussion #677)")
        mb, gb, c["zero"], dp = 16, 1024, 1, gpus
    elif fam == "zero-bubble":
        # the 1F1B baseline: Megatron-LM's non-interleaved 1F1B (sec. 5.1), TP 1, DP 1; what the paper leaves out
        # comes from the repository's examples/pretrain_zero_bubble.sh (first version, 2024-08; row notes)
        c["model"] = gpt_model(L, h, heads, V, ffn or 4 * h)
        c["model"]["tied_embeddings"] = False
        c["dropout"] = True
        inferred.append("the repo's pretrain_zero_bubble.sh (2024-08): --use-flash-attn, --fp16, "
                        "--untie-embeddings-and-output-weights, SentencePiece tokenizer (vocab 32000 assumed), "
                        "Megatron's default dropout 0.1; no recomputation")
        mm = re.search(r"peak memory ([0-9.]+) GiB", notes)
        if mm:
            c["mem"]["peak_gib"] = float(mm.group(1))
    elif fam == "fms-fsdp":
        # IBM's fms-fsdp: torch FSDP (FULL_SHARD, flat parameters) with bf16 MixedPrecision, SDPA
        # FlashAttention-2, torch.optim.AdamW (foreach), no torch.compile
        c["model"] = llama_model(L, h, heads, kv, ffn, V)
        c["precision"] = "bf16-autocast"
        c["adamw"] = "foreach"
        inferred.append("torch FSDP1 FULL_SHARD (flat parameters): --zero3 units; bf16 MixedPrecision as "
                        "bf16-autocast; torch.optim.AdamW default: --adamw foreach")
        # fms_fsdp/utils/train_utils.py get_policies: train_config.mixed_precision (default True) takes
        # bfSixteen, fms_fsdp/policies/mixed_precision.py (ba0d254): MixedPrecision(param_dtype=bf16,
        # reduce_dtype=bf16, buffer_dtype=bf16): the gradients are reduce-scattered in bf16
        c["grad_reduce"] = "bf16"
        inferred.append("bfSixteen MixedPrecision (fms_fsdp/policies/mixed_precision.py, reduce_dtype bf16, what "
                        "get_policies takes with mixed_precision's default True): --grad-reduce bf16")
        inferred.append("eager PyTorch (use_torch_compile=False): the element-wise ops run unfused, which dhp "
                        "does not price (small next to the GEMMs at hidden 8192 with full recomputation)")
    else:
        raise Skip("unexpressible", "source family not interpreted by the bench")
    if not (gpus and mb and gb and seq and c["model"]["heads"] and c["model"]["layers"]):
        raise Skip("unexpressible", "shape, GPU count or batch not given")
    dp = dp or gpus // (tp * pp)
    if tp * pp * dp != gpus:
        raise Skip("unexpressible", f"tp {tp} x pp {pp} x dp {dp} != {gpus} GPUs")
    c.update(gpus=gpus, tp=tp, pp=pp, dp=dp, mb=int(mb), gb=int(gb), seq=seq, inferred=inferred)
    c["pub_step_s"] = published_step(c)
    states = re.search(r"params\+grads\+optimizer ([0-9.]+) GiB", notes)
    if metric.startswith("activation_mem"):
        c["mem"]["act_gib"] = c["value"]
        c["pub_step_s"] = None
    if states and fam == "korthikanti-fig1":
        c["mem"]["states_gib"] = float(states.group(1))
    if fam == "korthikanti-fig1":
        # Figure 1 is Korthikanti et al.'s formulas for the transformer layers alone: sec. 4.3 leaves the
        # embedding, last layer norm and output layer out ("Equation 5 is a good approximation to the total
        # required activations memory and we will use it in the rest of this paper"), and the figures are
        # 18 B x 12 h^2 L / (p t) and s b h L (10 + 24/t + 5as/ht) or 34 s b h L / t, times the interleaved
        # schedule's 1 + (p-1)/(p m), to the byte (row notes)
        c["mem_scope"] = "layers"
    return c


def stated_ooms(rows, n):
    """Runs a source says did not fit, as cases of their own (after the table's rows):
    Narayanan et al. Table 2's note, 529.6B under ZeRO-3 on 560 GPUs (global batch 2240,
    so 4 samples per GPU), the configuration of its 640-GPU row otherwise."""
    out = []
    for i, r in enumerate(rows, 1):
        if family(r["source"]) == "narayanan-t2" and "ZeRO-3 at 560 GPUs did not fit" in r["notes"] \
                and r["model"] == "GPT-529.6B" and r["zero_or_fsdp"] == "ZeRO-3" and r["gpus"] == "640":
            c = interpret(r, i)
            c.update(idx=n + 1, gpus=560, dp=560, mb=4, gb=2240, pub_step_s=None, stated_oom=True,
                     name="GPT-529.6B OOM", inferred=c["inferred"] + [f"row {i}'s configuration on 560 GPUs, gbs 2240"])
            out.append(c)
    return out


def published_step(c):
    """The published figure as seconds per step, with the source's own FLOP formula."""
    m, metric, v = c["model"], c["metric"], c["value"]
    B, s, L, h, V = c["gb"], c["seq"], m["layers"], m["hidden"], m["vocab"]
    if metric == "iteration_time_s":
        return v
    if metric == "TFLOP/s/GPU":
        recompute = c["family"] != "fa2-t1"
        return megatron_flops(B, s, L, h, V, recompute) / (v * 1e12 * c["gpus"])
    if metric == "tokens/s/GPU":
        return B * s / (v * c["gpus"])
    if metric == "samples/s/GPU":
        return B / (v * c["gpus"])
    if metric.startswith("tokens/s (8 GPUs"):
        return B * s / v
    if metric == "MFU_%":
        peak = 989e12 if c["gpu"] == "h100" else 312e12
        if c["family"] == "llm.c":
            F = llmc_flops(model_params(m), L, h, s, B * s)
        else:
            F = korthikanti_model_flops(B, s, L, h, V)
        return F / (v / 100 * c["gpus"] * peak)
    return None


# ---------------------------------------------------------------- dhp
def strategy_of(c):
    kv = [f"dp={c['dp']}", f"tp={c['tp']}", f"pp={c['pp']}", f"zero={c['zero']}", f"mb={c['mb']}", f"rc={c['rc']}",
          f"seqpar={1 if c['seqpar'] else 0}"]
    if c["vp"] > 1:
        kv.append(f"vp={c['vp']}")
    return "llm:" + ",".join(kv)


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
           "--strategy", strategy_of(c), "-o", ppath, "--json"]
    if c.get("zero3"):
        cmd[-3:-3] = ["--zero3", c["zero3"]]
    if c.get("adamw"):
        cmd[-3:-3] = ["--adamw", c["adamw"]]
    if c.get("grad_reduce"):
        cmd[-3:-3] = ["--grad-reduce", c["grad_reduce"]]
    if c.get("tp_style"):
        cmd[-3:-3] = ["--tp-style", c["tp_style"]]
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
    report(cases, skipped)
    fit_rows(a.dhp, skipped)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": cases, "skipped": [dict(row=i, kind=k, reason=w, source=r["source"], model=r["model"])
                                                   for i, r, k, w in skipped]}, f, indent=1, default=str)


# ---------------------------------------------------------------- fit rows
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
            preset = "8xa100-80g" if gpu.startswith("A100") else "8xh100" if gpu.startswith("H100") else None
            spec = "gemm:" + ",".join(shape.groups())
            fit = "gemm_eff_max" if preset else ""
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
        row = {"row": i, "what": r["model"][:34], "gpu": gpu.split(" (")[0][:22], "measured": v, "fit": fit}
        if preset:
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
    print("\nfit rows: kernel and collective measurements that set costdb numbers (the training rows above are held out)")
    print(f"{'row':>3} {'what':<34} {'gpu':<22} {'measured':>9} {'dhp':>9} {'error':>7}  used to fit")
    for x in out:
        d = x.get("dhp")
        e = err(d, x["measured"])
        print(f"{x['row']:>3} {x['what']:<34} {x['gpu']:<22} {x['measured']:9.3f} " +
              (f"{d:9.3f} {fmt_err(e)}" if d is not None else f"{'-':>9} {'-':>7}") +
              f"  {x['fit'] or ('no costdb entry for this GPU' if d is None else 'check only')}")
    print("  (GEMM, attention: TFLOP/s; attention rows as ratios to head dim 128; all-reduce: bus bandwidth GB/s;")
    print("  GEMM rows at dhp's burst rate, as MAMF times them: a training step's GEMMs are priced at gemm_sustained of it)")
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


def held_out_summary(cases, by_fam, held, mem_held):
    """The rows marked 'held out' in their notes (marked * above): published runs nobody looked at
    while the cost model was tuned, summarized apart from the rows above."""
    fams = [f for f in sorted(by_fam) if held[f]]
    if not fams:
        return
    print("summary, held-out rows (*: notes begin 'held out'; not seen while the cost model was tuned)")
    allerr = []
    for fam in fams:
        allerr += by_fam[fam]
        refused = sum(1 for x in by_fam[fam] if x is None)
        print(f"  {fam:<20} {fmt_stats(stats(by_fam[fam]))}" + (f"  ({refused} refused)" if refused else ""))
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
    by_fam, la_rows, dhp_la_rows, held = {}, [], [], {}
    fit_agree, fit_total = 0, 0
    for c in cases:
        if c["pub_step_s"] is None:
            continue
        held[c["family"]] = c["held_out"]
        d = c["dhp"]
        if "error" in d:
            print(f"{c['idx']:>3} {c['family']:<18} {c['name'][:14]:<14} dhp refused: {d['error']}")
            by_fam.setdefault(c["family"], []).append(None)
            continue
        e = err(d["step_s"], c["pub_step_s"])
        la = c["est"].get("llm_analysis", {})
        ela = err(la.get("step_s"), c["pub_step_s"])
        c["err"], c["err_la"] = e, ela
        by_fam.setdefault(c["family"], []).append(e)
        if ela is not None and not c["held_out"]:
            la_rows.append(ela)
            dhp_la_rows.append(e)
        fit_total += 1
        fit_agree += d["fits"]
        print(f"{c['idx']:>3}{'*' if c['held_out'] else ' '}{c['family']:<18} {c['name'][:14]:<14} {c['gpus']:>5} {c['tp']:>2} {c['pp']:>3} "
              f"{c['dp']:>5} {c['zero']:>1} {c['mb']:>2} {c['rc'][:4]:<4} {c['pub_step_s']:8.3f} {d['step_s']:8.3f} "
              f"{fmt_err(e)} {fmt_err(ela)}  {'yes' if d['fits'] else 'OOM'}")
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
    stated = [c for c in cases if c["mem"].get("peak_gib") and "error" not in c["dhp"]]
    ok = sum(1 for c in stated if c["dhp"]["fits"])
    print(f"  rows stating per-GPU peak memory: fits on {ok} of {len(stated)}")
    for c in cases:
        if c.get("stated_oom") and "error" not in c["dhp"]:
            mem = c["dhp"]["mem"]
            print(f"  stated OOM: {c['name']} on {c['gpus']} GPUs (ZeRO-3, micro-batch {c['mb']}): dhp predicts "
                  f"{'OOM' if not c['dhp']['fits'] else 'fits'} ({mem.get('total', 0) / GIB:.1f} of "
                  f"{mem.get('capacity', 0) / GIB:.0f} GiB) -> {'agrees' if not c['dhp']['fits'] else 'disagrees'}")
    print("\nsummary: |step-time error| per source (check rows; no training row was used to fit anything)")
    allerr = []
    for fam, es in sorted(by_fam.items()):
        if held[fam]:
            continue
        allerr += es
        refused = sum(1 for x in es if x is None)
        print(f"  {fam:<20} {fmt_stats(stats(es))}" + (f"  ({refused} refused)" if refused else ""))
    print(f"  {'overall':<20} {fmt_stats(stats(allerr))}")
    print(f"  same rows, llm-analysis: {fmt_stats(stats(la_rows))}; dhp: {fmt_stats(stats(dhp_la_rows))}")
    held_out_summary(cases, by_fam, held, mem_held)
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
    print(f"\ninferred fields ({len(inferred)} rows; rules in bench/published.py, interpret):")
    seen = set()
    for c in inferred:
        for x in c["inferred"]:
            if (c["family"], x) not in seen:
                seen.add((c["family"], x))
                print(f"  {c['family']:<20} {x}")


if __name__ == "__main__":
    main()
