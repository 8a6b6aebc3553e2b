#!/usr/bin/env bash
# dhp launch --ray and dhp clusters --from-ray against a real Ray head (PyPI
# ray in build/venv, from make deps) started here. The whole test runs in a
# network namespace of its own with only the loopback interface, so that Ray
# (which otherwise advertises the host's routable address) talks over 127.0.0.1
# only. It takes about a minute.
. "$(dirname "$0")/lib.sh"
RAY="${DHP_VENV:-$PWD/build/venv}/bin/ray"
if [ ! -x "$RAY" ]; then fail ray_venv "$RAY missing: run make deps (scripts/venv.sh)"; exit 0; fi
if [ -z "${DHP_IN_NETNS:-}" ]; then
    if ! unshare -n true 2>/dev/null; then fail ray_netns "unshare -n (a private network namespace) is not allowed here"; exit 0; fi
    exec unshare -n env DHP_IN_NETNS=1 bash "$0" "$@"
fi
ip link set lo up
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"   # Open MPI's own allocations under the ASan build
# Ray's socket paths must stay short.
RT=$(mktemp -d /tmp/dhpray.XXXX)
trap '"$RAY" stop --force >/dev/null 2>&1; rm -rf "$RT" "$T"' EXIT
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
dash=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
if ! timeout 180 "$RAY" start --head --port="$port" --dashboard-host=127.0.0.1 --dashboard-port="$dash" --num-cpus=2 \
        --num-gpus=4 --resources='{"accelerator_type:H100": 1}' --include-dashboard=true --disable-usage-stats \
        --temp-dir="$RT" >"$T/ray.log" 2>&1; then
    fail ray_head "ray start failed: $(tail -c 300 "$T/ray.log")"; exit 0
fi
A="http://127.0.0.1:$dash"
for _ in $(seq 60); do "$DHP" clusters --from-ray "$A" -o "$T/c.json" >"$T/c.out" 2>"$T/err" && break; sleep 1; done

# The cluster description: one node with 4 GPUs of Ray accelerator type H100.
if grep -q "wrote $T/c.json: 1 pool(s) 1 x 4 H100-SXM-80GB" "$T/c.out" &&
   "$DHP" plan --model qwen2.5-vl-3b --cluster "$T/c.json" --batch 8 --vision-tokens 1024 -o /dev/null --top 0 \
       --no-baselines >"$T/plan.txt" 2>"$T/err" && grep -q "cluster  ray: 1 x 4 H100-SXM-80GB" "$T/plan.txt"; then
    ok ray_clusters_from_ray
else fail ray_clusters_from_ray "$(cat "$T/c.out") $(head -c 300 "$T/err")"; fi
expect_err ray_clusters_unknown_gpu "unknown GPU|not found|no GPU" "$DHP" clusters --from-ray "$A" --gpu NoSuchGPU

# A run through Ray's Jobs API: the tiny plan's 3 ranks via mpirun on the Ray node.
"$DHP" data synth --out "$T/data" --samples 64 --window 0 >/dev/null 2>&1
"$DHP" plan --model tiny-vl --cluster cpu-4 --batch 16 --vision-tokens 64 --text-tokens 48 --precision fp32 \
    --placement disaggregated --n-micro 4 --strategy 'vision:gpus=1;llm:gpus=2,tp=2,seqpar=0' -o "$T/tiny.json" \
    >/dev/null 2>"$T/err" || fail ray_tiny_plan "$(head -c 300 "$T/err")"
if timeout 400 "$DHP" launch "$T/tiny.json" --ray "$A" --wait --timeout 300 --cores-per-node "$(nproc)" -- \
        --data "$T/data" --steps 2 >"$T/job.out" 2>"$T/err" &&
   grep -q "^submitted Ray job raysubmit_" "$T/job.out" && grep -q "^step 2/2" "$T/job.out" &&
   grep -q "SUCCEEDED$" "$T/job.out"; then
    ok ray_launch_job_runs
else fail ray_launch_job_runs "$(tail -c 400 "$T/job.out") $(head -c 200 "$T/err")"; fi
# A run that fails (no such data) is reported as the job's failure.
if timeout 400 "$DHP" launch "$T/tiny.json" --ray "$A" --wait --timeout 300 -- --data "$T/nodata" --steps 1 \
        >"$T/job2.out" 2>"$T/err"; then fail ray_launch_job_fails "exit 0 for a failing run"
elif grep -q "Ray job raysubmit_.* FAILED" "$T/err"; then ok ray_launch_job_fails
else fail ray_launch_job_fails "$(head -c 300 "$T/err")"; fi

"$RAY" stop --force >/dev/null 2>&1
expect_err ray_head_gone "127.0.0.1:$dash/api/v0/nodes.*: .*connect" "$DHP" clusters --from-ray "$A"
