#!/usr/bin/env bash
# Installs every Debian package dhp needs to build and test. Nothing else
# (PyPI packages for the tests go into build/venv: scripts/venv.sh).
# clang + its runtime (libclang-rt-dev: libFuzzer, ASan, UBSan) build the fuzz targets (tests/fuzz).
set -euo pipefail
PKGS="build-essential make pkg-config libglpk-dev glpk-utils libcjson-dev libopenblas-dev
      libopenmpi-dev openmpi-bin libcurl4-openssl-dev python3 python3-numpy python3-torch
      python3-venv openssl chromium iproute2 clang libclang-rt-dev"
SUDO=""
[ "$(id -u)" = 0 ] || SUDO=sudo
missing=""
for p in $PKGS; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends $missing
fi
echo "deps: all installed"
