#!/usr/bin/env bash
# Runs every fuzz target for SECONDS each on its corpus (WORK/corpus/<target>,
# kept between runs) plus the seeds (WORK/seeds, tests/fuzz/seeds.sh), after
# replaying the regression inputs of tests/fuzz/regress/<target>/ (each an
# input that once stopped a run: a crash fixed since, or a timeout that only
# a busy host caused). Prints "ok NAME" / "FAIL NAME: why" per target and
# appends "date target seconds executions result" to WORK/ledger.tsv.
# usage: tests/fuzz/run.sh SECONDS WORK      (needs $FUZZ_BIN and $DHP; optional FUZZ_ONLY,
#        FUZZ_NICE, FUZZ_TIMEOUT, FUZZ_JOBS, FUZZ_SEEDS)
set -u
cd "$(dirname "$0")/../.."
SECONDS_EACH=$1 WORK=$2
: "${FUZZ_BIN:?FUZZ_BIN: directory of the fuzz binaries}"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
mkdir -p "$WORK"
# The seeds (FUZZ_SEEDS, default WORK/seeds) are made again when a file they come from, or the
# code that writes them, is newer than they are; made aside and renamed, never half made.
SEEDS=${FUZZ_SEEDS:-$WORK/seeds}
if [ ! -e "$SEEDS/.made" ] || [ -n "${FUZZ_FRESH_SEEDS:-}" ] \
   || [ -n "$(find models costdb planner executor util cli tests/data/hf tests/fuzz/seeds.sh tests/*.sh tests/*.c bench/*.py \
              README.md -newer "$SEEDS/.made" -print -quit 2>/dev/null)" ]; then
    rm -rf "$SEEDS.new"
    if ! out=$(bash tests/fuzz/seeds.sh "$SEEDS.new" 2>&1); then
        echo "FAIL fuzz_seeds: $(echo "$out" | tail -c 300)"
        exit 0
    fi
    touch "$SEEDS.new/.made" && rm -rf "$SEEDS" && mv "$SEEDS.new" "$SEEDS"
fi
# fuzz_one BIN: replays the target's regression inputs, then fuzzes it; prints its one result line
fuzz_one() {
    local bin=$1 t art log regress rc execs result total
    t=$(basename "$bin")
    art="$WORK/artifacts/$t"
    mkdir -p "$WORK/corpus/$t" "$art"
    log="$WORK/$t.log"
    regress=(tests/fuzz/regress/"$t"/*)
    if [ -e "${regress[0]}" ] && ! "$bin" -timeout=20 -rss_limit_mb=2560 "${regress[@]}" >"$log" 2>&1; then
        echo "FAIL $t: a regression input crashes again: $(grep -m1 -E 'ERROR|runtime error|Test unit written' "$log")"
        return
    fi
    # -timeout: an input that runs this long is a finding (dhp must not hang on any input). It is
    # wall-clock time: a run at low priority on a busy host (FUZZ_NICE) needs a longer one.
    nice -n "${FUZZ_NICE:-0}" "$bin" -max_total_time="$SECONDS_EACH" -timeout="${FUZZ_TIMEOUT:-20}" -rss_limit_mb=2560 \
        -print_final_stats=1 -artifact_prefix="$art/" \
        "$WORK/corpus/$t" "$SEEDS/$t" >"$log" 2>&1
    rc=$?
    execs=$(grep -oE 'stat::number_of_executed_units: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
    execs=${execs:-0}
    result=ok
    [ $rc = 0 ] || result="finding:$(ls -t "$art" | head -1)"
    printf '%s\t%s\t%s\t%s\t%s\n' "$(date -u +%FT%TZ)" "$t" "$SECONDS_EACH" "$execs" "$result" >>"$WORK/ledger.tsv"
    if [ $rc = 0 ]; then
        total=$(awk -F'\t' -v t="$t" '$2 == t && $5 == "ok" { s += $4 } END { print s + 0 }' "$WORK/ledger.tsv")
        echo "ok $t: $execs executions in ${SECONDS_EACH} s without a finding ($total in all runs of $WORK)"
    else
        echo "FAIL $t: exit $rc, input saved in $art/: $(grep -m1 -E 'ERROR: |runtime error|deadly signal|timeout' "$log")"
    fi
}

# FUZZ_JOBS targets at a time (default: one per core), each result line printed in the targets' order
jobs=${FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
targets=()
for bin in "$FUZZ_BIN"/fuzz_*; do
    t=$(basename "$bin")
    # FUZZ_ONLY="fuzz_plan fuzz_cluster": run only these targets
    if [ -n "${FUZZ_ONLY:-}" ] && [[ " $FUZZ_ONLY " != *" $t "* ]]; then continue; fi
    targets+=("$bin")
done
for ((i = 0; i < ${#targets[@]}; i += jobs)); do
    for bin in "${targets[@]:i:jobs}"; do fuzz_one "$bin" >"$WORK/$(basename "$bin").result" & done
    wait
    for bin in "${targets[@]:i:jobs}"; do cat "$WORK/$(basename "$bin").result"; done
done
