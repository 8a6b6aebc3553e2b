#!/usr/bin/env bash
# dhp profile: --quick writes a GPU and a cluster file that load through the
# normal costdb paths, with sane measured fields; under mpirun -np 2 the
# collectives are measured and fitted; bad options give one line and exit 2.
# Never asserts a timing: only signs, ranges the hardware cannot leave, and structure.
. "$(dirname "$0")/lib.sh"
cd "$T"
export OPENBLAS_NUM_THREADS=1

if "$DHP" profile --quick -o "$T/g.json" --cluster-out "$T/c.json" >"$T/out" 2>"$T/err" \
   && [ -s "$T/g.json" ] && [ -s "$T/c.json" ] && grep -q '^  gemm fp32' "$T/out" && grep -q "wrote $T/c.json" "$T/out" \
   && ! grep -q 'attention bf16' "$T/out"; then
    ok profile_quick_writes_both_files
else fail profile_quick_writes_both_files "$(head -c 400 "$T/err")"; fi

if /usr/bin/python3 - "$T/g.json" "$T/c.json" "$(hostname)" <<'PY' 2>"$T/err"
import json, os, sys
g = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2])); host = sys.argv[3]
assert g["schema"] == "dhp.gpu/1" and g["name"].startswith("CPU-"), g["name"]
v = {k: g[k]["value"] for k in ["peak_flops", "gemm_eff_max", "gemm_half", "attn_eff", "attn_score_s",
                                 "attn_bwd_score_s", "attn_row_s", "attn_bwd_row_s", "hbm_bytes", "hbm_bw", "mem_eff", "reserved_bytes",
                                 "kernel_launch_s"]}
for k in v:
    assert g[k]["source"].startswith("measured by dhp profile on " + host + " "), (k, g[k]["source"])
# ranges no CPU can leave (a core does 1e8 .. 1e13 FLOP/s, memory moves 1e8 .. 1e13 B/s)
assert 1e8 < v["peak_flops"] < 1e14, v
assert 0 < v["gemm_eff_max"] <= 1 and 0 < v["attn_eff"] <= 1 and 0 < v["mem_eff"] <= 1, v
assert 0 <= v["gemm_half"] <= 1e5, v
assert 1e8 < v["hbm_bw"] < 1e13, v
phys = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
assert v["hbm_bytes"] == phys, (v["hbm_bytes"], phys)         # one rank: the whole host
assert 0 < v["reserved_bytes"] < v["hbm_bytes"], v
assert 0 < v["kernel_launch_s"] < 1e-3, v
m = g["measurements"]
assert m["ranks"] == 1 and len(m["gemm"]["shapes"]) == 27 and len(m["attention"]) == 4, m.keys()
assert [a["causal"] for a in m["attention"]] == [False, False, False, True], m["attention"]   # the LLM's kind too
# the CPU backend has no bf16 attention: nothing of it written
assert "attn_bf16" not in g and not any(k.startswith("bf16_") for a in m["attention"] for k in a), m["attention"]
# nor its bf16 GEMMs (timed on device backends only)
assert "gemm_bf16" not in g and not any(k.startswith("bf16_") for s in m["gemm"]["shapes"] for k in s), m["gemm"]
assert min(v["attn_score_s"], v["attn_bwd_score_s"], v["attn_row_s"], v["attn_bwd_row_s"]) >= 0, v
for a in m["attention"]:   # the fitted model, evaluated as the planner does, is what the file reports
    assert a["sequences_per_call"] == min(16, -(-1024 // a["seq"])), a   # a micro-batch's 1024 rows per call
    span = (a["seq"] + 1) / 2 if a["causal"] else a["seq"]   # row r of a causal sequence sees r + 1 keys
    S, R, d = a["seq"] * span * a["heads"], a["seq"] * a["heads"], a["head_dim"]
    fwd = S * (v["attn_score_s"] + 4 * d / (v["peak_flops"] * v["attn_eff"])) + R * v["attn_row_s"] + v["kernel_launch_s"]
    bwd = (S * (v["attn_bwd_score_s"] + 2.5 * 4 * d / (v["peak_flops"] * v["attn_eff"])) + R * v["attn_bwd_row_s"]
           + v["kernel_launch_s"])
    assert abs(a["model_fwd_seconds"] - fwd) <= 1e-9 * fwd and abs(a["model_bwd_seconds"] - bwd) <= 1e-9 * bwd, a
fit = m["gemm"]["rate_max"]
assert abs(fit / v["peak_flops"] - v["gemm_eff_max"]) < 1e-9, (fit, v)   # gemm_eff_max = fitted rate / peak
if m["cpu_hz"] > 0:   # peak = a power of two FLOP/cycle x clock x cores, at or above the fitted rate
    fpc = m["flops_per_cycle"]
    assert fpc >= 1 and fpc == 2 ** round(__import__("math").log2(fpc)), fpc
    assert abs(v["peak_flops"] - fpc * m["cpu_hz"] * m["core_share"]) < 1e-6 * v["peak_flops"]
    # rounded up from the higher of the fit and the best shape (a contended run's shapes scatter)
    def rate(sh):   # as the fit sees a shape: its time less the launch cost (when that leaves half of it)
        t = sh["seconds"] - v["kernel_launch_s"]
        return 2.0 * sh["m"] * sh["n"] * sh["k"] / (t if t > 0.5 * sh["seconds"] else sh["seconds"])
    best = max([fit] + [rate(sh) for sh in m["gemm"]["shapes"]])
    assert fit <= v["peak_flops"] < 2 * best * (1 + 1e-9), (fit, best, v["peak_flops"])
assert m["stream"]["triad_bw"] <= v["hbm_bw"]
pool = c["pools"][0]
assert c["schema"] == "dhp.cluster/1" and c["name"] == "cpu-1" and pool["nodes"] == 1 and pool["gpus_per_node"] == 1
assert {k: pool["gpu"][k]["value"] for k in v} == v, "the cluster's GPU differs from the GPU file"
assert pool["intra"]["busbw"] > 0 and pool["intra"]["alpha_s"] >= 0
assert "memcpy" in pool["intra"]["source"] and "not measured" in pool["inter"]["source"]
assert [r["op"] for r in c["measurements"]["collectives"]] == ["self-memcpy"] * 3
assert pool["compute_speed"]["value"] == [1], pool["compute_speed"]    # one rank shares with nobody
ew = g["elementwise"]   # every executor element-wise kernel, cache-resident and at the STREAM size
kernels = ["zero", "copy", "add", "bias", "bias_grad", "rmsnorm", "rmsnorm_bwd", "rope", "rope_bwd", "swiglu",
           "swiglu_bwd", "gelu", "gelu_bwd", "cross_entropy", "sumsq", "attn_merge", "layernorm", "layernorm_bwd"]
assert sorted(k for k in ew if k not in ("elements", "source")) == sorted(kernels), ew.keys()
assert len(ew["elements"]) == 2 and 0 < ew["elements"][0] < ew["elements"][1], ew["elements"]
assert all(len(ew[k]) == 2 and all(1e7 < b < 1e13 for b in ew[k]) for k in kernels), ew
assert ew["source"].startswith("measured by dhp profile on " + host + " "), ew["source"]
assert pool["gpu"]["elementwise"] == ew
# mem_eff: the add, SwiGLU and RMSNorm (12, 12, 8 B/element) at the table's large size, not a second measurement
combined = 32 / (12 / ew["add"][1] + 12 / ew["swiglu"][1] + 8 / ew["rmsnorm"][1])
assert abs(g["mem_eff"]["value"] - min(1, combined / g["hbm_bw"]["value"])) < 1e-9 * g["mem_eff"]["value"], g["mem_eff"]
PY
then ok profile_quick_fields_sane; else fail profile_quick_fields_sane "$(tail -c 400 "$T/err")"; fi

if [ -n "${TEST_BIN:-}" ] && [ -x "$TEST_BIN" ]; then
    DHP_PROFILE_GPU="$T/g.json" DHP_PROFILE_CLUSTER="$T/c.json" "$TEST_BIN" profile_written_files_load 2>&1 | grep -E '^(ok|FAIL|skipped)'
else skip profile_written_files_load "TEST_BIN not set"; fi

expect_exit profile_cluster_loads_in_clusters 0 "$DHP" clusters "$T/c.json"
if "$DHP" plan --model tiny-vl --cluster "$T/c.json" --vision-tokens 64 --batch 2 --top 1 --no-baselines -o "$T/p.json" \
       >"$T/out" 2>"$T/err" && grep -q 'CPU-' "$T/out" && grep -q '"gpus_per_node":[[:space:]]*1' "$T/p.json"; then
    ok profile_cluster_prices_a_plan
else fail profile_cluster_prices_a_plan "$(head -c 400 "$T/err")"; fi

# under mpirun: two ranks measure at once, collectives fitted per operation and jointly
if command -v mpirun >/dev/null 2>&1; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0
    if mpirun --oversubscribe -np 2 "$DHP" profile --quick --json --cluster-out "$T/c2.json" >"$T/j2.json" 2>"$T/err" \
       && /usr/bin/python3 - "$T/c2.json" "$T/j2.json" <<'PY' 2>>"$T/err"
import json, sys
c = json.load(open(sys.argv[1])); j = json.load(open(sys.argv[2]))
assert j["cluster"] == c, "--json differs from the written cluster"
pool = c["pools"][0]
assert c["name"] == "cpu-2" and pool["gpus_per_node"] == 2 and pool["nodes"] == 1
assert j["gpu"]["measurements"]["ranks"] == 2
assert abs(j["gpu"]["hbm_bytes"]["value"] * 2 - j["gpu"]["measurements"]["memory"]["phys_bytes"]) < 2
intra = pool["intra"]
assert intra["busbw"] > 0 and intra["alpha_s"] >= 0 and "2 ranks" in intra["source"], intra
m = c["measurements"]
ops = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"]
assert [r["op"] for r in m["collectives"]] == [o for o in ops for _ in range(3)], m["collectives"]
for r in m["collectives"]:
    assert r["seconds"] > 0 and r["bytes"] > 0
    want = {"all-reduce": 2 * (2 - 1) / 2, "send-recv": 1}.get(r["op"], (2 - 1) / 2)
    assert abs(r["busbw"] - r["algbw"] * want) <= 1e-9 * r["algbw"], r        # nccl-tests definition
for o in ops:
    f = m["fits"][o]
    assert f["busbw"] > 0 and f["alpha_s"] >= 0 and f["points"] == 3, (o, f)
assert m["fits"]["joint"]["points"] == 15
assert m["fits"]["joint"]["busbw"] == intra["busbw"] and m["fits"]["joint"]["alpha_s"] == intra["alpha_s"]
ops = pool["intra_ops"]   # each collective's own fit, as the cost model prices it inside the node
for o in ["all-reduce", "all-gather", "reduce-scatter", "all-to-all"]:
    assert ops[o]["busbw"] == m["fits"][o]["busbw"] and ops[o]["alpha_s"] == m["fits"][o]["alpha_s"], (o, ops)
sp = pool["compute_speed"]
sets = pool.get("compute_sets", {"value": [0, 0]})["value"]   # mpirun binds 2 ranks to a core each by default
assert len(sets) == 2 and sets[0] == 0 and sets[1] in (0, 1), sets
assert len(sp["value"]) == sets.count(0) and sp["value"][0] == 1, (sp, sets)   # relative to one alone
assert all(0 < x <= 1 for x in sp["value"]), sp
assert "2 ranks" in sp["source"] and "MPI_Barrier" in sp["source"], sp["source"]
PY
    then ok profile_mpirun_np2_fits_alpha_busbw; else fail profile_mpirun_np2_fits_alpha_busbw "$(tail -c 600 "$T/err")"; fi
    # The two CPU-sharing measurements run in make test only: under the
    # sanitizers (make test-asan, DHP_SANITIZED) they take 31 of the script's 70 s
    # and time instrumented kernels, and the np 2 profile above runs the same code.
    if [ -z "${DHP_SANITIZED:-}" ]; then
    # four ranks on one CPU: each computes at about 1/k of one alone while k
    # compute, and k of them cannot run much more than one CPU's worth. A range,
    # not a timing: quick reads of this VM spread 0.94-1.13 (a window per rank,
    # opened when the rank first ran, read 1.09-1.27 at four ranks)
    if command -v taskset >/dev/null 2>&1; then
        if taskset -c 0 mpirun --oversubscribe --bind-to none -np 4 "$DHP" profile --quick --cluster-out "$T/c4.json" \
               >/dev/null 2>"$T/err" && /usr/bin/python3 - "$T/c4.json" <<'PY' 2>>"$T/err"
import json, sys
pool = json.load(open(sys.argv[1]))["pools"][0]
sp = pool["compute_speed"]["value"]
assert "compute_sets" not in pool, pool["compute_sets"]   # one CPU for all: the host is the set
assert len(sp) == 4 and sp[0] == 1, sp
cpus = [k * sp[k - 1] for k in range(2, 5)]      # CPUs' worth the k ranks ran, one alone = 1
assert all(0.7 <= x <= 1.3 for x in cpus) and sp[1] > sp[2] > sp[3], (cpus, sp)
PY
        then ok profile_four_ranks_on_one_cpu_share_it; else fail profile_four_ranks_on_one_cpu_share_it "$(tail -c 600 "$T/err")"; fi
    else skip profile_four_ranks_on_one_cpu_share_it "taskset not installed"; fi
    # three ranks bound to two CPUs (0 and 2 share one): rank 0 measures how
    # long its CPU takes to come back from computing rank 2 (compute_handoff_s).
    # Its value is the scheduler's, so only its presence, sign and bound.
    if command -v taskset >/dev/null 2>&1 && [ "$(nproc)" -ge 2 ]; then
        if taskset -c 0,1 mpirun --oversubscribe --bind-to core:overload-allowed -np 3 "$DHP" profile --quick \
               --cluster-out "$T/c3.json" >"$T/out3" 2>"$T/err" && /usr/bin/python3 - "$T/c3.json" "$T/out3" <<'PY' 2>>"$T/err"
import json, sys
pool = json.load(open(sys.argv[1]))["pools"][0]
assert pool["compute_sets"]["value"] == [0, 1, 0], pool["compute_sets"]
h = pool["compute_handoff_s"]
assert 0 < h["value"] < 0.1, h
assert "exchanges 8 bytes with rank 1" in h["source"] and "set-mate rank 2" in h["source"], h["source"]
assert "gets its core back from a computing mate after" in open(sys.argv[2]).read()
PY
        then ok profile_three_ranks_on_two_cpus_measure_the_handoff
        else fail profile_three_ranks_on_two_cpus_measure_the_handoff "$(tail -c 600 "$T/err")"; fi
    else skip profile_three_ranks_on_two_cpus_measure_the_handoff "taskset not installed or one CPU"; fi
    fi
else skip profile_mpirun_np2_fits_alpha_busbw "mpirun not installed"; fi

# --backend cuda: on a host without a GPU (or a build without nvcc) one clear
# line and exit 1, nothing written; with a GPU, the files load and the fields
# are in ranges no GPU can leave.
"$DHP" profile --backend cuda --quick -o "$T/cg.json" --cluster-out "$T/cc.json" >"$T/cout" 2>"$T/cerr"
cuda_rc=$?
if [ "$cuda_rc" = 0 ]; then
    if /usr/bin/python3 - "$T/cg.json" "$T/cc.json" <<'PY' 2>"$T/err"
import json, sys
g = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2]))
v = {k: g[k]["value"] for k in ["peak_flops", "gemm_eff_max", "gemm_half", "attn_eff", "hbm_bytes", "hbm_bw",
                                 "mem_eff", "reserved_bytes", "kernel_launch_s"]}
assert not g["name"].startswith("CPU-"), g["name"]
assert 1e12 < v["peak_flops"] < 1e17 and 0 < v["gemm_eff_max"] <= 1 and 0 < v["attn_eff"] <= 1, v
assert 1e10 < v["hbm_bw"] < 1e14 and 0 < v["mem_eff"] <= 1 and 1e9 < v["hbm_bytes"] < 1e13, v
assert 0 <= v["reserved_bytes"] < v["hbm_bytes"] and 0 < v["kernel_launch_s"] < 1e-3, v
m = g["measurements"]
assert len(m["gemm"]["shapes"]) == 8 and len(m["attention"]) == 4 and "linear_forward" in m["gemm"]["kernel"], m["gemm"]
assert c["name"] == "cuda-1" and "compute_speed" not in c["pools"][0], c["name"]
assert c["measurements"]["collectives"][0]["op"] == "self-memcpy", c["measurements"]["collectives"][0]
PY
    then ok profile_cuda_quick_writes_both_files; else fail profile_cuda_quick_writes_both_files "$(tail -c 600 "$T/err")"; fi
elif [ "$cuda_rc" = 1 ] && [ "$(wc -l <"$T/cerr")" = 1 ] && grep -qE "no CUDA device|without CUDA" "$T/cerr" \
     && [ ! -e "$T/cg.json" ] && [ ! -e "$T/cc.json" ]; then
    ok profile_cuda_without_a_gpu_fails_cleanly
    skip profile_cuda_quick_writes_both_files "$(cat "$T/cerr")"
else
    fail profile_cuda_without_a_gpu_fails_cleanly "exit $cuda_rc: $(head -c 300 "$T/cerr")"
fi
# The CUDA path through the emulator (build/dhp-emu: the CUDA backend's
# kernels and NCCL emulated on the CPU): its timings mean nothing, but the
# path is the GPU's - the kernels checked against the CPU backend, timed
# through the backend table, NCCL collectives through the communicator (two
# ranks under mpirun) - and the files it writes load and price a plan.
if [ -n "${DHP_EMU:-}" ] && [ -x "$DHP_EMU" ]; then
    np=1 launch=()
    command -v mpirun >/dev/null 2>&1 && np=2 launch=(mpirun --oversubscribe -np 2)
    if "${launch[@]}" "$DHP_EMU" profile --backend cuda --tf32 --quick -o "$T/eg.json" --cluster-out "$T/ec.json" \
           >"$T/eout" 2>"$T/eerr" \
       && grep -q '^backend: cuda-emu' "$T/eout" && grep -q 'cuda kernels    match the CPU backend' "$T/eout" \
       && grep -q '^  attention bf16  .* (rms [0-9]*%, the same shapes; attn_bf16)$' "$T/eout" \
       && grep -q '^  gemm bf16       best .* TFLOP/s, the same 8 shapes through linear_forward_bf16 (gemm_bf16)$' "$T/eout" \
       && /usr/bin/python3 - "$T/eg.json" "$T/ec.json" "$np" <<'PY' 2>"$T/err"
import json, sys
g = json.load(open(sys.argv[1])); c = json.load(open(sys.argv[2])); n = int(sys.argv[3])
assert g["name"] == "cuda-emu", g["name"]
m = g["measurements"]
assert "linear_forward" in m["gemm"]["kernel"] and len(m["gemm"]["shapes"]) == 8, m["gemm"]
assert len(m["attention"]) == 4 and all(a["fwd_seconds"] > 0 and a["bwd_seconds"] > 0 for a in m["attention"]), m["attention"]
assert "the cuda-emu backend's kernels" in g["peak_flops"]["source"], g["peak_flops"]["source"]
assert g["kernel_launch_s"]["value"] > 0 and g["hbm_bw"]["value"] > 0, g
# the device's SMs, which the planner's GEMM wave model reads (the emulator's device has 1)
assert g["sm_count"]["value"] == m["sms"] == 1 and "multiProcessorCount" in g["sm_count"]["source"], g.get("sm_count")
# --tf32: the grid again on TF32 (the emulator rounds the operands), fitted into the field dhp plan --tf32 prices at
assert g["peak_flops_tf32"]["value"] > 0 and "CUBLAS_COMPUTE_32F_FAST_TF32" in g["peak_flops_tf32"]["source"], g["peak_flops_tf32"]
assert all(s["tf32_seconds"] > 0 and s["tf32_model_seconds"] > 0 for s in m["gemm"]["shapes"]), m["gemm"]["shapes"]
assert c["pools"][0]["gpu"]["peak_flops_tf32"]["value"] == g["peak_flops_tf32"]["value"]
# the bf16 attention (set_attention_bf16 on) timed over the same shapes, fitted into attn_bf16, each shape's
# times and price (the fit's terms as the planner evaluates them) under measurements; the cluster's GPU the same
a16 = g["attn_bf16"]
terms = ["flop_s", "score_s", "bwd_score_s", "row_s", "bwd_row_s"]
assert all(0 <= a16[k] <= 1 for k in terms) and "cuda_attention16.cuh" in a16["source"], a16
assert c["pools"][0]["gpu"]["attn_bf16"] == a16
launch = g["kernel_launch_s"]["value"]
for a in m["attention"]:
    assert a["bf16_fwd_seconds"] > 0 and a["bf16_bwd_seconds"] > 0, a
    span = (a["seq"] + 1) / 2 if a["causal"] else a["seq"]
    S, R, d = a["seq"] * span * a["heads"], a["seq"] * a["heads"], a["head_dim"]
    fwd = S * (a16["score_s"] + 4 * d * a16["flop_s"]) + R * a16["row_s"] + launch
    bwd = S * (a16["bwd_score_s"] + 2.5 * 4 * d * a16["flop_s"]) + R * a16["bwd_row_s"] + launch
    assert abs(a["bf16_model_fwd_seconds"] - fwd) <= 1e-9 * fwd and abs(a["bf16_model_bwd_seconds"] - bwd) <= 1e-9 * bwd, a
# the grid again through linear_forward_bf16 (bf16-mixed's linears): gemm_bf16's peak (the best rate) and each
# shape's rate / it on the grid's axes, so its price gives each measured bf16 time back (time less the launch, or the
# whole time where the launch would be half of it: costdb/profile_fit.c less_launch); the cluster's GPU the same
g16 = g["gemm_bf16"]
assert "linear_forward_bf16" in g16["source"] and g16["m"] == [64, 256] and g16["n"] == g16["k"] == [32, 256], g16
assert c["pools"][0]["gpu"]["gemm_bf16"] == g16
rates = []
for s in m["gemm"]["shapes"]:
    t, net = s["bf16_seconds"], s["bf16_seconds"] - launch
    rates.append(2 * s["m"] * s["n"] * s["k"] / (net if net > 0.5 * t else t))
    assert t > 0 and abs(s["bf16_model_seconds"] - (t if net > 0.5 * t else t + launch)) <= 1e-9 * t, s
assert abs(g16["peak_flops"] - max(rates)) <= 1e-9 * max(rates), (g16["peak_flops"], rates)
assert all(abs(e - r / max(rates)) <= 1e-9 for e, r in zip(g16["eff"], rates)), (g16["eff"], rates)
pool = c["pools"][0]
assert c["name"] == "cuda-%d" % n and pool["gpus_per_node"] == n and "compute_speed" not in pool, c["name"]
assert pool["gpu"]["name"] == "cuda-emu"
ops = ["all-reduce", "all-gather", "reduce-scatter", "all-to-all", "send-recv"] if n > 1 else ["self-memcpy"]
assert [r["op"] for r in c["measurements"]["collectives"]] == [o for o in ops for _ in range(3)]
if n > 1:
    assert "ex_comm over NCCL" in pool["intra"]["source"] and pool["intra"]["busbw"] > 0, pool["intra"]
PY
    then ok profile_cuda_emulated_writes_both_files; else fail profile_cuda_emulated_writes_both_files "$(tail -c 400 "$T/eerr" "$T/err")"; fi
    if "$DHP" plan --model tiny-vl --cluster "$T/ec.json" --vision-tokens 64 --batch 2 --top 1 --no-baselines \
           -o "$T/ep.json" >"$T/out" 2>"$T/err" && grep -q 'cuda-emu' "$T/out"; then
        ok profile_cuda_emulated_cluster_prices_a_plan
    else fail profile_cuda_emulated_cluster_prices_a_plan "$(head -c 400 "$T/err")"; fi
    # emu_step CLUSTER [dhp simulate options]: tiny-vl's simulated step time (s) on the cluster file
    emu_step() { local c=$1; shift; "$DHP" simulate --model tiny-vl --cluster "$c" --vision-tokens 64 --batch 2 "$@" \
                 --strategy 'vision:dp=1;llm:dp=1' --json 2>>"$T/err" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step_time_s"])'; }
    # --tf32 plans price fp32 GEMMs at the measured peak_flops_tf32: halve it, the GEMMs take longer
    if /usr/bin/python3 - "$T/ec.json" "$T/ec_slow.json" <<'PY' 2>"$T/err"
import json, sys
c = json.load(open(sys.argv[1]))
c["pools"][0]["gpu"]["peak_flops_tf32"]["value"] /= 2
json.dump(c, open(sys.argv[2], "w"))
PY
    then
        a=$(emu_step "$T/ec.json" --precision fp32 --tf32); b=$(emu_step "$T/ec_slow.json" --precision fp32 --tf32); tf32_step=$a
        if [ -n "$a" ] && [ -n "$b" ] && /usr/bin/python3 -c "import sys; sys.exit(0 if $b > $a else 1)"; then
            echo "# tf32 step on the emulated profile: ${a} s, at half its peak_flops_tf32 ${b} s"; ok profile_tf32_rate_prices_tf32_plans
        else fail profile_tf32_rate_prices_tf32_plans "step $a s vs $b s: $(head -c 300 "$T/err")"; fi
    else fail profile_tf32_rate_prices_tf32_plans "$(head -c 300 "$T/err")"; fi
    # bf16-mixed plans price the dhp target's attention from attn_bf16: double its terms, the step takes longer
    if /usr/bin/python3 - "$T/ec.json" "$T/ec_a16.json" <<'PY' 2>"$T/err"
import json, sys
c = json.load(open(sys.argv[1]))
a16 = c["pools"][0]["gpu"]["attn_bf16"]
for k in ["flop_s", "score_s", "bwd_score_s", "row_s", "bwd_row_s"]: a16[k] *= 2
json.dump(c, open(sys.argv[2], "w"))
PY
    then
        a=$(emu_step "$T/ec.json" --precision bf16-mixed); b=$(emu_step "$T/ec_a16.json" --precision bf16-mixed); bf16_step=$a
        if [ -n "$a" ] && [ -n "$b" ] && /usr/bin/python3 -c "import sys; sys.exit(0 if $b > $a else 1)"; then
            echo "# bf16-mixed step on the emulated profile: ${a} s, at twice its attn_bf16 ${b} s"; ok profile_attn_bf16_prices_bf16_plans
        else fail profile_attn_bf16_prices_bf16_plans "step $a s vs $b s: $(head -c 300 "$T/err")"; fi
    else fail profile_attn_bf16_prices_bf16_plans "$(head -c 300 "$T/err")"; fi
    # the dhp target's bf16 GEMMs are priced from gemm_bf16: halve its peak, the bf16-mixed step takes longer, the
    # fp32 (--tf32) step does not move
    if /usr/bin/python3 - "$T/ec.json" "$T/ec_g16.json" <<'PY' 2>"$T/err"
import json, sys
c = json.load(open(sys.argv[1]))
c["pools"][0]["gpu"]["gemm_bf16"]["peak_flops"] /= 2
json.dump(c, open(sys.argv[2], "w"))
PY
    then
        a=$(emu_step "$T/ec_g16.json" --precision bf16-mixed); b=$(emu_step "$T/ec_g16.json" --precision fp32 --tf32)
        if [ -n "$a" ] && [ -n "${bf16_step:-}" ] && [ -n "$b" ] && [ "$b" = "${tf32_step:-}" ] \
           && /usr/bin/python3 -c "import sys; sys.exit(0 if $a > $bf16_step else 1)"; then
            echo "# bf16-mixed step on the emulated profile: ${bf16_step} s, at half its gemm_bf16 peak ${a} s (fp32 --tf32 ${b} s both)"
            ok profile_gemm_bf16_prices_bf16_plans
        else fail profile_gemm_bf16_prices_bf16_plans "bf16 step ${bf16_step:-} s vs $a s, tf32 ${tf32_step:-} s vs $b s: $(head -c 300 "$T/err")"; fi
    else fail profile_gemm_bf16_prices_bf16_plans "$(head -c 300 "$T/err")"; fi
else fail profile_cuda_emulated_writes_both_files "DHP_EMU (build/dhp-emu) not built: make build/dhp-emu"; fi
expect_err profile_unknown_backend "unknown backend 'tpu'" "$DHP" profile --backend tpu
# --tf32 on the CPU backend: dhp run's line (executor/backend_pick.c ex_backend_tf32), before any measuring
expect_err profile_tf32_refused_on_the_cpu_backend '^dhp profile: --tf32: backend cpu has no TF32 mode \(a tensor-core format; it computes fp32 GEMMs exactly\)' \
    "$DHP" profile --tf32 --quick
expect_err profile_gemm_fp32_is_gone "unknown option '--gemm-fp32'" "$DHP" profile --gemm-fp32
expect_err profile_bad_option "unknown option '--frobnicate'" "$DHP" profile --frobnicate
expect_err profile_missing_file_name "-o needs a file name" "$DHP" profile -o
expect_err profile_same_file_twice "same file" "$DHP" profile -o "$T/x.json" --cluster-out "$T/x.json"
expect_err profile_unwritable "nonexistent-dir" "$DHP" profile --quick -o /nonexistent-dir/g.json
if ls "$T" | grep -q 'tmp'; then fail profile_no_partial_output "a temp file was left behind"; else ok profile_no_partial_output; fi
expect_exit profile_help 0 "$DHP" profile --help
