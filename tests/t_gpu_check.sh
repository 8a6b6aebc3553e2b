#!/usr/bin/env bash
# bench/gpu_check.sh without a GPU: after the build it says so in one line
# and exits 0; and its whole logic (kernel checks + profile, equivalence
# against the CPU backend in fp32 and bf16-mixed, the bf16 loss curve,
# training in both precisions with predicted vs measured figures, the blocks'
# rate from two depths, the llm.c comparison against a stand-in printing
# llm.c's step lines) through the CPU emulator (DHP=build/dhp-emu) on a tiny
# configuration; its
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

# scripts/gpu_bundle.sh: the dhp under test and everything it and Open MPI's components load, but what
# the bundle says every machine with CUDA has (expects.txt); its dhp trains a step as an MPI singleton
# with the bundle's Open MPI alone
# (make test's run only: make test-asan's dhp is a sanitized build nobody bundles, and the script is the same)
if [ -n "${DHP_SANITIZED:-}" ]; then :
elif ! ldd "$DHP" | grep -q libcudart; then skip gpu_bundle "this dhp was built without CUDA (no nvcc)"
else
    DHP="$DHP" bash "$ROOT/scripts/gpu_bundle.sh" "$T/bundle" >"$T/bundle.out" 2>&1
    rc=$?
    B="$T/bundle"
    strays=$( (. "$B/env.sh" && { ldd "$B/bin/dhp"; for c in "$B"/ompi/lib/*.so; do ldd "$c"; done; }) 2>/dev/null \
              | awk '$2 == "=>" {print $1, $3}' | grep -vE "^[^ ]+ $B/lib/" | grep -vE "$(cat "$B/expects.txt" 2>/dev/null || echo .)" | sort -u)
    if [ "$rc" = 0 ] && [ -s "$B.tar.gz" ] && [ -x "$B/bin/dhp" ] && [ -z "$strays" ] \
       && [ "$(ls "$B/ompi/lib" | grep -c '^mca_')" -gt 20 ]; then ok gpu_bundle_holds_what_dhp_loads
    else fail gpu_bundle_holds_what_dhp_loads "exit $rc, from the system: ${strays:-none}; $(tail -c 300 "$T/bundle.out")"; fi
    if (cd "$T" && . "$B/env.sh" && D="$B/bin/dhp" && "$D" data synth --out bdata --samples 8 --window 0 >/dev/null \
          && "$D" plan --model tiny-vl --cluster cpu-4 --batch 2 --vision-tokens 64 --text-tokens 48 --precision fp32 \
                 --strategy "vision:dp=1;llm:dp=1" --gpus 1 --placement colocated --no-baselines -o bplan.json >/dev/null \
          && "$D" run bplan.json --data bdata --steps 1 --backend cpu) >"$T/bundle-run.out" 2>&1 \
       && grep -q '^step 1/1  loss' "$T/bundle-run.out"; then ok gpu_bundle_dhp_trains_as_a_singleton
    else fail gpu_bundle_dhp_trains_as_a_singleton "$(tail -c 300 "$T/bundle-run.out")"; fi
fi

if [ -z "${DHP_EMU:-}" ] || [ ! -x "$DHP_EMU" ]; then fail gpu_check_emulated "DHP_EMU (build/dhp-emu) not built"; exit 0; fi
# llm.c's train_gpt2cu stand-in for the comparison's plumbing: llm.c's step lines, 100 ms each
cat >"$T/llmc" <<'SH'
#!/usr/bin/env bash
n=3; while [ $# -gt 0 ]; do [ "$1" = -x ] && n=$2; shift; done
for i in $(seq 1 "$n"); do
    printf 'step %4d/%d | loss 10.900000 (+0.00z)| norm 1.0000 (+0.00z)| lr 0.00e+00 | 100.00 ms | 1.0%% bf16 MFU | 640 tok/s\n' "$i" "$n"
done
SH
chmod +x "$T/llmc"
# the loss curve's CPU runs in make test's run only (t_bf16.sh runs their kind under the sanitizers)
CURVE=2; [ -n "${DHP_SANITIZED:-}" ] && CURVE=0
GPU_CHECK_BUILD=0 DHP="$DHP_EMU" OUT="$T/emu" GPUS=1 PROFILE_ARGS=--quick EQ_MODELS=tiny-llava EQ_STEPS=2 CURVE_STEPS=$CURVE \
    MODEL=tiny-vl BATCH=2 IMAGE=32 PATCH=4 MERGE=2 TEXT=48 STEPS=2 WARMUP=1 \
    BLOCK_LAYERS="1 3" BLOCK_SEQ=64 BLOCK_STEPS=2 LLMC="$T/llmc" LLMC_DEPTH=6 LLMC_BATCH=1 LLMC_STEPS=2 LLMC_SEQ=64 \
    LLMC_VOCAB=512 GPU_NAME="NVIDIA H100 80GB HBM3" bash "$ROOT/bench/gpu_check.sh" >"$T/emu.out" 2>&1
rc=$?
L="$T/emu/gpu_check.log"
if [ "$rc" = 0 ] && [ -s "$L" ] && grep -q 'cuda kernels    match the CPU backend' "$L" \
   && grep -q '^  equivalence tiny-llava fp32: ok, losses' "$L" \
   && grep -q '^  equivalence tiny-llava bf16-mixed, cuda vs cpu: ok, .*(allowed 2.44e-04)' "$L" \
   && grep -q '^  equivalence tiny-llava bf16-mixed (cuda) vs fp32 (cpu): ok, .*and must exceed 1e-06)' "$L" \
   && { [ "$CURVE" = 0 ] || grep -q '^bf16-mixed (cuda backend): worst .*: within S' "$L"; } \
   && [ "$(grep -c '^  step time   predicted .* s, measured .* s' "$L")" = 2 ] \
   && grep -q "^  measured    .* TFLOP/s; MFU .* of H100-SXM-80GB's dense BF16 peak (989 TFLOP/s)" "$L" \
   && grep -q '^  tokens/s ' "$L" && grep -q "^  MFU .* of the plan's peak" "$L" \
   && grep -qE '^    params +[0-9.]+ +[0-9.]+' "$L" && grep -qE '^    activations +[0-9.]+ +[0-9.]+' "$L" \
   && grep -qE "^    3 blocks  step predicted" "$L" && grep -qE "^  one block   predicted [0-9.]+ ms, measured [0-9.]+ ms" "$L" \
   && grep -q '^  blocks      .* TFLOP/s; MFU' "$L" \
   && grep -q '^  llm.c       640 tokens/s (100.0 ms a step of 64 tokens)' "$L" \
   && grep -qE "^  dhp         [0-9]+ tokens/s .*x llm.c's" "$L" \
   && tail -n 1 "$L" | grep -q '^gpu_check: all passed'; then ok gpu_check_emulated_runs_every_step
else fail gpu_check_emulated_runs_every_step "exit $rc: $(tail -c 500 "$T/emu.out")"; fi
