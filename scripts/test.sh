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
# azurite (Azure Blob emulator, npm) for tests/test_azure.py, into a project-local prefix
AZURITE=.cache/node/node_modules/.bin/azurite-blob
if [ ! -x "$AZURITE" ]; then
  if command -v npm >/dev/null; then
    npm install --prefix .cache/node --no-audit --no-fund --silent azurite@3 \
      || echo "warning: npm install azurite@3 failed: the Azure tests will say so" >&2
  else
    echo "warning: npm not found: the Azure tests will say so" >&2
  fi
fi
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
