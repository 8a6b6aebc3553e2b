#!/usr/bin/env bash
# dhp run --backend: the CUDA backend driving whole runs, on the CPU through
# the emulator build (build/dhp-emu: executor/cuda_kernels.cu against
# tests/cudaemu.h, device-pointer guard on). (a) Plans on 1-4 ranks (one rank,
# DP, TP, ZeRO-3, disaggregated, pipeline, the LLM's context parallelism) run
# with `dhp-emu run --backend cuda` give the CPU backend's losses and final
# weights and moments of the same plan within 1e-5 and its memory peaks by
# category exactly, but the CUDA backend's own buffers (cuBLASLt's workspace,
# reduction and bias-gradient scratch) that `dhp simulate --backend cuda`
# predicts; (b) a checkpoint written
# by either backend resumes on the other with the uninterrupted run's
# continuation; (c) `dhp run --backend cuda` on a machine without a usable
# GPU exits 2 with one line, and the default says which backend in one line;
# (d) an NCCL stream that does not wait for the compute stream is caught.
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip backend "mpirun not found"; exit 0; fi
if ! /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then skip backend "/usr/bin/python3 has no numpy"; exit 0; fi
if [ -z "${DHP_EMU:-}" ] || [ ! -x "$DHP_EMU" ]; then fail backend "DHP_EMU (build/dhp-emu) not built: make build/dhp-emu"; exit 0; fi
HERE=$(cd "$(dirname "$0")" && pwd)
# 4 steps; 2 in the sanitizer build (DHP_SANITIZED, make test-asan), where the emulated
# kernels cost ~3 s a step: steps 3 and 4 run the same code as step 2 (the optimizer's
# second update, reused buffers), so the sanitizers see every path in half the time
STEPS=4
[ -n "${DHP_SANITIZED:-}" ] && STEPS=2
HALF=$((STEPS / 2))
. "$HERE/run_lib.sh"

"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null || { fail backend_data "dhp data synth failed"; exit 0; }

# (c) no GPU: --backend cuda refused in one line (exit 2); auto says cpu in one line
plan one colocated "vision:dp=1;llm:dp=1" --gpus 1 || exit 0
"$DHP" run "$T/one.json" --data "$T/data" --steps 1 --backend cuda >"$T/nogpu.out" 2>"$T/nogpu.err"
rc=$?
if [ "$rc" = 0 ]; then skip backend_cuda_without_gpu "a CUDA device is usable here"
elif [ "$rc" = 2 ] && [ "$(wc -l <"$T/nogpu.err")" = 1 ] && grep -q '^dhp run: --backend cuda: ' "$T/nogpu.err" \
     && [ ! -s "$T/nogpu.out" ]; then ok backend_cuda_without_gpu_exits_2_in_one_line
else fail backend_cuda_without_gpu_exits_2_in_one_line "exit $rc, stderr: $(head -c 300 "$T/nogpu.err")"; fi
"$DHP" run "$T/one.json" --data "$T/data" --steps 1 >"$T/auto.out" 2>"$T/auto.err"
if [ "$rc" != 0 ] && [ "$(grep -c '^backend: ' "$T/auto.out")" = 1 ] && grep -q '^backend: cpu (' "$T/auto.out"; then
    ok backend_default_is_cpu_without_gpu_in_one_line
elif [ "$rc" = 0 ]; then skip backend_default_is_cpu_without_gpu "a CUDA device is usable here"
else fail backend_default_is_cpu_without_gpu_in_one_line "$(head -c 300 "$T/auto.out") $(head -c 300 "$T/auto.err")"; fi
"$DHP" run "$T/one.json" --data "$T/data" --steps 1 --backend gpu >/dev/null 2>"$T/bad.err"
rc=$?
if [ "$rc" = 2 ] && grep -q "'gpu' is not cpu, cuda or auto" "$T/bad.err"; then ok backend_unknown_name_is_a_usage_error
else fail backend_unknown_name_is_a_usage_error "exit $rc: $(head -c 300 "$T/bad.err")"; fi

# The guard dhp-emu runs with: host memory handed to a kernel, or device memory
# given as a copy's host side, aborts naming the call; device pointers pass.
if [ -z "${EMU_GUARD_CHECK:-}" ] || [ ! -x "$EMU_GUARD_CHECK" ]; then fail backend_emu_guard "EMU_GUARD_CHECK not built"
else
    out=$("$EMU_GUARD_CHECK" device 2>&1); a=$?
    k=$("$EMU_GUARD_CHECK" kernel 2>&1); b=$?
    c=$("$EMU_GUARD_CHECK" copy 2>&1); cc=$?
    if [ "$a" = 0 ] && [ "$b" != 0 ] && [ "$cc" != 0 ] && echo "$k" | grep -q 'cudaemu guard: scale_kernel: argument .* is not device memory' \
       && echo "$c" | grep -q 'cudaemu guard: cudaMemcpy: source .* is device memory'; then ok backend_emu_guard_catches_host_pointers
    else fail backend_emu_guard_catches_host_pointers "device: $a $out; kernel: $b $k; copy: $cc $c"; fi
    # a page-locked source of an asynchronous copy written before the host synchronized aborts at the synchronize
    p=$("$EMU_GUARD_CHECK" pinned 2>&1); a=$?
    k=$("$EMU_GUARD_CHECK" pinned-race 2>&1); b=$?
    if [ "$a" = 0 ] && [ "$b" != 0 ] && grep -q 'cudaemu stream order: cudaDeviceSynchronize: the page-locked source' <<<"$k"; then
        ok backend_emu_catches_a_pinned_source_written_before_its_copy_synchronized
    else fail backend_emu_catches_a_pinned_source_written_before_its_copy_synchronized "pinned: $a $p; race: $b $k"; fi
fi

# (a) each plan on the CPU backend (dhp) and the emulated CUDA backend (dhp-emu)
WORST_LOSS=0
WORST_WEIGHT=0
both() {   # both NAME: NAME_cpu and NAME_cuda from NAME.json
    local name=$1
    cp "$T/$name.json" "$T/${name}_cpu.json"
    cp "$T/$name.json" "$T/${name}_cuda.json"
    if ! train "${name}_cpu" --backend cpu; then fail "backend_cuda_emu_matches_cpu_$name" "cpu run: $(tail -c 300 "$T/${name}_cpu.err")"; return 1; fi
    if ! RUN_DHP="$DHP_EMU" train "${name}_cuda" --backend cuda; then
        fail "backend_cuda_emu_matches_cpu_$name" "cuda-emu run: $(tail -c 300 "$T/${name}_cuda.err")"; return 1
    fi
    if ! grep -q '^backend: cuda-emu (asked with --backend cuda; emulated on the CPU)' "$T/${name}_cuda.err"; then
        fail "backend_cuda_emu_matches_cpu_$name" "the emulated run does not say backend cuda-emu: $(head -c 200 "$T/${name}_cuda.err")"; return 1
    fi
    return 0
}
check_backends() {
    local name=$1 lo wo
    both "$name" || return
    losses "$T/${name}_cpu.log" >"$T/${name}_cpu.losses"
    losses "$T/${name}_cuda.log" >"$T/${name}_cuda.losses"
    if ! lo=$(same_losses "$T/${name}_cpu.losses" "$T/${name}_cuda.losses" 2>&1); then fail "backend_cuda_emu_matches_cpu_$name" "$lo"; return; fi
    if ! wo=$($DIFF "$T/${name}_cpu.ck" "$T/${name}_cuda.ck" --skip-key-bias --rtol 1e-5 2>&1); then
        fail "backend_cuda_emu_matches_cpu_$name" "weights: $wo"; return
    fi
    # the backend's allocator counts device memory as the CPU's does: every rank's peaks by category equal
    # but the CUDA backend's own buffers, category workspace (t_run.sh checks the CPU's against the planner's prediction,
    # check_memory below the emulated CUDA run's)
    local mo
    if ! mo=$(/usr/bin/python3 - "$T/${name}_cpu.log" "$T/${name}_cuda.log" <<'PY'
import json, sys
last = [[json.loads(l) for l in open(f) if l.startswith('{')][-1] for f in sys.argv[1:]]
a, b = ([r["peak_bytes"] for r in x["ranks"]] for x in last)
ws = [(r.pop("workspace"), s.pop("workspace")) for r, s in zip(a, b)]
if a != b: sys.exit(f"peak bytes differ: cpu {a} cuda-emu {b}")
# the CUDA backend's own buffers (planner/backend.h): cuBLASLt's 32 MiB, 1,024 doubles of partial sums, 65,536 floats of bias gradient
own = (32 << 20) + 1024 * 8 + 65536 * 4
if any(c != 0 or g != own for c, g in ws): sys.exit(f"workspace (cpu, cuda-emu) per rank: {ws}, not (0, {own})")
PY
    ); then fail "backend_cuda_emu_matches_cpu_$name" "$mo"; return; fi
    # the CUDA kernels sum in other orders than the CPU's: bit-identical weights would mean they did not run
    local st; st=$(cat "$T/${name}_cpu.ck/latest")
    if cmp -s "$T/${name}_cpu.ck/$st/llm.safetensors" "$T/${name}_cuda.ck/$st/llm.safetensors"; then
        fail "backend_cuda_emu_matches_cpu_$name" "the LLM's checkpoints are bit-identical: the CUDA kernels did not run"; return
    fi
    echo "# $name: $lo; weights $(echo "$wo" | head -1)"
    ok "backend_cuda_emu_matches_cpu_$name"
    check_memory "${name}_cuda" "backend_cuda_emu_memory_is_predicted_$name"
}

plan dp2 colocated "vision:dp=2;llm:dp=2,zero=0" --gpus 2
plan tp2 colocated "vision:sp=2,dp=1;llm:tp=2,dp=1,seqpar=0" --gpus 2
plan z3_dp2 colocated "vision:dp=2,zero=3;llm:dp=2,zero=3" --gpus 2
plan dis_1_tp2 disaggregated "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0" --n-micro 4
plan pp_dis disaggregated "vision:gpus=1;llm:gpus=2,pp=2,mb=1" --n-micro 4
plan cp_ulysses colocated "vision:sp=2;llm:sp=2" --gpus 2
for name in one dp2 tp2 z3_dp2 dis_1_tp2 pp_dis cp_ulysses; do
    [ -f "$T/$name.json" ] && check_backends "$name"
done

# (b) a checkpoint of one backend resumes on the other: half the steps on A, stop,
# resume on B for the rest == the uninterrupted run on B (losses of the
# resumed steps and final weights within 1e-5)
cross_resume() {   # cross_resume FROM TO PLAN
    local from=$1 to=$2 pl=$3 name="resume_${1}_to_${2}"
    local from_bin=$DHP to_bin=$DHP
    [ "$from" = cuda ] && from_bin=$DHP_EMU
    [ "$to" = cuda ] && to_bin=$DHP_EMU
    cp "$T/$pl.json" "$T/$name.json"
    if ! RUN_DHP="$from_bin" train "$name" --backend "$from" --stop-after $HALF; then
        fail "backend_checkpoint_${from}_resumes_on_${to}" "first half: $(tail -c 300 "$T/$name.err")"; return
    fi
    if ! RUN_DHP="$to_bin" train "$name" --backend "$to" --resume; then
        fail "backend_checkpoint_${from}_resumes_on_${to}" "resume: $(tail -c 300 "$T/$name.err")"; return
    fi
    local first lo wo
    first=$(grep -m1 '^{' "$T/$name.log" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
    losses "$T/$name.log" >"$T/$name.losses"
    losses "$T/${pl}_$to.log" | /usr/bin/python3 -c 'import sys; print(" ".join(sys.stdin.read().split()[int(sys.argv[1]):]))' $HALF >"$T/$name.want"
    if [ "$first" != $((HALF + 1)) ]; then fail "backend_checkpoint_${from}_resumes_on_${to}" "the resumed run's first step is $first, not $((HALF + 1))"
    elif ! lo=$(same_losses "$T/$name.want" "$T/$name.losses" 2>&1); then fail "backend_checkpoint_${from}_resumes_on_${to}" "$lo"
    elif ! wo=$($DIFF "$T/${pl}_$to.ck" "$T/$name.ck" --skip-key-bias --rtol 1e-5 2>&1); then
        fail "backend_checkpoint_${from}_resumes_on_${to}" "weights: $wo"
    else
        echo "# $name ($pl): $lo; weights $(echo "$wo" | head -1)"
        ok "backend_checkpoint_${from}_resumes_on_${to}"
    fi
}
# (d) stream order: every NCCL operation waits, through an event, for the compute stream's work before it
# (executor/comm_nccl.c); with the emulator's waits dropped (DHP_EMU_DROP_STREAM_WAITS, as if comm_nccl.c
# lacked them) the first operation on an NCCL stream (tp2: the vision's first all-to-all) aborts naming itself
# (tests/ncclemu.h emu_stream_ordered)
if [ -f "$T/tp2.json" ]; then
    out=$(timeout 120 mpirun --oversubscribe -np 2 -x DHP_EMU_DROP_STREAM_WAITS=1 "$DHP_EMU" run "$T/tp2.json" --data "$T/data" \
          --steps 1 --backend cuda 2>&1)
    if grep -qE '^ncclemu stream order: (nccl[A-Za-z]*|cudaMemcpyAsync) on an NCCL stream that did not wait for the compute stream' <<<"$out"; then
        ok backend_emu_catches_an_nccl_stream_not_waiting_for_compute
    else fail backend_emu_catches_an_nccl_stream_not_waiting_for_compute "no stream-order abort: $(tail -c 300 <<<"$out")"; fi
fi
if [ -d "$T/dp2_cpu.ck" ] && [ -d "$T/dp2_cuda.ck" ]; then
    cross_resume cuda cpu dp2
    cross_resume cpu cuda dp2
else fail backend_checkpoint_resumes_across_backends "the dp2 runs of both backends are missing"; fi
