#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, in one short run (a lent GPU machine,
# or any host with one): build with CUDA, check the CUDA kernels against the
# CPU backend on the device (dhp profile does it before timing), profile one
# GPU quick and full, fp32 GEMMs, and - with several GPUs - NCCL between them.
# Writes every output under $OUT (default /tmp/dhp-gpu-check).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/dhp-gpu-check}
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
nvidia-smi -L | tee "$OUT/gpus.txt" || { echo "gpu_check: nvidia-smi found no GPU"; exit 1; }
make -j"$(nproc)" dhp >"$OUT/build.txt" 2>&1 || { tail -20 "$OUT/build.txt"; echo "gpu_check: build failed"; exit 1; }
step() {   # step NAME CMD...: runs CMD, keeps its output, reports its exit code
    local name=$1; shift
    local t0=$SECONDS
    "$@" >"$OUT/$name.txt" 2>&1
    local rc=$?
    echo "== $name: exit $rc, $((SECONDS - t0)) s"
    tail -25 "$OUT/$name.txt"
}
step quick ./dhp profile --backend cuda --quick -o "$OUT/gpu-quick.json" --cluster-out "$OUT/cluster-quick.json"
step fp32 ./dhp profile --backend cuda --quick --gemm-fp32 -o "$OUT/gpu-fp32.json"
step full ./dhp profile --backend cuda -o "$OUT/gpu.json" --cluster-out "$OUT/cluster.json"
n=$(nvidia-smi -L | wc -l)
if [ "$n" -gt 1 ] && command -v mpirun >/dev/null; then
    step nccl mpirun -np "$n" ./dhp profile --backend cuda --quick --cluster-out "$OUT/cluster-$n.json"
fi
step plan ./dhp plan --cluster "$OUT/cluster.json" --model qwen2.5-vl-7b -o "$OUT/plan.json"
