#!/usr/bin/env bash
# Smoke run of every fuzz target (tests/fuzz, built by `make fuzz-build` with
# ASan + UBSan): the regression inputs of past findings, then a few seconds
# of fuzzing from the seeds. `make fuzz` runs them for real.
. "$(dirname "$0")/lib.sh"
if [ -z "${FUZZ_BIN:-}" ] || ! ls "$FUZZ_BIN"/fuzz_* >/dev/null 2>&1; then
    fail fuzz_smoke "no fuzz binaries (FUZZ_BIN='${FUZZ_BIN:-}'; make fuzz-build)"; exit 0
fi
export ASAN_OPTIONS=""
# the seeds are kept beside the fuzz binaries: make test-asan reuses make test's (tests/fuzz/run.sh
# makes them again when what they come from changed)
FUZZ_SEEDS="$(dirname "$FUZZ_BIN")/smoke-seeds" bash "$(dirname "$0")/fuzz/run.sh" "${FUZZ_SMOKE_SECONDS:-3}" "$T/fuzz"
