#!/usr/bin/env bash
# bench/published_rows.py's and published.py's formulas by hand, the bench end to end on a few rows
# (no estimators: make test installs nothing), and dhp clusters --price.
source "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=/usr/bin/python3

# The sources' FLOP formulas and Megatron-LM's theoretical memory, worked by hand.
out=$(cd "$ROOT/bench" && "$PY" - <<'PYEOF' 2>&1
import published as P
import published_rows as R
def near(a, b, what):
    assert abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1), f"{what}: {a} != {b}"
# Narayanan et al.: 96 B s l h^2 (1 + s/6h + V/16lh); B=1 s=6 l=1 h=1 V=16: 96*6*(1+1+1) = 1728
near(R.megatron_flops(1, 6, 1, 1, 16), 1728, "megatron_flops")
near(R.megatron_flops(1, 6, 1, 1, 16, recompute=False), 1296, "megatron_flops x 3/4")
# Korthikanti: 72 B s l h^2 (1 + s/6h + V/12lh); s=6 h=1 V=12: 72*6*3 = 1296
near(R.korthikanti_model_flops(1, 6, 1, 1, 12), 1296, "korthikanti_model_flops")
# llm.c: (6N + 6 L C T) per token: N=10 L=1 C=2 T=3 -> 96 per token, 2 tokens
near(R.llmc_flops(10, 1, 2, 3, 2), 192, "llmc_flops")
# a GPT of 2 layers h=128 f=512, 2 heads, vocab 256, tied: tp 2, pp 1, no distributed optimizer
m = R.gpt_model(2, 128, 2, 256)
c = dict(model=m, tp=2, pp=1, dp=4, zero=0, seqpar=True, rc="selective", seq=64, mb=2, gb=8, vp=1)
r = P.megatron_theoretical(c)
h, L, f = 128, 2, 512
layers = 2 * L * h * h * (1 + f / h + 1 + 2 / h + 1 / (L * h))
Vp = 256                                         # padded to 128 x tp = 256
near(r["states_bytes"], (layers + h * Vp) / 2 * 18, "megatron weights")
s, b = 64, 2                                     # 34 s b h per layer / t, plus embedding and head terms
act = s * b * h * 34 * L + 8 * s * b + s * b * h + s * b * h * 4 * (1 + Vp / h)
near(r["act_bytes"], act / 2, "megatron activations")
# its transformer-layer terms alone (what Korthikanti et al.'s figure 1 counts): no embedding, no head
near(r["layers_states_bytes"], layers / 2 * 18, "megatron layers' weights")
near(r["layers_act_bytes"], s * b * h * 34 * L / 2, "megatron layers' activations")
c["rc"] = "full"
assert P.megatron_theoretical(c)["act_bytes"] is None, "formula applies to selective + SP only"
# published figures as step times: 100 TFLOP/s/GPU on 8 GPUs of F FLOPs
g = dict(metric="TFLOP/s/GPU", value=100, gb=4, seq=2048, gpus=8, family="narayanan-t1", gpu="a100",
         model=R.gpt_model(4, 1024, 16, 51200))
near(R.published_step(g), R.megatron_flops(4, 2048, 4, 1024, 51200) / (100e12 * 8), "TFLOP/s -> s")
g.update(metric="tokens/s/GPU", value=1000)
near(R.published_step(g), 4 * 2048 / (1000 * 8), "tokens/s/GPU -> s")
g.update(metric="samples/s/GPU", value=0.5)
near(R.published_step(g), 4 / (0.5 * 8), "samples/s/GPU -> s")
import math
e = math.log(835.5 / 989.5) / math.log(400 / 700)     # the SXM and NVL datasheet parts
near(R.GRAND_TETON_PEAK, 989.5e12 * (500 / 700) ** e, "Grand Teton 500 W peak")
assert 835.5e12 < R.GRAND_TETON_PEAK < 989.5e12, "between NVL and SXM, as the source says"
# the rows' software as the bench reads it: Megatron-LM and DeepSpeed of 2021 accumulate and reduce fp16
# gradients; MT-NLG's DeepSpeed sends gradients whole, BLOOM's partitions them and runs BF16_Optimizer;
# Megatron-LM of 2022 (Korthikanti et al.) keeps the defaults
keys = ("source model layers hidden heads kv_heads ffn vocab seq gpu gpus tp pp dp cp_or_sp zero_or_fsdp "
        "micro_batch global_batch recompute precision metric value notes").split()
def row(src, **kw):
    r = dict.fromkeys(keys, "")
    r.update(source=src, model="GPT", layers="8", hidden="1024", heads="16", ffn="4096", vocab="51200", seq="2048",
             gpu="A100-80GB", gpus="16", tp="2", pp="4", dp="2", micro_batch="1", global_batch="16",
             recompute="full", precision="mixed", metric="iteration_time_s", value="1")
    r.update(kw)
    return R.interpret(r, 1)
sw = lambda c: (c.get("pipe_engine"), c.get("grad_accum"), c.get("grad_reduce"))
assert sw(row("Smith et al. MT-NLG arXiv 2201.11990")) == ("deepspeed-2021", "add", "bf16"), sw(row("MT-NLG"))
assert sw(row("bigscience BLOOM README")) == ("deepspeed", "bf16-optimizer", None)
assert sw(row("Narayanan et al. SC'21 Table 1 via x")) == (None, "add", "bf16")
assert sw(row("Korthikanti et al. MLSys'23 Table 5 via calculon")) == (None, None, None)
# NeMo's and Megatron-Bridge's performance recipes: bf16 gradient buffers (grad_reduce_in_fp32 False) and,
# with tp > 1, TransformerEngine's userbuffers TP overlap
nemo = lambda **kw: row("NVIDIA/NeMo performance_summary", gpu="H100 (DGX)", precision="fp8", **kw)
assert (nemo()["grad_reduce"], nemo().get("tp_comm_overlap")) == ("bf16", True), nemo()
assert (nemo(tp="1", dp="4")["grad_reduce"], nemo(tp="1", dp="4").get("tp_comm_overlap")) == ("bf16", None)
# llm-foundry's MPT runs compute flash-attn's fused cross-entropy (its default loss_fn fused_crossentropy)
mpt = row("mosaicml/llm-foundry scripts/train/benchmarking/README.md", model="MPT-7b", precision="amp_bf16",
          zero_or_fsdp="FSDP FULL_SHARD", tp="1", pp="1", dp="16")
assert mpt.get("loss") == "fused", mpt
# torchtitan's async-TP runs: --tp-comm-overlap under DTensor TP; its vanilla-TP rows not
tt = lambda notes: row("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md", model="Llama 3.1 70B",
                       layers="80", hidden="8192", heads="64", kv_heads="8", ffn="28672", vocab="128256",
                       seq="8192", gpu="H100 96GB HBM2e 500W", gpus="256", tp="8", pp="1", dp="32",
                       zero_or_fsdp="FSDP2", micro_batch="16", global_batch="512", precision="bf16", notes=notes)
assert tt("FSDP32 TP8 + AsyncTP").get("tp_comm_overlap") is True
assert tt("FSDP32 TP8 + compile; async TP 942.4").get("tp_comm_overlap") is None
print("formulas-ok")
PYEOF
)
if [ "$out" = "formulas-ok" ]; then ok published_bench_formulas_by_hand; else fail published_bench_formulas_by_hand "$out"; fi

# End to end on a few rows: checked ones (an FP8 one among them, one FP8 with ring context parallelism), one eager, a collective and a W (GEMMs timed in training) fit row,
# whose profile's F and B + W stand beside the Zero Bubble run's middle stage.
tsv=$T/rows.tsv
{
    printf 'source\tmodel\tlayers\thidden\theads\tkv_heads\tffn\tvocab\tseq\tgpu\tgpus\ttp\tpp\tdp\tcp_or_sp\tzero_or_fsdp\tmicro_batch\tglobal_batch\trecompute\tprecision\tmetric\tvalue\tnotes\n'
    printf "Korthikanti et al. MLSys'23 Table 5 via calculon\tMegatron-22B\t48\t6144\t64\t64\t24576\t(51200 - uncertain)\t2048\tA100-80GB\t8\t8\t1\t1\tMegatron SP (=TP)\tnone\t4\t4\tselective (attention)\tbf16\titeration_time_s\t1.1\tinterleaving=1\n"
    printf "NVIDIA/NeMo performance_summary\tLLAMA3-8B\t32\t4096\t32\t8\t14336\t128K\t8192\tH100 (DGX)\t8\t1\t1\t8\tCP 1\t\t1\t128\t\tfp8\ttokens/s/GPU\t12036\tx\n"
    printf "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md\tLlama 3.1 8B\t32\t4096\t32\t8\t14336\t128K\t8192\tH100 96GB HBM2e 500W\t8\t1\t1\t8\tCP 1\tFSDP2\t2\t16\tselective\tbf16\ttokens/s/GPU\t5762\tFSDP eager; peak memory 82.4 GiB\n"
    printf "stas00/ml-engineering network/README.md (nccl-tests all_reduce_perf, 8x A100 NVLink3)\tall-reduce payload 16MiB\t\t\t\t\t\t\t\tA100 (8x, NVLink 3/NVSwitch)\t8\t\t\t\t\t\t\t\t\t\tbusbw_GBps\t106.16\tintra-node\n"
    printf "Korthikanti et al. MLSys'23 Fig.1 via calculon\tMegatron-22B\t48\t6144\t64\t64\t24576\t\t2048\tA100-80GB\t8\t8\t1\t1\tMegatron SP\t\t4\t4\tselective\t\tactivation_mem_GiB_per_gpu\t9.5625\tparams+grads+optimizer 45.5625 GiB/GPU\n"
    printf "Qi et al. ICLR'24 'Zero Bubble Pipeline Parallelism' Table 4\tGPT-3-like 1.5B\t22\t2304\t24\t24\t9216\t32000\t1024\tA100-80GB SXM\t8\t1\t8\t1\t\t\t6\t144\tnone\tfp16\tsamples/s/GPU\t11.8\theld out (test); peak memory 30 GiB\n"
    printf "Qi et al. Zero Bubble repository, mem.py iclr_mem(): profiled W\tW (weight-grad GEMMs) 1.5B: 3 layers\t3\t2304\t24\t24\t9216\t\t1024\tA100-80GB SXM\t8\t1\t8\t1\t\t\t6\t\tnone\tfp16\tms (W per micro-batch, one stage)\t9.337\tthe settings tuple (p, n, f, b, w, c, h, a, l) = (8, 24, 18522, 18086, 9337, ...)\n"
    printf "NVIDIA/NeMo performance_summary\tLLAMA3-8B\t32\t4096\t32\t8\t14336\t128K\t8192\tH100 (DGX)\t8\t1\t1\t4\tCP 2\t\t1\t128\t\tfp8\ttokens/s/GPU\t12036\tx\n"
} >"$tsv"
"$PY" "$ROOT/bench/published.py" --dhp "$DHP" --tsv "$tsv" --no-estimators --json "$T/out.json" >"$T/bench" 2>&1
if grep -qE '^  1 korthikanti-t5 +Megatron-22B +8 +8 +1 +1 0 +4 sele +1\.100 +[0-9.]+ +[-+][0-9.]+%' "$T/bench" \
   && grep -qE '^  2 nemo +LLAMA3-8B +8 +1 +1 +8 1 +1 none +10\.890 +[0-9.]+ +[-+][0-9.]+%' "$T/bench" \
   && grep -qE '^  8 nemo +LLAMA3-8B +8 +1 +1 +4 1 +1 none +10\.890 +[0-9.]+ +[-+][0-9.]+%' "$T/bench" \
   && grep -q "context parallelism 2: Megatron-Core's ring attention (cp_comm_type p2p, its default): --strategy sp, cp=ring" "$T/bench" \
   && grep -q 'eager PyTorch' "$T/bench" \
   && grep -qE '^  4 all-reduce payload 16MiB .* intra link' "$T/bench" \
   && grep -qE '^  overall +n= 3 median' "$T/bench" \
   && grep -qE '^  6\*zero-bubble +GPT-3-like 1\.5 +8 +1 +8 +1 0 +6 none +1\.525 ' "$T/bench" \
   && grep -qE '^  held out overall +n= 1 median' "$T/bench" \
   && grep -qE '^  7 W \(weight-grad GEMMs\) 1\.5B.* +9\.337 +9\.[0-9]+ +[-+][0-9.]+%  gemm_sustained \(A100\)' "$T/bench" \
   && grep -qE '^  7 1\.5B +18\.52 +[0-9.]+ +[-+][0-9.]+% +27\.42 +[0-9.]+ +[-+][0-9.]+%' "$T/bench" \
   && grep -qE '^  5 korthikanti-fig1 +Megatron-22B +act/layers +pub +9\.56 +dhp +9\.56 +\+0\.0%' "$T/bench" \
   && grep -qE '^  5 korthikanti-fig1 +Megatron-22B +states/layers pub +45\.56 +dhp +45\.57 +\+0\.0%' "$T/bench" \
   && "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['cases'][0]['dhp']['step_s'] > 0" "$T/out.json"; then
    ok published_bench_runs_dhp_per_row
else
    fail published_bench_runs_dhp_per_row "$(head -c 1500 "$T/bench")"
fi

# The attention sequence-length curve: the fit points beside dhp's ratios, within 2% of both kernels'.
if "$PY" - "$T/bench" <<'PYEOF'
import sys
lines = open(sys.argv[1]).read().split("attention by sequence length")[1].splitlines()[3:9]
for l in lines:
    s, fa3, fa2, d = l.split()
    assert abs(float(d) - float(fa3)) < 0.02 and abs(float(d) - float(fa2)) < 0.02, l
assert lines[-1].split()[0] == "16384"
PYEOF
then
    ok published_bench_attention_sequence_curve
else
    fail published_bench_attention_sequence_curve "$(grep -A9 'attention by sequence length' "$T/bench")"
fi

# dhp clusters --price: the costdb's price of one kernel or collective.
"$DHP" clusters 8xa100-80g --price allreduce:1048576,8 >"$T/p" 2>&1
if "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); t=2*7*7.1e-6+1048576*2*7/8/217e9; assert abs(d['seconds']-t)<1e-12*t+1e-15, d" "$T/p"; then
    ok clusters_price_allreduce_by_hand
else
    fail clusters_price_allreduce_by_hand "$(cat "$T/p")"
fi
expect_err clusters_price_rejects_unknown_kind "unknown kind 'bcast'" "$DHP" clusters 8xh100 --price bcast:1,2
expect_err clusters_price_needs_kind_args "is not KIND:ARGS" "$DHP" clusters 8xh100 --price gemm

# What only the Megatron target prices, dhp run refuses with one line.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
SETUP="--cluster 8xh100 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32 --gpus 1"
"$DHP" data synth --out "$T/data" --samples 16 --window 0 >/dev/null
"$DHP" plan --model tiny-vl $SETUP --strategy 'vision:rc=none;llm:rc=op' -o "$T/op.json" >/dev/null
expect_err run_refuses_op_checkpointing "recompute 'op'" "$DHP" run "$T/op.json" --data "$T/data" --steps 1
"$DHP" models tiny-vl >"$T/tv.json"
"$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); m['modules'][-1]['dropout']=True; json.dump(m, open(sys.argv[2],'w'))" \
    "$T/tv.json" "$T/tvd.json"
"$DHP" plan --model "$T/tvd.json" $SETUP --strategy 'vision:rc=none' -o "$T/d.json" >/dev/null
expect_err run_refuses_dropout "unfused_attention and dropout are priced, not run" "$DHP" run "$T/d.json" --data "$T/data" --steps 1
