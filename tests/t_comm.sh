#!/usr/bin/env bash
# The communicator on 1..4 ranks: tests/mpi/comm_check.c under mpirun, on MPI
# ($COMM_CHECK) and on NCCL emulated over MPI ($COMM_CHECK_EMU --comm nccl:
# executor/comm_nccl.c against tests/ncclemu.h), the same assertions; both
# built by make test. A hang counts as a failure.
. "$(dirname "$0")/lib.sh"
: "${COMM_CHECK:=$PWD/build/comm_check}" "${COMM_CHECK_EMU:=$PWD/build/comm_check_emu}"

if ! command -v mpirun >/dev/null 2>&1; then echo "skipped: mpirun not found"; exit 0; fi
if [ ! -x "$COMM_CHECK" ]; then fail comm_check "$COMM_CHECK not built (make test builds it)"; exit 0; fi
if [ ! -x "$COMM_CHECK_EMU" ]; then fail comm_check_emu "$COMM_CHECK_EMU not built (make test builds it)"; exit 0; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
for kind in mpi nccl; do
    bin=$COMM_CHECK; [ $kind = nccl ] && bin=$COMM_CHECK_EMU
    for n in 1 2 3 4; do
        timeout 120 mpirun --oversubscribe -np "$n" "$bin" --comm $kind >"$T/out" 2>&1
        rc=$?
        # NCCL beside the emulated CUDA backend: device buffers through NCCL, host ones through MPI
        want="comm_check ok $n $kind"; [ $kind = nccl ] && want="$want (device and host buffers routed)"
        if [ "$rc" = 0 ] && grep -qxF "$want" "$T/out"; then ok "comm_${kind}_np$n"
        else fail "comm_${kind}_np$n" "exit $rc: $(grep -m3 -E 'FAIL|ERROR|rror' "$T/out" | tr '\n' ' ' | head -c 400)"; fi
    done
done
