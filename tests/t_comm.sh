#!/usr/bin/env bash
# The MPI communicator on 1..4 ranks: tests/mpi/comm_check.c under mpirun
# (built by make test as $COMM_CHECK). A hang counts as a failure.
. "$(dirname "$0")/lib.sh"
: "${COMM_CHECK:=$PWD/build/comm_check}"

if ! command -v mpirun >/dev/null 2>&1; then echo "skipped: mpirun not found"; exit 0; fi
if [ ! -x "$COMM_CHECK" ]; then fail comm_check "$COMM_CHECK not built (make test builds it)"; exit 0; fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
for n in 1 2 3 4; do
    timeout 120 mpirun --oversubscribe -np "$n" "$COMM_CHECK" >"$T/out" 2>&1
    rc=$?
    if [ "$rc" = 0 ] && grep -qx "comm_check ok $n" "$T/out"; then ok "comm_mpi_np$n"
    else fail "comm_mpi_np$n" "exit $rc: $(grep -m3 -E 'FAIL|ERROR|rror' "$T/out" | tr '\n' ' ' | head -c 400)"; fi
done
