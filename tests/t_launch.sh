#!/usr/bin/env bash
# dhp launch: the rankfile puts every rank on the host and GPU the plan
# assigns; --exec runs it here; --slurm writes an sbatch script whose task
# placement is checked with stand-ins for scontrol and srun.
. "$(dirname "$0")/lib.sh"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's own allocations under the ASan build

# 16 ranks on two nodes of 8 GPUs: vision on 4 GPUs of node 0, the LLM on the rest.
"$DHP" plan --model qwen2.5-vl-7b --cluster 2x8xh100 --batch 32 --vision-tokens 4096 --placement disaggregated \
    --n-micro 4 --strategy 'vision:gpus=4,dp=4;llm:gpus=12,tp=2,dp=6' -o "$T/big.json" >/dev/null 2>"$T/err" ||
    fail launch_big_plan "$(head -c 300 "$T/err")"
printf '# two nodes\ngpu-a\n\ngpu-b  # the second\n' >"$T/hosts"
if "$DHP" launch "$T/big.json" --hosts "$T/hosts" --rankfile "$T/rf" -- --data /shared/data >"$T/out" 2>"$T/err"; then
    want=$(for r in $(seq 0 15); do h=gpu-a; [ "$r" -ge 8 ] && h=gpu-b; echo "rank $r=$h slot=$((r % 8))"; done)
    if [ "$(cat "$T/rf")" = "$want" ] && grep -q "^mpirun -np 16 --rankfile $T/rf .*dhp run $T/big.json --data /shared/data$" "$T/out"
    then ok launch_rankfile_two_nodes
    else fail launch_rankfile_two_nodes "$(head -c 400 "$T/rf") / $(tail -1 "$T/out")"; fi
else fail launch_rankfile_two_nodes "$(head -c 300 "$T/err")"; fi
expect_err launch_too_few_hosts "big.json: rank 8 runs on the plan's node 1, but 1 host is given" \
    "$DHP" launch "$T/big.json" --rankfile "$T/rf2"
printf 'ok-host\nbad;host\n' >"$T/badhosts"
expect_err launch_bad_host_name "badhosts:2: 'bad;host' is not a host name" "$DHP" launch "$T/big.json" --hosts "$T/badhosts"
expect_err launch_one_way "give one of --exec, --slurm and --ray" "$DHP" launch "$T/big.json" --exec --slurm "$T/s"

# --exec: the tiny plan (3 ranks) runs here through mpirun and the rankfile.
"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null 2>&1
"$DHP" plan --model tiny-vl --cluster cpu-4 --batch 16 --vision-tokens 64 --text-tokens 48 --precision fp32 \
    --placement disaggregated --n-micro 4 --strategy 'vision:gpus=1;llm:gpus=2,tp=2,seqpar=0' -o "$T/tiny.json" \
    >/dev/null 2>"$T/err" || fail launch_tiny_plan "$(head -c 300 "$T/err")"
if timeout 300 "$DHP" launch "$T/tiny.json" --exec --cores-per-node "$(nproc)" -- --data "$T/data" --steps 2 \
        >"$T/run" 2>"$T/err" && grep -q "^step 2/2" "$T/run"; then ok launch_exec_runs
else fail launch_exec_runs "$(tail -c 300 "$T/err") $(tail -c 200 "$T/run")"; fi

# --slurm: run the script with scontrol and srun stand-ins that report what srun would place where.
if "$DHP" launch "$T/big.json" --slurm "$T/job.sbatch" -- --data /shared/data >/dev/null 2>"$T/err" &&
   bash -n "$T/job.sbatch"; then
    mkdir -p "$T/bin"
    printf '#!/bin/sh\n[ "$1 $2" = "show hostnames" ] && printf "n1\\nn2\\n"\n' >"$T/bin/scontrol"
    printf '#!/bin/sh\necho "srun $*"\ncat "$SLURM_HOSTFILE"\n' >"$T/bin/srun"
    chmod +x "$T/bin/scontrol" "$T/bin/srun"
    if PATH="$T/bin:$PATH" SLURM_JOB_NODELIST="n[1-2]" bash "$T/job.sbatch" >"$T/slurm.out" 2>"$T/err" &&
       grep -q "^srun --mpi=pmix --ntasks=16 --distribution=arbitrary --gpu-bind=map_gpu:0,1,2,3,4,5,6,7 .*dhp run $T/big.json --data /shared/data$" "$T/slurm.out" &&
       [ "$(grep -c '^n1$' "$T/slurm.out")" = 8 ] && [ "$(grep -c '^n2$' "$T/slurm.out")" = 8 ] &&
       [ "$(grep -E '^n[12]$' "$T/slurm.out" | head -8 | sort -u)" = n1 ] &&
       grep -q "^#SBATCH --nodes=2$" "$T/job.sbatch" && grep -q "^#SBATCH --ntasks=16$" "$T/job.sbatch"; then
        ok launch_slurm_script
    else fail launch_slurm_script "$(head -c 400 "$T/slurm.out") $(head -c 200 "$T/err")"; fi
else fail launch_slurm_script "$(head -c 300 "$T/err")"; fi
