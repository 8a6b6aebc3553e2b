#!/usr/bin/env bash
# dhp run --comm nccl without a GPU: $DHP_EMU is dhp with executor/comm_nccl.c
# built against tests/ncclemu.h (NCCL emulated over MPI, device memory = host
# memory, so the CPU backend's buffers are NCCL's). Equivalence plans — DP 2,
# TP 2, ZeRO-3, a pipeline, Ulysses context parallelism, a disaggregated plan,
# ring attention — must give the MPI run's losses and final weights
# within 1e-5; --comm's choice and its errors; a stopped rank under NCCL
# ends the job naming it (the async-error poll and ncclCommAbort path).
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip comm_nccl "mpirun not found"; exit 0; fi
if ! /usr/bin/python3 -c 'import numpy' >/dev/null 2>&1; then skip comm_nccl "/usr/bin/python3 has no numpy"; exit 0; fi
: "${DHP_EMU:=$PWD/build/dhp-emu}"
if [ ! -x "$DHP_EMU" ]; then fail comm_nccl "$DHP_EMU not built (make test builds it)"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
HERE=$(cd "$(dirname "$0")" && pwd)
DIFF="/usr/bin/python3 $HERE/tools/ckpt_diff.py"
STEPS=10
[ -n "${DHP_SANITIZED:-}" ] && STEPS=4   # make test-asan: the same plans, fewer steps (its time budget)
SETUP="--model tiny-vl --cluster 8xh100 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32"

"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null || { fail comm_nccl_data "dhp data synth failed"; exit 0; }

plan() {   # plan NAME PLACEMENT STRATEGY [dhp plan options]
    local name=$1 pl=$2 spec=$3; shift 3
    "$DHP" plan $SETUP --placement "$pl" --strategy "$spec" "$@" -o "$T/$name.json" >"$T/$name.plan.out" 2>&1 \
        || { fail "comm_nccl_plan_$name" "$(head -c 300 "$T/$name.plan.out")"; return 1; }
}
world() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['world_size'])" "$1"; }
train() {   # train NAME TAG BINARY [dhp run options]
    local name=$1 tag=$2 bin=$3; shift 3
    timeout 300 mpirun --oversubscribe -np "$(world "$T/$name.json")" "$bin" run "$T/$name.json" --data "$T/data" \
        --steps $STEPS --ckpt "$T/$name.$tag.ck" --log-json --comm-timeout 60 "$@" >"$T/$name.$tag.log" 2>"$T/$name.$tag.err"
}

compare() {   # compare NAME [--backend cuda]: the NCCL run's backend (default cpu)
    local name=$1 be=${3:-cpu} lo wo skip=
    # the CUDA backend's kernels sum in another order: attention key biases, whose true gradient is
    # zero, then hold AdamW steps on rounding noise (tests/tools/ckpt_diff.py --skip-key-bias, as t_backend)
    [ "$be" = cuda ] && skip=--skip-key-bias
    if ! train "$name" mpi "$DHP" --comm mpi; then fail "comm_nccl_equivalence_$name" "MPI run: $(tail -c 300 "$T/$name.mpi.err")"; return; fi
    if ! train "$name" nccl "$DHP_EMU" --comm nccl --backend "$be"; then fail "comm_nccl_equivalence_$name" "NCCL run: $(tail -c 300 "$T/$name.nccl.err")"; return; fi
    losses "$T/$name.mpi.log" >"$T/$name.mpi.losses"
    losses "$T/$name.nccl.log" >"$T/$name.nccl.losses"
    if ! lo=$(same_losses "$T/$name.mpi.losses" "$T/$name.nccl.losses" 2>&1); then fail "comm_nccl_equivalence_$name" "$lo"; return; fi
    if ! wo=$($DIFF "$T/$name.mpi.ck" "$T/$name.nccl.ck" $skip --rtol 1e-5 2>&1); then fail "comm_nccl_equivalence_$name" "weights: $wo"; return; fi
    echo "# $name: $lo; weights $(echo "$wo" | head -1)"
    ok "comm_nccl_equivalence_$name"
}

plan dp2 colocated "vision:dp=2;llm:dp=2,zero=0" --gpus 2 && compare dp2
plan tp2 colocated "vision:dp=2;llm:tp=2,seqpar=1" --gpus 2 && compare tp2
plan z3_dp2 colocated "vision:dp=2,zero=3;llm:dp=2,zero=3" --gpus 2 && compare z3_dp2
plan pp_dis disaggregated "vision:gpus=1;llm:gpus=2,pp=2,mb=1" --n-micro 4 && compare pp_dis
plan cp_ulysses colocated "vision:sp=2;llm:sp=2" --gpus 2 && compare cp_ulysses
plan dis_1_tp2 disaggregated "vision:gpus=1;llm:gpus=2,tp=2,seqpar=0" --n-micro 4 && compare dis_1_tp2
# ring attention: both directions' sends and receives of each block, grouped
plan cp_ring_tp2 colocated "vision:dp=4;llm:sp=2,tp=2,seqpar=1" --gpus 4 && compare cp_ring_tp2

# --comm: the choice in one log line; bad values and NCCL where it cannot run, one error line
if [ -f "$T/dp2.json" ]; then
    timeout 120 mpirun --oversubscribe -np 2 "$DHP_EMU" run "$T/dp2.json" --data "$T/data" --steps 1 --comm nccl >"$T/line.out" 2>&1
    rc=$?
    if grep -qE '^comm: nccl [0-9.]+ \(--comm; one NCCL communicator per rank group\)$' "$T/line.out"; then ok comm_nccl_log_line
    else fail comm_nccl_log_line "$(head -c 300 "$T/line.out")"; fi
    # shutdown: every communicator finalized, its operations done, before it is destroyed (the emulator
    # aborts a destroy out of that order); with the finalize dropped (DHP_EMU_DROP_FINALIZE) it is caught
    timeout 120 mpirun --oversubscribe -np 2 -x DHP_EMU_DROP_FINALIZE=1 "$DHP_EMU" run "$T/dp2.json" --data "$T/data" \
        --steps 1 --comm nccl >"$T/nofin.out" 2>&1
    if [ "$rc" = 0 ] && ! grep -q 'ncclemu shutdown' "$T/line.out" \
       && grep -qE '^ncclemu shutdown: ncclCommDestroy of a communicator \(rank [0-9]+ of [0-9]+\) never finalized' "$T/nofin.out"; then
        ok comm_nccl_finalizes_before_destroy
    else fail comm_nccl_finalizes_before_destroy "exit $rc: $(grep -m2 -v '^[- ]' "$T/line.out" "$T/nofin.out" | head -c 300)"; fi
    timeout 120 mpirun --oversubscribe -np 2 "$DHP" run "$T/dp2.json" --data "$T/data" --steps 1 >"$T/line.out" 2>&1
    if grep -qx 'comm: mpi (default with the CPU backend)' "$T/line.out"; then ok comm_default_is_mpi_on_the_cpu_backend
    else fail comm_default_is_mpi_on_the_cpu_backend "$(head -c 300 "$T/line.out")"; fi
    # one process per GPU: a node of 1 (emulated) GPU refuses a second process
    DHP_EMU_GPUS=1 timeout 120 mpirun --oversubscribe -np 2 -x DHP_EMU_GPUS "$DHP_EMU" run "$T/dp2.json" --data "$T/data" \
        --steps 1 --comm nccl >"$T/gpus.out" 2>&1
    if grep -q 'rank 1 is rank 1 on its node, which has 1 GPU: run one process per GPU' "$T/gpus.out"; then
        ok comm_nccl_one_process_per_gpu
    else fail comm_nccl_one_process_per_gpu "$(grep -m2 -v '^[- ]' "$T/gpus.out" | head -c 300)"; fi
    # device memory over MPI: dhp-emu's CUDA backend takes a GPU's paths, so 2 ranks need NCCL
    timeout 120 mpirun --oversubscribe -np 2 "$DHP_EMU" run "$T/dp2.json" --data "$T/data" --steps 1 --backend cuda \
        --comm mpi >"$T/mpi.out" 2>"$T/mpi.err"
    rc=$?
    if [ "$rc" != 0 ] && [ "$(grep -c '^dhp run: ' "$T/mpi.err")" = 1 ] \
       && grep -q '^dhp run: --backend cuda: 2 ranks over MPI would hand it device memory; use --comm nccl' "$T/mpi.err"; then
        ok comm_cuda_backend_over_mpi_refused_in_one_line
    else fail comm_cuda_backend_over_mpi_refused_in_one_line "exit $rc: $(head -c 300 "$T/mpi.err")"; fi
    expect_err comm_bad_value "--comm: 'tcp' is not mpi or nccl" "$DHP" run "$T/dp2.json" --data "$T/data" --comm tcp
    # a real build: NCCL absent, or present and needing the CUDA backend's device memory
    expect_err comm_nccl_needs_device_memory "--comm nccl(: this dhp was built without NCCL| moves device memory)" \
        "$DHP" run "$T/dp2.json" --data "$T/data" --comm nccl
fi

# Interleaved pipeline stages (vp 2: an LLM of 4 layers on 2 stages): the stages' sends go both ways round
# the ring; each edge and direction is a communicator of its own (executor/run_stage.c), so they run over
# NCCL as over MPI (on one shared communicator they deadlocked until the timeout); on dhp-emu's CUDA
# backend (device buffers, NCCL's device path) and in fp32 within 1e-5 of the MPI run
/usr/bin/python3 - "$HERE/../models/zoo/tiny-vl.json" "$T/deep4.model.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for mod in m["modules"]:
    if mod["kind"] == "llm": mod["layers"] = 4
json.dump(m, open(sys.argv[2], "w"))
PY
if SETUP="$SETUP --model $T/deep4.model.json" plan vp2 disaggregated "vision:gpus=1;llm:gpus=2,pp=2,vp=2,mb=1" --n-micro 4; then
    compare vp2 --backend cuda
fi

# A rank stopped (SIGSTOP) mid-run under NCCL: the other ends in bounded time naming it
if plan stop disaggregated "vision:gpus=1;llm:gpus=1" --n-micro 2; then
    : >"$T/stop.log"
    mpirun --oversubscribe -np 2 "$DHP_EMU" run "$T/stop.json" --data "$T/data" --steps 100000 --comm nccl --comm-timeout 5 \
        --log-json >"$T/stop.log" 2>"$T/stop.err" &
    mp=$!
    ( sleep 240; kill -KILL $mp ) >/dev/null 2>&1 & guard=$!
    i=0; while [ "$(grep -c '^{' "$T/stop.log")" -lt 3 ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done
    victim=""
    for p in $(pgrep -P $mp); do grep -qz '^OMPI_COMM_WORLD_RANK=1$' "/proc/$p/environ" && victim=$p; done
    t0=$(date +%s)
    [ -n "$victim" ] && kill -STOP "$victim"
    wait $mp
    took=$(( $(date +%s) - t0 ))
    [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null
    kill $guard 2>/dev/null; wait $guard 2>/dev/null
    # the wait that times out is an NCCL operation or one of the host-data ones on MPI, as it falls
    if [ -n "$victim" ] && [ $took -le 60 ] && grep -qE 'waited [0-9]+ s \(the communication timeout\): no answer from rank 1' "$T/stop.err"
    then echo "# $(grep -m1 -o 'failed: .*rank 1' "$T/stop.err")"; ok comm_nccl_stopped_rank_times_out_naming_it
    else fail comm_nccl_stopped_rank_times_out_naming_it "took ${took}s: $(grep -m2 'dhp run' "$T/stop.err" | head -c 400)"; fi
fi
