#!/usr/bin/env bash
# Creates build/venv (Debian's python3 with its system packages) and installs
# scripts/requirements*.txt into it. Idempotent: a stamp of the requirement
# files skips the work when nothing changed. Needs PyPI (the first time only).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${DHP_VENV:-build/venv}
PY=/usr/bin/python3
stamp="$VENV/.dhp-requirements"
want=$(cat scripts/requirements.txt scripts/requirements-nodeps.txt | sha256sum | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    echo "venv: $VENV up to date"
    exit 0
fi
"$PY" -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r scripts/requirements.txt
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r scripts/requirements-nodeps.txt
echo "$want" >"$stamp"
echo "venv: $VENV ready ($(du -sh "$VENV" | cut -f1))"
