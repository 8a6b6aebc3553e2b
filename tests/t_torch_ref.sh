#!/usr/bin/env bash
# Executor vs PyTorch: loss, every parameter gradient and 5 AdamW steps of
# tiny-vl, tiny-vl-window (loss mask) and tiny-vl tied (loss mask + explicit
# denominator), against tests/ref/torch_ref.py (float64 torch); the audio
# encoders of tiny-audio (learned positions) and tiny-omni (sinusoids)
# against tests/ref/torch_audio_ref.py.
. "$(dirname "$0")/lib.sh"
export OPENBLAS_NUM_THREADS=1
if ! /usr/bin/python3 -c 'import torch, numpy' >/dev/null 2>&1; then
    skip executor_torch_ref "/usr/bin/python3 has no torch"
    exit 0
fi
REF="$(cd "$(dirname "$0")" && pwd)/ref"
DHP_TORCH_REF_SCRIPT="$REF/torch_ref.py" TMPDIR="$T" \
    "$TEST_BIN" executor_torch_ref 2>&1 | grep -vE '^unit: '
DHP_TORCH_AUDIO_REF_SCRIPT="$REF/torch_audio_ref.py" TMPDIR="$T" \
    "$TEST_BIN" audio_torch_ref 2>&1 | grep -vE '^unit: '
