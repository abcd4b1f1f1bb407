#!/usr/bin/env bash
# Install expstore with its test extras into a virtualenv (created if missing) and run the tests.
# Usage: bash scripts/test.sh [pytest args...]      (EXPSTORE_VENV picks the venv folder)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${EXPSTORE_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --disable-pip-version-check "${TORCH_PIN:-torch==2.13.0}" -e ".[test]" 2>&1 \
  | grep -v "^WARNING: Location" || true
"$PY" -c "import torch, zarr, expstore; print('torch', torch.__version__, 'zarr', zarr.__version__)"
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
