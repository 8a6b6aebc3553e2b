#!/usr/bin/env bash
# Faults injected into running `dhp run` jobs (issue: hardened against bad
# input and faults): a rank killed or stopped, the whole job killed at random
# points of its checkpoint writes, a full disk, corrupted checkpoint and data
# files, preemption signals. Each must end in bounded time with a line that
# names what went wrong, and never cost more than the steps since the last
# checkpoint: a resumed run ends bit-identical to an uninterrupted one.
. "$(dirname "$0")/lib.sh"
if ! command -v mpirun >/dev/null 2>&1; then skip faults "mpirun not found"; exit 0; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
cd "$T"
SETUP="--model tiny-vl --cluster cpu-4 --batch 8 --vision-tokens 64 --text-tokens 48 --precision fp32"
"$DHP" data synth --out data --samples 64 --window 0 >/dev/null || { fail faults_data "dhp data synth failed"; exit 0; }
"$DHP" plan $SETUP --placement disaggregated --n-micro 2 --strategy 'vision:gpus=1;llm:gpus=1' -o dis.json >/dev/null 2>&1 &&
"$DHP" plan $SETUP --gpus 1 --strategy 'vision:dp=1;llm:dp=1' -o one.json >/dev/null 2>&1 ||
    { fail faults_plans "dhp plan failed"; exit 0; }
injected=0 survived=0
survive() { ok "$1"; survived=$((survived + 1)); }

run2() { timeout 300 mpirun --oversubscribe -np 2 "$DHP" run dis.json --data data "$@"; }
# A job started in the background (`mpirun ... & BG=$!`) is killed if it
# outlives 300 s; its guard has no stdio, so it cannot hold the test's pipe.
guard() { ( sleep 300; kill -KILL "$1" ) >/dev/null 2>&1 & GUARD=$!; }
unguard() { pkill -P "$GUARD" 2>/dev/null; kill "$GUARD" 2>/dev/null; wait "$GUARD" 2>/dev/null; }
# same_ckpt A B STEP: the step's module files are byte for byte the same
same_ckpt() { for m in vision llm; do cmp -s "$1/step-$3/$m.safetensors" "$2/step-$3/$m.safetensors" || return 1; done; }
# the rank processes of the mpirun with pid $1; rank_pid MPIRUN R: the one that is rank R
ranks_of() { pgrep -P "$1" | sort -n; }
rank_pid() { for p in $(ranks_of "$1"); do grep -qz "^OMPI_COMM_WORLD_RANK=$2\$" "/proc/$p/environ" && echo "$p"; done; }
# wait_steps LOG N: until LOG has N step lines (--log-json), at most 120 s
wait_steps() { local i=0; while [ "$(grep -c '^{' "$1" 2>/dev/null)" -lt "$2" ] && [ $i -lt 1200 ]; do sleep 0.1; i=$((i + 1)); done; }
elapsed() { echo $(( $(date +%s) - $1 )); }

# The uninterrupted reference: 12 steps, a checkpoint every 2.
STEPS=12
run2 --steps $STEPS --ckpt ref --ckpt-every 2 --log-json >ref.log 2>ref.err || { fail faults_reference "$(tail -c 300 ref.err)"; exit 0; }
last=$(printf '%08d' $STEPS)

# --- preemption: SIGTERM to every rank (Slurm's way), SIGUSR1 to mpirun (forwarded), SIGINT to one process ---
# 60 steps (a few ms each): long enough to be signalled mid-run after step 2
LONG=60
run2 --steps $LONG --ckpt ref60 >/dev/null 2>ref60.err || { fail faults_reference_60 "$(tail -c 300 ref60.err)"; exit 0; }
for sig in TERM USR1; do
    injected=$((injected + 1))
    rm -rf pre; : >pre.log
    mpirun --oversubscribe -np 2 "$DHP" run dis.json --data data --steps $LONG --ckpt pre --log-json >pre.log 2>pre.err &
    mp=$!; guard $mp
    wait_steps pre.log 2
    if [ $sig = TERM ]; then kill -TERM $(ranks_of $mp) 2>/dev/null; else kill -USR1 $mp; fi
    wait $mp; rc=$?; unguard
    k=$(sed -n 's/.*stopped after step \([0-9]*\) of.*/\1/p' pre.err | head -1)
    if [ $rc != 0 ] || [ -z "$k" ]; then fail "faults_sig$sig" "exit $rc: $(tail -c 300 pre.err)"; continue; fi
    if [ "$(cat pre/latest)" != "step-$(printf '%08d' "$k")" ]; then fail "faults_sig$sig" "latest $(cat pre/latest), stopped at $k"; continue; fi
    if ! run2 --steps $LONG --ckpt pre --resume >/dev/null 2>pre2.err; then fail "faults_sig$sig" "resume: $(tail -c 300 pre2.err)"
    elif same_ckpt ref60 pre "$(printf '%08d' $LONG)"; then survive "faults_sig${sig}_stops_after_step_${k}_checkpoints_exits_0_resumes_bit_identical"
    else fail "faults_sig$sig" "the resumed run's step $STEPS differs from the uninterrupted run's"; fi
done
injected=$((injected + 1))
rm -rf one1; : >one1.log
"$DHP" run one.json --data data --steps $LONG --ckpt one1 --log-json >one1.log 2>one1.err &
pid=$!; guard $pid
wait_steps one1.log 1
kill -INT $pid; wait $pid; rc=$?; unguard
if [ $rc = 0 ] && grep -q 'SIGINT: stopped after step' one1.err && [ -s one1/latest ]; then survive faults_sigint_single_process_exits_0_with_checkpoint
else fail faults_sigint_single_process_exits_0_with_checkpoint "exit $rc: $(tail -c 300 one1.err)"; fi

# --- a rank killed (SIGKILL) or stopped (SIGSTOP) mid-step: the others end in bounded time, naming it ---
# lose_rank1 SIG TIMEOUT NAME: a 2-rank job whose rank 1 gets SIG after step 3; NAME.err, $took seconds
lose_rank1() {
    local sig=$1 timeout=$2 name=$3 mp victim t0
    : >"$name.log"
    mpirun --oversubscribe -np 2 "$DHP" run dis.json --data data --steps 100000 --comm-timeout "$timeout" --log-json \
        >"$name.log" 2>"$name.err" &
    mp=$!; guard $mp
    wait_steps "$name.log" 3
    victim=$(rank_pid $mp 1)
    t0=$(date +%s)
    kill "-$sig" "$victim"
    wait $mp; unguard
    took=$(elapsed $t0)
    kill -KILL "$victim" 2>/dev/null   # a stopped rank the launcher left behind
    injected=$((injected + 1))
}
lose_rank1 KILL 10 kill
if [ "$took" -le 30 ] && grep -q 'rank 1' kill.err; then survive "faults_sigkill_of_rank_1_ends_the_job_naming_it"
else fail faults_sigkill_of_rank_1 "took ${took}s: $(tail -c 300 kill.err)"; fi
lose_rank1 STOP 5 stop
if [ "$took" -le 30 ] && grep -q 'waited [0-9]* s (the communication timeout): no answer from rank 1' stop.err; then
    survive "faults_sigstop_of_rank_1_times_out_naming_it"
else fail faults_sigstop_of_rank_1 "took ${took}s: $(tail -c 400 stop.err)"; fi

# --- the whole job killed at random points of its checkpoint writes, 20 times (8 sanitized) ---
# DHP_FAULT_KILL_AFTER=N: a rank kills itself (SIGKILL) when its N-th byte
# written to a file is due (util/files.c); mpirun then ends the other rank.
# Under the sanitizers (make test-asan) 8: the same writer and resume
# code, each kill point random (CI's time budget: 20 trials took 60 s there).
TRIALS=20
[ -n "${DHP_SANITIZED:-}" ] && TRIALS=8
bytes=$(( $(stat -c %s ref/step-00000002/vision.safetensors) * (STEPS / 2) ))
seed=${FAULT_SEED:-$(date +%s)}
RANDOM=$seed
bad=0
for trial in $(seq $TRIALS); do
    injected=$((injected + 1))
    n=$(( (RANDOM * 32768 + RANDOM) % bytes ))
    rm -rf kc
    DHP_FAULT_KILL_AFTER=$n run2 --steps $STEPS --ckpt kc --ckpt-every 2 >/dev/null 2>kc.err
    rc=$?
    resume=--resume
    [ -s kc/latest ] || resume=   # killed inside the first checkpoint: nothing to resume from
    if [ $rc = 0 ]; then bad=$((bad + 1)); echo "# trial $trial: kill after $n bytes did not happen"; continue; fi
    if ! run2 --steps $STEPS --ckpt kc --ckpt-every 2 $resume >/dev/null 2>kc2.err; then
        bad=$((bad + 1)); echo "# trial $trial (kill after $n bytes): resume failed: $(tail -c 200 kc2.err)"; continue
    fi
    if ! same_ckpt ref kc "$last"; then bad=$((bad + 1)); echo "# trial $trial (kill after $n bytes): final step differs"; continue; fi
    if ls kc/*.tmp.* kc/step-*/*.tmp.* >/dev/null 2>&1; then bad=$((bad + 1)); echo "# trial $trial: temp files left"; continue; fi
    survived=$((survived + 1))
done
if [ $bad = 0 ]; then ok "faults_killed_during_checkpoint_writes_${TRIALS}_times_resume_bit_identical (seed $seed)"
else fail faults_killed_during_checkpoint_writes "$bad of $TRIALS trials failed (seed $seed)"; fi

# --- a full disk during a checkpoint: one line, the previous checkpoint intact, latest on it ---
# (a 1-rank run: one process, one line). A write-failure injection always;
# a small tmpfs too where this test may mount one.
disk_full() {   # NAME DIR [env]: DIR gets checkpoints at steps 2 and 4; the second cannot fit
    local name=$1 dir=$2; shift 2
    injected=$((injected + 1))
    env "$@" timeout 300 "$DHP" run one.json --data data --steps 4 --ckpt "$dir" --ckpt-every 2 >full.out 2>full.err
    local rc=$?
    if [ $rc = 0 ]; then fail "$name" "the run did not fail"; return; fi
    if [ "$(wc -l <full.err)" != 1 ] || ! grep -q 'No space left on device' full.err; then fail "$name" "$(head -c 300 full.err)"; return; fi
    if [ "$(cat "$dir/latest")" != step-00000002 ]; then fail "$name" "latest is $(cat "$dir/latest")"; return; fi
    for m in vision llm; do
        "$DHP" data ckpt-inspect "$dir/step-00000002/$m.safetensors" >/dev/null 2>&1 || { fail "$name" "step 2's $m file is damaged"; return; }
    done
    if ls "$dir"/step-00000004/*.tmp.* "$dir"/*.tmp.* >/dev/null 2>&1; then fail "$name" "temp files left"; return; fi
    survive "$name"
}
"$DHP" run one.json --data data --steps 2 --ckpt probe >/dev/null 2>&1
one=$(du -cb probe/step-00000002/*.safetensors | tail -1 | cut -f1)
disk_full faults_disk_full_by_injection full1 DHP_FAULT_ENOSPC_AFTER=$(( one + one / 2 ))
mkdir -p small
if [ "$(id -u)" = 0 ] && mount -t tmpfs -o size=$(( (one + one / 2) / 4096 * 4096 )) tmpfs small 2>/dev/null; then
    disk_full faults_disk_full_on_a_small_tmpfs small/ck
    umount small
else
    echo "# no tmpfs mount here (not root or no CAP_SYS_ADMIN): the injection above stands for it"
fi

# --- corrupted files: one line naming the file (and the tensor) ---
injected=$((injected + 1))
cp -r ref bad
f=bad/step-$last/llm.safetensors
/usr/bin/python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-1000]^=0x04; open(p,'wb').write(b)" "$f"
"$DHP" run one.json --data data --steps 20 --ckpt bad --resume >/dev/null 2>bad.err
rc=$?
if [ $rc = 2 ] && [ "$(wc -l <bad.err)" = 1 ] && grep -q "$f: tensor '[^']*': checksum mismatch" bad.err; then
    survive faults_flipped_checkpoint_byte_names_file_and_tensor
else fail faults_flipped_checkpoint_byte_names_file_and_tensor "exit $rc: $(head -c 300 bad.err)"; fi
injected=$((injected + 1))
cp -r data tdata; truncate -s 5000 tdata/shard-00001.bin
expect_err faults_truncated_shard_names_the_file 'tdata/shard-00001.bin: truncated: 5000 bytes' \
    "$DHP" run one.json --data tdata --steps 2
[ -s "$T/err" ] && grep -q truncated "$T/err" && survived=$((survived + 1))

# --- a partial restore: module files of two steps in one directory ---
injected=$((injected + 1))
cp -r ref mixed
cp mixed/step-00000004/vision.safetensors mixed/step-$last/vision.safetensors
run2 --steps 20 --ckpt mixed --resume >/dev/null 2>mixed.err
rc=$?
if [ $rc = 2 ] && grep -q "step-$last (named by mixed/latest) is not a complete checkpoint of this plan: vision.safetensors is at step 4" mixed.err \
   && [ "$(cat mixed/latest)" = "step-$last" ]; then survive faults_mixed_step_directory_refused_naming_the_file
else fail faults_mixed_step_directory_refused_naming_the_file "exit $rc: $(head -c 300 mixed.err)"; fi

# --- retention, temp files of killed runs, outputs checked before step 1 ---
rm -rf keep
run2 --steps 10 --ckpt keep --ckpt-every 2 --ckpt-keep 2 >/dev/null 2>keep.err
if [ "$(ls -d keep/step-* | tr '\n' ' ')" = "keep/step-00000008 keep/step-00000010 " ]; then ok faults_ckpt_keep_2_keeps_the_newest_two
else fail faults_ckpt_keep_2_keeps_the_newest_two "$(ls keep) $(head -c 200 keep.err)"; fi
touch keep/latest.tmp.Ab12Cd keep/step-00000010/llm.safetensors.tmp.Xy34Zw keep/notes.txt
run2 --steps 12 --ckpt keep --ckpt-every 2 --ckpt-keep 2 --resume >/dev/null 2>keep.err
if ! ls keep/*.tmp.* keep/step-*/*.tmp.* >/dev/null 2>&1 && [ -e keep/notes.txt ] && grep -q 'removed 2 temp files' keep.err
then ok faults_temp_files_of_killed_runs_removed; else fail faults_temp_files_of_killed_runs_removed "$(ls -R keep | head -20)"; fi
expect_err faults_trace_dir_checked_before_step_1 'nowhere/t.json: cannot write in nowhere' \
    "$DHP" run one.json --data data --steps 3 --trace nowhere/t.json
grep -q '^step' "$T/out" && fail faults_trace_dir_checked_before_step_1 "steps ran before the check"
echo x >afile
expect_err faults_ckpt_under_a_file_refused 'afile: exists and is not a directory' \
    "$DHP" run one.json --data data --steps 3 --ckpt afile/ck

echo "# faults injected $injected, survived $survived"
