#!/usr/bin/env bash
# Bad input on the GPU path (issue 21), through the emulator build
# (build/dhp-emu: the CUDA backend against tests/cudaemu.h, NCCL against
# tests/ncclemu.h) and its fault knobs: no device (DHP_EMU_GPUS=0), no driver
# and a driver older than the runtime (DHP_EMU_CUDA_DRIVER), a device too
# small for the plan (DHP_EMU_DEVICE_BYTES), an NCCL operation that fails
# asynchronously or hangs on one rank (DHP_EMU_NCCL_FAULT=RANK:OP:error|stall), or hangs in the
# communicators' set-up (RANK:init:stall).
# Each ends every rank in bounded time with one line naming what went wrong,
# and leaves only complete checkpoints behind.
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip gpu_faults "mpirun not found"; exit 0; fi
if [ -z "${DHP_EMU:-}" ] || [ ! -x "$DHP_EMU" ]; then fail gpu_faults "DHP_EMU (build/dhp-emu) not built: make build/dhp-emu"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
cd "$T"
SETUP="--model tiny-vl --cluster cpu-4 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32"
"$DHP" data synth --out data --samples 64 --window 0 >/dev/null || { fail gpu_faults_data "dhp data synth failed"; exit 0; }
"$DHP" plan $SETUP --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o one.json >/dev/null 2>&1 &&
"$DHP" plan $SETUP --placement disaggregated --n-micro 2 --strategy 'vision:gpus=1;llm:gpus=1' -o dis.json >/dev/null 2>&1 ||
    { fail gpu_faults_plans "dhp plan failed"; exit 0; }

# one_line NAME PATTERN FILE: FILE's only "dhp run:" line matches PATTERN (ERE)
one_line() {
    local n; n=$(grep -c '^dhp run: ' "$3")
    if [ "$n" = 1 ] && grep -qE "^dhp run: $2" "$3"; then ok "$1"
    else fail "$1" "$n 'dhp run:' lines: $(grep '^dhp run: ' "$3" | head -c 600)"; fi
}

# --- no device, no driver, a driver older than the runtime: exit 2, one line; auto falls back to cpu saying why ---
emu1() { env "$@" "$DHP_EMU" run one.json --data data --steps 1 --backend cuda >out 2>err; }
emu1 DHP_EMU_GPUS=0; rc=$?
if [ $rc = 2 ]; then one_line gpu_faults_no_device_exits_2_in_one_line \
    '--backend cuda: no CUDA device: no CUDA-capable device is detected$' err
else fail gpu_faults_no_device_exits_2_in_one_line "exit $rc: $(head -c 300 err)"; fi
emu1 DHP_EMU_CUDA_DRIVER=0; rc=$?
if [ $rc = 2 ]; then one_line gpu_faults_no_driver_exits_2_in_one_line \
    '--backend cuda: no CUDA device: no NVIDIA driver is installed \(libcuda.so.1 not found; this dhp.s CUDA runtime is 12.8\)$' err
else fail gpu_faults_no_driver_exits_2_in_one_line "exit $rc: $(head -c 300 err)"; fi
emu1 DHP_EMU_CUDA_DRIVER=12020; rc=$?
if [ $rc = 2 ]; then one_line gpu_faults_old_driver_exits_2_naming_both_versions \
    '--backend cuda: the NVIDIA driver supports CUDA 12.2, older than this dhp.s CUDA runtime 12.8: update the driver' err
else fail gpu_faults_old_driver_exits_2_naming_both_versions "exit $rc: $(head -c 300 err)"; fi
DHP_EMU_CUDA_DRIVER=12020 "$DHP_EMU" run one.json --data data --steps 1 >out 2>err; rc=$?
if [ $rc = 0 ] && [ "$(grep -c '^backend: ' out)" = 1 ] && grep -q '^backend: cpu (the NVIDIA driver supports CUDA 12.2, older' out
then ok gpu_faults_old_driver_auto_runs_on_cpu_saying_why
else fail gpu_faults_old_driver_auto_runs_on_cpu_saying_why "exit $rc: $(head -c 300 out) $(head -c 300 err)"; fi

# --- out of device memory: the device, bytes asked and free, the category, the plan's prediction ---
# Device sizes from an uncapped run's peaks by category (the emulated device's allocations):
# 1 MiB, below the LLM's parameters (set-up fails); the set-up's tensors and half the workspace (its
# allocation fails); the set-up's tensors, the cuBLASLt workspace
# (the first GEMM's, after the forward's first activations) + half the activations (step 1 fails); every peak + 64 KiB (training fits, staging a module's state for
# the checkpoint does not)
"$DHP_EMU" run one.json --data data --steps 1 --backend cuda --log-json >peaks.log 2>&1 || { fail gpu_faults_oom "uncapped run: $(tail -c 300 peaks.log)"; exit 0; }
read -r WS_CAP STEP_CAP CKPT_CAP < <(/usr/bin/python3 -c 'import json,sys
p = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]["ranks"][0]["peak_bytes"]
tensors = p["params"] + p["grads"] + p["optim"] + p["comm"]
setup = tensors + p["workspace"]
print(int(tensors + p["workspace"] / 2), int(setup + p["activations"] / 2), int(sum(p.values()) + 65536))' peaks.log)
OOM_RE='out of device memory on GPU 0 \(cuda-emu 0 \(the CPU\)\): [0-9]+ bytes \([0-9.]+ [KM]iB\) asked for'
PRED_RE="free of [0-9.]+ MiB; the plan predicts rank 0's peak at [0-9.]+ MiB of the [0-9.]+ GiB per GPU it assumed \(dhp memory one.json\)$"
DHP_EMU_DEVICE_BYTES=1M "$DHP_EMU" run one.json --data data --steps 1 --backend cuda --ckpt ck1 >out 2>err; rc=$?
if [ $rc != 0 ] && [ ! -e ck1/latest ]; then
    one_line gpu_faults_oom_at_setup_names_device_bytes_category "cuda: cudaMalloc: $OOM_RE parameters, [0-9]+ bytes \([0-9.]+ KiB\) $PRED_RE" err
else fail gpu_faults_oom_at_setup_names_device_bytes_category "exit $rc, ck1: $(ls ck1 2>&1): $(head -c 300 err)"; fi
DHP_EMU_DEVICE_BYTES=$STEP_CAP "$DHP_EMU" run one.json --data data --steps 1 --backend cuda >out 2>err; rc=$?
if [ $rc != 0 ]; then
    one_line gpu_faults_oom_in_a_step_names_activations "step 1: cuda: cudaMalloc: $OOM_RE activations, .*$PRED_RE" err
else fail gpu_faults_oom_in_a_step_names_activations "exit $rc: $(head -c 300 err)"; fi
# the set-up's tensors + half the backend's workspace: its allocation, inside the first GEMM's call, fails
# and reaches the run at the step's sync, with the same prediction
DHP_EMU_DEVICE_BYTES=$WS_CAP "$DHP_EMU" run one.json --data data --steps 1 --backend cuda >out 2>err; rc=$?
if [ $rc != 0 ]; then
    one_line gpu_faults_oom_of_the_workspace_names_it_with_the_prediction "step 1: cuda: cudaMalloc: $OOM_RE workspace, .*$PRED_RE" err
else fail gpu_faults_oom_of_the_workspace_names_it_with_the_prediction "exit $rc: $(head -c 300 err)"; fi
rm -rf ck3
DHP_EMU_DEVICE_BYTES=$CKPT_CAP "$DHP_EMU" run one.json --data data --steps 2 --backend cuda --ckpt ck3 --ckpt-every 1 >out 2>err; rc=$?
if [ $rc != 0 ] && grep -q '^step 1/2 ' out && [ ! -e ck3/latest ] && [ -z "$(find ck3 -type f)" ]; then
    one_line gpu_faults_oom_at_a_checkpoint_leaves_no_checkpoint "checkpoint: cuda: cudaMalloc: $OOM_RE other, .*$PRED_RE" err
else fail gpu_faults_oom_at_a_checkpoint_leaves_no_checkpoint "exit $rc, ck3: $(find ck3 -type f): $(head -c 300 out) $(head -c 300 err)"; fi
# two ranks, only rank 0's device too small, after 2 steps with checkpoints: both end, the checkpoints are whole
t0=$(date +%s)
timeout 120 mpirun --oversubscribe -np 1 -x DHP_EMU_DEVICE_BYTES=35M "$DHP_EMU" run dis.json --data data --steps 2 --backend cuda \
    --ckpt ck2 --comm-timeout 20 : -np 1 "$DHP_EMU" run dis.json --data data --steps 2 --backend cuda --ckpt ck2 \
    --comm-timeout 20 >out 2>err; rc=$?
took=$(( $(date +%s) - t0 ))
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 60 ] && [ ! -e ck2/latest ] \
   && grep -qE "^dhp run: step 1: cuda: cudaMalloc: $OOM_RE activations" err \
   && grep -q '^dhp run: step 1: run: the step failed on 1 other rank(s) (their message is above)' err
then ok gpu_faults_oom_on_one_rank_ends_every_rank
else fail gpu_faults_oom_on_one_rank_ends_every_rank "exit $rc in ${took}s: $(grep -v '^[- ]' err | head -c 400)"; fi

# --- NCCL: an asynchronous error or a hang on one rank, mid-run with checkpoints every step ---
# nccl_fault NAME SPEC TIMEOUT: a 2-rank run with DHP_EMU_NCCL_FAULT=SPEC; sets rc, took, NAME.err
nccl_fault() {
    local t0; t0=$(date +%s)
    timeout 120 mpirun --oversubscribe -np 2 -x DHP_EMU_NCCL_FAULT="$2" "$DHP_EMU" run dis.json --data data --steps 3 \
        --backend cuda --comm-timeout "$3" --ckpt "$1.ck" --ckpt-every 1 --log-json >"$1.log" 2>"$1.err"
    rc=$?; took=$(( $(date +%s) - t0 ))
}
# whole_ckpt DIR: latest names a step whose module files are all there, and no temporary file is left
whole_ckpt() {
    local st; st=$(cat "$1/latest" 2>/dev/null) || return 1
    [ -s "$1/$st/vision.safetensors" ] && [ -s "$1/$st/llm.safetensors" ] && [ -z "$(find "$1" -name '*.tmp.*')" ]
}
nccl_fault err 1:12:error 20
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 60 ] && whole_ckpt err.ck; then
    one_line gpu_faults_nccl_async_error_aborts_naming_rank_and_op \
        'step [0-9]+: .*(nccl|MPI_)[A-Za-z]+\([^)]*\): rank 1: NCCL asynchronous error on (this|another) group.s communicator \(its rank [01] of 2\): unhandled system error; communicator aborted; every other rank of the group answers$' err.err
else fail gpu_faults_nccl_async_error_aborts_naming_rank_and_op "exit $rc in ${took}s, ckpt $(cat err.ck/latest 2>&1): $(grep -v '^[- ]' err.err | head -c 400)"; fi
# (rank 1 may pass the operation rank 0 stalls in (its own send complete) and time out in a later one: on a busy host a host one)
nccl_fault hang 0:12:stall 2
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 60 ] && whole_ckpt hang.ck; then
    one_line gpu_faults_nccl_hang_times_out_naming_the_peer \
        'step [0-9]+: .*(nccl|MPI_)[A-Za-z]+\([^)]*\): rank [01] waited [0-9]+ s \(the communication timeout\): rank [01] answers but did not complete it' hang.err
else fail gpu_faults_nccl_hang_times_out_naming_the_peer "exit $rc in ${took}s, ckpt $(cat hang.ck/latest 2>&1): $(grep -v '^[- ]' hang.err | head -c 400)"; fi
# a peer that hangs (or died) while the communicators are set up: NCCL's non-blocking init
# (ncclCommInitRankConfig, blocking = 0) polled with the timeout, then ncclCommAbort: one line, no hang
# (both ranks wait in it here, the stalled one too: each that times out says so in one line)
nccl_fault init 1:init:stall 1
n=$(grep -c '^dhp run: ' init.err)
if [ $rc != 0 ] && [ $rc != 124 ] && [ $took -le 60 ] && [ "$n" -ge 1 ] && [ "$n" -le 2 ] \
   && [ "$(grep -cE '^dhp run: comm: ncclCommInitRankConfig: rank [01] waited [0-9]+ s \(the communication timeout\): rank [01] answers but did not complete it' init.err)" = "$n" ]
then ok gpu_faults_nccl_init_hang_times_out
else fail gpu_faults_nccl_init_hang_times_out "exit $rc in ${took}s: $(grep -v '^[- ]' init.err | head -c 400)"; fi
