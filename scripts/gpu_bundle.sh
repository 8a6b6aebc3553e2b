#!/usr/bin/env bash
# Packs dhp for a GPU machine that has the NVIDIA driver and CUDA (the
# toolkit, or PyTorch's wheels of cuBLAS and NCCL) but none of dhp's other
# libraries and no package manager to fetch them: the machines this project
# is lent for bench/gpu_check.sh (.library/device: an image with nvcc and
# PyTorch, nothing reachable from it). Built here, run there:
#
#   scripts/gpu_bundle.sh [DIR]                 # default build/gpu-bundle, and DIR.tar.gz
#                                               # (DHP=binary: that one, else make dhp's)
#   GPU_BUNDLE=DIR.tar.gz bench/gpu_check.sh    # on the GPU machine
#
# With LLMC=an llm.c checkout (fetch github:karpathy/llm.c), it also builds
# llm.c's train_gpt2cu (bf16, sm_90, one GPU, no MPI) into DIR/llmc for
# gpu_check's side-by-side run: llm.c as published, but for one argument
# CUDA 13 changed (cudaMemAdvise's location, llmc/cuda_utils.cuh), edited in
# a copy before the build.
#
# DIR holds bin/dhp (this machine's CUDA build: sm_80, sm_90 and PTX), lib/
# (every shared library dhp and Open MPI's components load, less what every
# Linux and every CUDA install has: the C library, GCC's runtime, the
# driver, cuBLASLt and NCCL), ompi/ (Open MPI's components, help texts and
# site parameters) and env.sh, which points the loader and Open MPI there
# and at the machine's own CUDA libraries. One rank runs as an isolated MPI
# singleton (no mpirun, no daemon); that is all a one-GPU machine needs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/gpu-bundle}
MPI_PKGLIB=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
MPI_PKGDATA=$(ompi_info --path pkgdatadir --parsable 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
MPI_SYSCONF=$(ompi_info --path sysconfdir --parsable 2>/dev/null | sed -n 's/^path:sysconfdir://p')
[ -d "$MPI_PKGLIB" ] && [ -d "$MPI_PKGDATA" ] || { echo "gpu_bundle: Open MPI's install directories not found (ompi_info)" >&2; exit 1; }

# the binary to pack: DHP, else this checkout's, built first
if [ -z "${DHP:-}" ]; then make -j"$(nproc)" dhp >/dev/null; DHP=./dhp; fi
# (ldd's whole output first: under pipefail, grep -q leaving at its first match
# would fail the pipeline whenever ldd is still writing and gets SIGPIPE)
deps=$(ldd "$DHP")
grep -q 'libcudart' <<<"$deps" || { echo "gpu_bundle: $DHP has no CUDA backend (nvcc not found when it was built)" >&2; exit 1; }

# What not to carry: the C library and its parts, GCC's runtime (a newer
# system has newer ones, and an older copy would shadow them), the kernel's
# vDSO, and the CUDA libraries the GPU machine must have in its driver's and
# toolkit's versions (libcudart stays: small, and the one dhp was built with).
skip='^(linux-vdso|ld-linux-x86-64|libc|libm|libmvec|libpthread|libdl|librt|libresolv|libutil|libgcc_s|libstdc\+\+|libcuda|libnccl|libcublas|libcublasLt)\.so'

TMP=$OUT.tmp
rm -rf "$TMP"
mkdir -p "$TMP/bin" "$TMP/lib" "$TMP/ompi/lib" "$TMP/ompi/etc"
cp "$DHP" "$TMP/bin/dhp"
cp -r "$MPI_PKGLIB"/. "$TMP/ompi/lib/"
cp -r "$MPI_PKGDATA" "$TMP/ompi/share"
[ -f "$MPI_SYSCONF/openmpi-mca-params.conf" ] && cp "$MPI_SYSCONF/openmpi-mca-params.conf" "$TMP/ompi/etc/"

# the shared libraries dhp and every Open MPI component load, by their sonames
deps=$({ ldd "$DHP"; for c in "$MPI_PKGLIB"/*.so; do ldd "$c"; done; } 2>/dev/null)
missing=$(grep 'not found' <<<"$deps" | sort -u || true)
[ -z "$missing" ] || { echo "gpu_bundle: libraries not found here: $missing" >&2; exit 1; }
awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' <<<"$deps" | sort -u \
    | while read -r name path; do
        [[ $name =~ $skip ]] && continue
        cp -L "$path" "$TMP/lib/$name"
    done

echo "$skip" >"$TMP/expects.txt"   # what the machine must have (tests/t_gpu_check.sh holds the bundle to it)

cat >"$TMP/env.sh" <<'SH'
# Sourced by bench/gpu_check.sh (GPU_BUNDLE=dir): the loader and Open MPI
# look in this bundle, then in the machine's CUDA libraries (the toolkit's
# lib64, then PyTorch's wheels: nvidia-cublas, nvidia-nccl).
GPU_BUNDLE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# (the wheels' folders vary: nvidia/cublas/lib before CUDA 13, nvidia/cu13/lib after)
cuda_dirs=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/nvidia/lib64 \
         $(python3 -c '
import nvidia, os
want = ("libcublasLt.so", "libnccl.so", "libcudart.so")
for top in nvidia.__path__:
    for d, _, files in os.walk(top):
        if any(f.startswith(want) for f in files): print(d)' 2>/dev/null); do
    [ -d "$d" ] && cuda_dirs="$cuda_dirs:$d"
done
export LD_LIBRARY_PATH="$GPU_BUNDLE/lib$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OPAL_PREFIX="$GPU_BUNDLE/ompi" OPAL_PKGLIBDIR="$GPU_BUNDLE/ompi/lib" OPAL_PKGDATADIR="$GPU_BUNDLE/ompi/share" \
       OPAL_SYSCONFDIR="$GPU_BUNDLE/ompi/etc"
# one rank without mpirun: no daemon to start, shared memory and self only
export OMPI_MCA_ess_singleton_isolated=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_plm=isolated
export DHP="${DHP:-$GPU_BUNDLE/bin/dhp}"   # an explicit DHP (the emulator build, in a test) wins
SH

if [ -n "${LLMC:-}" ]; then
    [ -f "$LLMC/train_gpt2.cu" ] || { echo "gpu_bundle: LLMC=$LLMC is not an llm.c checkout" >&2; exit 1; }
    NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    CUDA_HOME=${NVCC%/bin/nvcc}
    rm -rf "$TMP/llmc-src" && cp -r "$LLMC" "$TMP/llmc-src" && rm -rf "$TMP/llmc-src/.git" "$TMP/llmc-src/train_gpt2cu"
    sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' \
        "$TMP/llmc-src/llmc/cuda_utils.cuh"
    # NVML only where the toolkit has its header (llmc/mfu.h uses it then)
    ldflags="-lcublas -lcublasLt"
    [ -f "$CUDA_HOME/include/nvml.h" ] && ldflags="$ldflags -lnvidia-ml"
    (cd "$TMP/llmc-src" && PATH="$CUDA_HOME/bin:$PATH" LIBRARY_PATH="$CUDA_HOME/lib64:$CUDA_HOME/lib64/stubs" \
        make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 NVCC_LDFLAGS="$ldflags" >build.log 2>&1) \
        || { echo "gpu_bundle: llm.c's build failed: $(tail -n 3 "$TMP/llmc-src/build.log")" >&2; exit 1; }
    mkdir -p "$TMP/llmc" && cp "$TMP/llmc-src/train_gpt2cu" "$TMP/llmc/"
    (cd "$LLMC" && git log -1 --format='llm.c %H (%cs)' 2>/dev/null) >"$TMP/llmc/VERSION" || echo "llm.c" >"$TMP/llmc/VERSION"
    rm -rf "$TMP/llmc-src"
fi

rm -rf "$OUT" "$OUT.tar.gz"
mv "$TMP" "$OUT"
tar czf "$OUT.tar.gz.tmp" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$OUT.tar.gz.tmp" "$OUT.tar.gz"
echo "gpu_bundle: $OUT, $(du -sh "$OUT" | cut -f1) ($(ls "$OUT/lib" | wc -l) libraries, $(ls "$OUT/ompi/lib" | wc -l) Open MPI" \
     "components$([ -d "$OUT/llmc" ] && echo ", $(cat "$OUT/llmc/VERSION")")); $OUT.tar.gz $(du -h "$OUT.tar.gz" | cut -f1)"
