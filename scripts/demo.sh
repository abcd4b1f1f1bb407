#!/usr/bin/env bash
# Install expstore (+ Atari extras) into a virtualenv and run the main demo on a local store.
# Usage: bash scripts/demo.sh [demo args...]         (EXPSTORE_VENV picks the venv folder)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EXPSTORE_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --disable-pip-version-check "torch==2.13.0" -e ".[atari]" 2>&1 \
  | grep -v "^WARNING: Location" || true
exec "$PY" scripts/demo.py "$@"
