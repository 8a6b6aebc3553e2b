"""The rows of bench/published.tsv as cases for bench/published.py.

interpret() turns one row into a case: the model (gpt_model, llama_model,
mpt_model from the row's shape), the GPUs, the strategy (tp, pp, dp, ZeRO,
micro-batch, recomputation, sequence parallelism, interleaving), the
precision and the framework's options (--zero3, --adamw, --grad-reduce,
--tp-style), the published step time (published_step: the figure turned into
seconds with the source's own FLOP formula, megatron_flops,
korthikanti_model_flops, llmc_flops) and the memory the source states. A row
dhp cannot express, or a kernel / collective measurement that sets a costdb
number rather than a training run, raises Skip with its kind and reason.
Fields the source leaves unstated are filled by a rule appended to the case's
"inferred" list (printed by the report), never silently. stated_ooms() adds
the runs a source says did not fit; cluster_json() writes a case's cluster
(the shipped presets' links, the row's GPU memory and network where stated).
"""
import json
import math
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
GIB = float(2**30)

# ---------------------------------------------------------------- hardware
# Link tiers come from the shipped cluster presets (their sources are there).
PRESET = {"a100": "16x8xa100.json", "h100": "2x8xh100.json"}
GPU_FILE = {"a100": "A100-SXM-80GB", "h100": "H100-SXM-80GB"}


def load_json(path):
    with open(path) as f:
        return json.load(f)


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
                                         "peaks interpolated by power (published_rows.py GRAND_TETON_PEAK)"}
            if "peak_flops_fp8" in g:   # the same clock: FP8's peak scales as bf16's (SXM 1979, NVL 1670.5 dense)
                g["peak_flops_fp8"] = {"value": g["peak_flops_fp8"]["value"] * GRAND_TETON_PEAK / H100_SXM_PEAK,
                                       "source": "the SXM file's FP8 peak scaled as GRAND_TETON_PEAK"}
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


def chowdhery_flops(B, s, m):
    """Chowdhery et al. (PaLM, arXiv 2204.02311) Appendix B, the Llama 3 paper's MFU formula: per token
    6 N + 12 L H Q T, N the parameters less the input embedding (torchtitan's reading,
    get_num_flop_per_token), H heads of Q = head dim, T the sequence; no recomputation counted."""
    N = model_params(m) - m["vocab"] * m["hidden"]
    per_token = 6 * N + 12 * m["layers"] * m["heads"] * (m["hidden"] // m["heads"]) * s
    return B * s * per_token


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
# NeMo's performance rows name their models only: layers, hidden, heads, kv heads, ffn, vocab of each
# (Llama 2: Touvron et al., arXiv 2307.09288, and meta-llama/Llama-2-*-hf config.json; Nemotron-4 340B:
# NVIDIA, arXiv 2406.11704, Table 1: squared-ReLU MLP, not gated, 256k vocab).
NEMO_DIMS = {"LLAMA2-7B": (32, 4096, 32, 32, 11008, 32000), "LLAMA2-13B": (40, 5120, 40, 40, 13824, 32000),
             "LLAMA2-70B": (80, 8192, 64, 8, 28672, 32000), "Nemotron-340B": (96, 18432, 96, 8, 73728, 256000)}


def fp8_recipe(fam, prec):
    """dhp plan --fp8 for a row's FP8 training, or None where the bench does not interpret it."""
    if fam == "nemo":
        return "tensorwise" if "current" in prec else "delayed"
    if fam.startswith("torchtitan"):
        return "torchao"
    return None


class Skip(Exception):
    """A row dhp cannot express, or that is a costdb input rather than a training run."""

    def __init__(self, kind, reason):
        super().__init__(reason)
        self.kind = kind


def family(src, gpu=""):
    if "torchtitan docs/performance.md" in src:   # its Llama 3 rows ran on A100s, its 405B row on Grand Teton H100s
        return "torchtitan-h100" if "H100" in gpu else "torchtitan-a100"
    keys = [("MT-NLG", "mt-nlg"), ("bigscience", "bloom"), ("profiled W", "zb-wgrad"), ("Zero Bubble", "zero-bubble"), ("fms-fsdp", "fms-fsdp"),
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
            raise Skip("fit", "FP8 GEMM micro-benchmark: sets costdb gemm_eff_max_fp8 (MAMF)")
        raise Skip("fit", "GEMM micro-benchmark: sets costdb gemm_eff_max (MAMF)")
    if fam == "attention":
        raise Skip("fit", "attention kernel benchmark: sets costdb attn_eff")
    if fam == "nccl":
        raise Skip("fit", "nccl-tests / all_reduce_bench bus bandwidth: sets the costdb link tiers")
    if fam == "zb-wgrad":
        raise Skip("fit", "weight-gradient GEMMs timed inside training: set A100 gemm_sustained")
    fp8 = fp8_recipe(fam, prec) if "fp8" in prec else None
    if "fp8" in prec and not fp8:
        raise Skip("fp8", "FP8 training of a source the bench does not interpret")
    reasons = {"megascale": "parallel transformer block, sliding-window attention, LAMB; TP/PP/DP not given",
               "disttrain": "per-module configurations of the 72B MLLM not given",
               "ulysses": "no per-configuration figure (only '>175 TFLOP/s' over 1.2-30B models)",
               "aceso": "per-stage heterogeneous configurations searched by Aceso; GPU of the small setup not stated",
               "lmms-engine": "packed variable-length samples (per-document attention spans, images per sample) and "
                              "model dimensions not given; MFU given as a range"}
    if fam in reasons:
        raise Skip("unexpressible", reasons[fam])
    inferred = []
    c = {"idx": idx, "family": fam, "source": src, "name": r["model"], "metric": metric, "value": num(r["value"]),
         "notes": notes, "rc": "none", "zero": 0, "seqpar": False, "vp": 1, "attention": "flash", "dropout": False,
         "precision": "bf16-mixed", "mem": {}, "hbm_gib": 80}
    if fp8:
        c["fp8"] = fp8
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
    cpm = re.search(r"CP\s*(\d+)", r["cp_or_sp"])
    cp = int(cpm.group(1)) if cpm else 1   # the source's context-parallel degree
    if cp > 1 and fam.startswith("torchtitan"):
        # torchtitan's context parallelism: PyTorch's context_parallel (torch/distributed/tensor/experimental/
        # _attention.py: the sequence in 2 cp load-balanced chunks, K/V rotated among the cp ranks), FSDP
        # sharding over dp x cp (its dp_shard_cp mesh), as dhp's ZeRO shards over dp x sp
        c["sp"], c["cp"] = cp, "ring"
        inferred.append(f"context parallelism {cp}: PyTorch's ring attention (torchtitan's context_parallel; "
                        "its K/V all-gathered by default, rotate method allgather, where dhp prices them passed "
                        "around the ring beside the attention): --strategy sp, cp=ring")
    if "Megatron SP" in r["cp_or_sp"]:
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
        iv = re.search(r"interleaving=(\d+)", notes)
        if iv:
            c["vp"] = int(iv.group(1))
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
        if fam in ("narayanan-t1", "narayanan-t2", "mt-nlg"):
            # 2021: before Megatron-LM's gradient accumulation fusion (2022-02), with fp16's defaults the
            # weight gradients accumulate in param.grad (autograd), as in DeepSpeed's fp16 engines.
            c["grad_accum"] = "add"
            inferred.append("gradient accumulation by autograd (2021: before Megatron-LM's fusion of 2022-02; "
                            "DeepSpeed fp16): --grad-accum add")
            # --fp16 without --accumulate-allreduce-grads-in-fp32 (sc21/CONFIG.sh): the fp16 param.grad is
            # what torch DDP, Megatron's local DDP and DeepSpeed's fp16 engine all-reduce.
            c["grad_reduce"] = "bf16"
            inferred.append("fp16 gradients all-reduced in fp16 (no --accumulate-allreduce-grads-in-fp32): 2 bytes "
                            "an element, as --grad-reduce bf16 prices them")
        if fam == "mt-nlg":
            # The DeepSpeed of MT-NLG's training (2021; its announcement of 2021-10-11): before PR 1407
            # (2021-09-29, v0.5.4), the pipeline engine sent each gradient whole (is_grad_partitioned False).
            c["pipe_engine"] = "deepspeed-2021"
            inferred.append("DeepSpeed's pipeline engine of 2021 (before v0.5.4: gradients sent whole): "
                            "--pipe-engine deepspeed-2021")
        if fam == "bloom":
            # bigscience's DeepSpeed (the big-science branch PR 1407 came from): gradients partitioned.
            c["pipe_engine"] = "deepspeed"
            c["grad_accum"] = "bf16-optimizer"
            inferred.append("DeepSpeed's BF16_Optimizer with its pipeline engine: --grad-accum bf16-optimizer")
            inferred.append("DeepSpeed's pipeline engine with partitioned gradients (PR 1407, bigscience): "
                            "--pipe-engine deepspeed")
        if not dp:
            dp = gpus // (tp * pp)
    elif fam == "nemo":
        # NeMo 24.07 and Megatron-Bridge 25.11 / 26.02 performance tables: Megatron-Core with
        # TransformerEngine on DGX-H100, bf16 with FP8 linears, the distributed optimizer
        if r["model"] in NEMO_DIMS:
            L, h, heads, kv, ffn, V = NEMO_DIMS[r["model"]]
            inferred.append(f"{r['model']} dims {L} x {h}, {heads}/{kv} heads, ffn {ffn}, vocab {V} (the model's "
                            "paper / config: NEMO_DIMS)")
        if r["model"].startswith("GPT3"):
            c["model"] = gpt_model(L, h, heads, V, ffn or 4 * h)
            if vocab_unsure:
                inferred.append("vocab 51200 (GPT's, padded)")
        elif r["model"].startswith("Nemotron"):
            c["model"] = llama_model(L, h, heads, kv, ffn, V)
            c["model"].update(ffn_kind="gelu", norm="layernorm")
            inferred.append("Nemotron-4: squared-ReLU MLP (not gated, priced as GELU's), LayerNorm, no biases")
        else:
            c["model"] = llama_model(L, h, heads, kv or heads, ffn, V)
        if fp8:   # the dgxc-benchmarking rows run bf16 too
            c["fp8"] = fp8
            inferred.append("FP8 linears as TransformerEngine runs them: --fp8 " + fp8 +
                            (" ('current scaling')" if fp8 == "tensorwise" else
                             " (the recipe's fp8_hybrid with a 1024-step amax history: TE DelayedScaling)"
                             if "dgxc-benchmarking" in src else
                             " (NeMo 24.07's TE DelayedScaling, its default recipe)" if "NeMo" in src else
                             " (the 26.02 table says fp8; 25.11's current scaling assumed)"))
        c["zero"] = 1
        # NVIDIA's recipe of the Nemotron-4 340B benchmark (dgxc-benchmarking nemotron/: configure.sh sets
        # NVTE_FUSED_ATTN=0 for 340b; nemotron4-340b-synth.yaml: distributed_fused_adam with dtype bf16,
        # activations_checkpoint_granularity selective), the rows of that repository stating it; NeMo 24.07's
        # table runs the same configuration (TP 8, PP 8, VP 12, MBS 1, GBS 32 on 128 GPUs: the recipe's
        # GBS = 2 x nodes) within 1% of the recipe's FP8 time (3.18 against 3.16 s) and states no optimizer,
        # recomputation or attention backend: the recipe's are taken for it
        recipe_340b = "dgxc-benchmarking" in src or (r["model"] == "Nemotron-340B" and "NeMo 24.07" in src)
        if recipe_340b:
            c["optim_dtype"], c["rc"] = "bf16", "selective"
            if "NeMo 24.07" in src:
                inferred.append("NVIDIA's recipe of this benchmark (dgxc-benchmarking nemotron/, the same TP/PP/VP/"
                                "MBS/GBS, its FP8 step 3.16 s): Apex DistributedFusedAdam with dtype bf16 "
                                "(--optim-dtype bf16), selective recomputation, FlashAttention (NVTE_FUSED_ATTN=0)")
        else:
            inferred.append("Megatron-Core's distributed optimizer (NeMo's default): ZeRO-1")
            # Megatron-Core's TE layers: TransformerEngine's DotProductAttention, which on Hopper prefers its
            # FusedAttention (cuDNN) backend to FlashAttention (get_attention_backend)
            c["attn_kernel"] = "cudnn"
            inferred.append("TransformerEngine's attention on H100: cuDNN's fused attention (TE prefers it on "
                            "Hopper): --attention cudnn")
        # NeMo's performance recipes (pretrain_performance_optimizations: recipe.trainer.plugins.
        # grad_reduce_in_fp32 = False; its FP8 perf scripts likewise) and Megatron-Bridge's
        # (perf_recipes/_common.py _perf_precision: "Always sets grad_reduce_in_fp32=False")
        c["grad_reduce"] = "bf16"
        inferred.append("grad_reduce_in_fp32 False (NeMo's and Megatron-Bridge's performance recipes): bf16 "
                        "gradient buffers reduced in bf16, --grad-reduce bf16")
        if r["model"] == "LLAMA3_8B" and "Megatron-Bridge" in src:
            # scripts/performance/configs/llama/llama3_workload_base_configs.py (00919dc):
            # LLAMA3_8B_PRETRAIN_CONFIG_H100_FP8_CS_V1 sets context_parallel_size 1, recompute_num_layers 5
            c["rc"], c["rc_layers"] = "full", 5
            inferred.append("recompute_num_layers 5 (Megatron-Bridge's H100 FP8 preset for Llama 3 8B): --strategy "
                            "rc=full,rc_layers=5")
        if tp > 1:
            c["seqpar"] = True
            inferred.append("sequence parallelism with TP (NeMo's performance configs)")
        iv = re.search(r"VP (\d+)", notes)
        if iv and int(iv.group(1)) > 1:
            c["vp"] = int(iv.group(1))
        if cp > 1:
            # Megatron-Core's context parallelism: ring attention, cp_comm_type p2p (its default)
            c["sp"], c["cp"] = cp, "ring"
            inferred.append(f"context parallelism {cp}: Megatron-Core's ring attention (cp_comm_type p2p, its "
                            "default): --strategy sp, cp=ring")
        if not dp:
            dp = gpus // (tp * pp * cp)
        if tp > 1:
            # NeMo's performance recipes (nemo/collections/llm/recipes: gpt3_175b, llama3_70b, ...:
            # MegatronCommOverlapCallback(tp_comm_overlap=True, tp_comm_overlap_cfg=userbuffers_*_h100_*))
            # and Megatron-Bridge's H100 perf recipes (perf_recipes/llama/h100/llama3.py, llama31.py:
            # cfg.comm_overlap.tp_comm_overlap_cfg = userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192, ...)
            c["tp_comm_overlap"] = True
            inferred.append("TP communication overlap (NeMo's and Megatron-Bridge's performance recipes: "
                            "tp_comm_overlap with userbuffers): --tp-comm-overlap, TE's default methods priced "
                            "(the recipes' per-shape SM counts not read)")
    elif fam.startswith("torchtitan"):
        if "eager" in notes:
            raise Skip("unexpressible", "eager PyTorch: unfused element-wise ops (dhp prices fused kernels, as torch.compile)")
        if pp > 1:
            # torchtitan 9dec370 apply_fsdp: reshard_after_forward False under PP; PyTorch's pipelining
            # (torch/distributed/pipelining/stage.py backward_maybe_with_nosync, 2024) syncs FSDP2's gradients
            # at each stage's last backward only
            raise Skip("unexpressible", "FSDP2 under PyTorch's pipelining: units kept gathered from each forward "
                       "to its backward, gradients whole to the last backward (dhp's ZeRO-3 on stages gathers for "
                       "both and reduce-scatters every micro-batch); micro-batch count not given")
        if fp8:
            inferred.append("Float8 linears: torchao's Float8Linear, tensorwise dynamic scaling (torchtitan's float8 "
                            "converter of 2024-12): --fp8 torchao; FSDP's float8 all-gather not modelled")
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
            # torchtitan's layer-wise SAC, selective_ac_option "2" (its job config's default): every second
            # block of a model part in a full checkpoint (_apply_layer_sac, count % 2 == 0), L // 2 of them;
            # dhp recomputes the first L // 2 (rc_layers): as many blocks, other positions, priced alike
            c["rc"], c["rc_layers"] = "full", L // 2
            inferred.append("layer-wise SAC every second block (selective_ac_option '2', torchtitan's default): "
                            "--strategy rc=full,rc_layers=%d" % (L // 2))
        elif c["rc"] == "selective":   # torchtitan's selective_ac_option 'op' (train_configs/llama3_*.toml)
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
            if re.search(r"\+ ?AsyncTP|async TP run", notes):
                # torchtitan's enable_async_tensor_parallel (with torch.compile): Inductor's micro-pipelined TP
                c["tp_comm_overlap"] = True
                inferred.append("async TP (torchtitan's enable_async_tensor_parallel under torch.compile): "
                                "--tp-comm-overlap under --tp-style dtensor")
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
        # llm-foundry's ComposerMPTCausalLM: loss_fn defaults to 'fused_crossentropy', flash-attn's
        # CrossEntropyLoss (flash_attn.losses.cross_entropy; xentropy_cuda_lib at v0.3.0)
        c["loss"] = "fused"
        inferred.append("flash-attn's fused cross entropy (ComposerMPTCausalLM's default loss_fn fused_crossentropy): "
                        "--loss fused")
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
        c["attn_kernel"] = "cudnn"
        inferred.append("llm.c built with USE_CUDNN=1 (discussion #677's build line): cuDNN's fused attention, "
                        "--attention cudnn")
        mb, gb, c["zero"], dp = 16, 1024, 1, gpus
    elif fam == "zero-bubble":
        # the 1F1B baseline: Megatron-LM's non-interleaved 1F1B (sec. 5.1), TP 1, DP 1; what the paper leaves
        # out comes from the repository as the paper ran it: branch `arxiv` (f68d387, "for arxiv paper",
        # 2023-11-29), examples/pretrain_zero_bubble.sh and megatron/arguments.py: --fp16, no --use-flash-attn
        # (the legacy model's core attention: QK^T, the fused scale-mask-softmax, dropout, PV), no
        # --untie-embeddings-and-output-weights (tied), dropout at its 0.1 default, no recomputation
        c["model"] = gpt_model(L, h, heads, V, ffn or 4 * h)
        c["model"]["tied_embeddings"] = True
        c["attention"], c["dropout"] = "unfused", True
        inferred.append("the repo's arxiv branch (f68d387, 2023-11-29) pretrain_zero_bubble.sh: --fp16, no "
                        "--use-flash-attn (attention unfused + dropout 0.1), tied embeddings, SentencePiece "
                        "tokenizer (vocab 32000 assumed); no recomputation")
        mm = re.search(r"peak memory ([0-9.]+) GiB", notes)
        if mm:
            c["mem"]["peak_gib"] = float(mm.group(1))
    elif fam == "llama3-paper":
        # Llama Team, 'The Llama 3 Herd of Models' (arXiv 2407.21783), sec. 3.3.2-3.3.4 and Table 4: TP 8,
        # PP 16 interleaved with V chunks a rank, one layer fewer on the first and the last stage ("the first
        # model chunk on the first stage has only the embedding, and the last model chunk on the last stage
        # has only output projection and loss calculation"), no activation checkpointing at 8K, FSDP sharding
        # the optimizer states and gradients, gradients accumulated over the micro-batches and reduce-scattered
        # in FP32 (sec. 3.3.4)
        c["model"] = llama_model(L, h, heads, kv, ffn, V)
        c["vp"], c["split_ends"] = 8, True
        inferred.append("V = 8 chunks a rank of one slot each: the only even split in which the first chunk holds the "
                        "embedding alone (126 layers + the embedding + the output layer = 128 = 16 x 8): --strategy "
                        "split=ends (Megatron-Core's account-for-embedding/loss-in-pipeline-split)")
        mb = 1
        inferred.append("micro-batch 1 (one 8K sequence; not given): 32 / 16 micro-batches a step per pipeline")
        c["zero"] = 1
        micro, vp = int(gb // (dp * mb)), c["vp"]
        units = min(2 * (pp - 2) + (vp - 1) * pp + 1, micro * vp)   # the schedule's peak on the second rank
        c["fits_unchecked"] = ("dhp's interleaved 1F1B is Megatron-Core's, whose second rank (the first one's first "
                               "chunk is the embedding alone) holds min(2 (pp - 2) + (vp - 1) pp + 1, "
                               f"{micro} micro-batches x vp) = {units} one-block chunk forwards in flight; Llama 3 ran "
                               "its own schedule (N micro-batches a round, not given) and freed each stage's input and "
                               "output tensors early (sec. 3.3.2), which dhp does not express")
        inferred.append("FSDP sharding optimizer states and gradients, the parameters not resharded after forward, "
                        "gradients accumulated in FP32 over the micro-batches and reduce-scattered in FP32 (sec. 3.3.4), "
                        "as FSDP under pipelining does once a step (torchtitan: no gradient sync but on the last "
                        "micro-batch): ZeRO-1 (a distributed optimizer) under bf16-mixed, whole fp32 gradients "
                        "accumulated; ZeRO-2 would reduce-scatter every micro-batch's (+537% here)")
        c["seqpar"] = True
        inferred.append("tensor parallelism with sequence parallelism (Korthikanti et al.; not stated)")
        inferred.append("FlashAttention, causal over the whole 8K sequence (the document mask's shorter spans not "
                        "modelled); inter-node links as the H100 preset's (~376 Gb/s per GPU; the source: 400 Gb/s "
                        "RoCE per GPU)")
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
    dp = dp or gpus // (tp * pp * c.get("sp", 1))
    if tp * pp * dp * c.get("sp", 1) != gpus:
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
    if metric == "TFLOP/s/GPU" and c["family"] == "llama3-paper":
        return chowdhery_flops(B, s, m) / (v * 1e12 * c["gpus"])
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
