#!/usr/bin/env bash
# bench/gpu_check.sh without a GPU: after the build it says so in one line
# and exits 0; and its whole logic (kernel checks + profile, equivalence
# against the CPU backend, training with predicted vs measured figures)
# through the CPU emulator (DHP=build/dhp-emu) on a tiny configuration; its
# equivalence model is tiny-llava, the one t_backend.sh does not run (its CLIP
# stem once handed host pixels and host cu_seqlens to the CUDA kernels).
. "$(dirname "$0")/lib.sh"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"

if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then skip gpu_check_without_gpu "a GPU is visible here"
else
    GPU_CHECK_BUILD=0 DHP="$DHP" OUT="$T/nogpu" bash "$ROOT/bench/gpu_check.sh" >"$T/nogpu.out" 2>&1
    rc=$?
    if [ "$rc" = 0 ] && [ "$(wc -l <"$T/nogpu.out")" = 1 ] && grep -q '^gpu_check: no usable GPU (.*): built only' "$T/nogpu.out" \
       && cmp -s "$T/nogpu.out" "$T/nogpu/gpu_check.log"; then ok gpu_check_without_gpu_says_so_in_one_line
    else fail gpu_check_without_gpu_says_so_in_one_line "exit $rc: $(head -c 300 "$T/nogpu.out")"; fi
fi

if [ -z "${DHP_EMU:-}" ] || [ ! -x "$DHP_EMU" ]; then fail gpu_check_emulated "DHP_EMU (build/dhp-emu) not built"; exit 0; fi
GPU_CHECK_BUILD=0 DHP="$DHP_EMU" OUT="$T/emu" GPUS=1 PROFILE_ARGS=--quick EQ_MODELS=tiny-llava EQ_STEPS=2 \
    MODEL=tiny-vl BATCH=2 IMAGE=32 PATCH=4 MERGE=2 TEXT=48 STEPS=3 WARMUP=1 \
    bash "$ROOT/bench/gpu_check.sh" >"$T/emu.out" 2>&1
rc=$?
L="$T/emu/gpu_check.log"
if [ "$rc" = 0 ] && [ -s "$L" ] && grep -q 'cuda kernels    match the CPU backend' "$L" \
   && grep -q '^  equivalence tiny-llava-1gpu: ok, losses cpu' "$L" && grep -q '^  step time   predicted .* s, measured .* s' "$L" \
   && grep -q '^  tokens/s ' "$L" && grep -q '^  MFU .* of the profiled fp32 peak' "$L" \
   && grep -qE '^    params +[0-9.]+ +[0-9.]+' "$L" && grep -qE '^    activations +[0-9.]+ +[0-9.]+' "$L" \
   && tail -n 1 "$L" | grep -q '^gpu_check: all passed'; then ok gpu_check_emulated_runs_every_step
else fail gpu_check_emulated_runs_every_step "exit $rc: $(tail -c 500 "$T/emu.out")"; fi
