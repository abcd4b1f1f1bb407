#!/usr/bin/env bash
# Install expstore with its test extras into a virtualenv (created if missing) and run the tests.
# Usage: bash scripts/test.sh                 every test but the slow and interop ones, on
#                                             EXPSTORE_TEST_WORKERS pytest-xdist workers (auto)
#        bash scripts/test.sh -m slow         the slow ones (soaks, stress, long integrations)
#        bash scripts/test.sh -m interop      against other projects' own readers/writers, each
#                                             in a venv of its own: TensorFlow Datasets
#                                             ($VENV-interop) and LeRobot (scripts/lerobot_env.sh;
#                                             its video decoder needs FFmpeg)
#        bash scripts/test.sh [pytest args]   anything else: pytest with those arguments
# CI (.ci/run) runs the first three. EXPSTORE_VENV picks the venv folder.
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
# Stable-Baselines3's own tests (tests/test_sb3_upstream.py) come from its source
# distribution on PyPI, for the installed version: downloaded once into .cache/sb3-sdist
"$PY" tests/_sb3_sdist.py >/dev/null \
  || echo "warning: SB3 sdist download failed: tests/test_sb3_upstream.py will say so" >&2
# gymnasium 0.29 (CleanRL pins gymnasium==0.29.1): the sb3/gym extras must resolve next to it,
# and the adapter tests run on it. A second venv sees the first one's packages through a .pth
# file (no second torch install) and holds only gymnasium 0.29.1 itself. Full runs only.
site() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
if [ $# -eq 0 ] && [ -z "${EXPSTORE_SKIP_GYM029:-}" ]; then
  V029=${EXPSTORE_VENV_GYM029:-$VENV-gym029}
  [ -x "$V029/bin/python" ] || "$PY" -c "import sys, venv; venv.create(sys.argv[1], with_pip=True)" "$V029"
  # addsitedir also reads the first venv's own .pth files (the editable expstore install)
  echo "import site; site.addsitedir(r'$(site "$PY")')" \
    > "$(site "$V029/bin/python")/expstore-base-venv.pth"
  "$V029/bin/python" -m pip install -q --disable-pip-version-check --dry-run "gymnasium==0.29.1" ".[sb3,gym]"
  "$V029/bin/python" -m pip install -q --disable-pip-version-check --ignore-installed --no-deps \
    "gymnasium==0.29.1"
  "$V029/bin/python" -c "import gymnasium; assert gymnasium.__version__ == '0.29.1', gymnasium.__version__"
  "$V029/bin/python" -m pytest -q -p no:cacheprovider -n "${EXPSTORE_TEST_WORKERS:-auto}" \
    tests/test_sb3.py tests/test_sb3_contract.py tests/test_sb3_arrays.py tests/test_sb3_frames.py \
    tests/test_sb3_store_path.py \
    tests/test_sb3_sync.py tests/test_torchrl_bridge.py
fi
WORKERS=(-n "${EXPSTORE_TEST_WORKERS:-auto}")
if [ $# -eq 0 ]; then
  exec "$PY" -m pytest -q -p no:cacheprovider "${WORKERS[@]}" -m "not slow and not interop"
elif [ "$*" = "-m slow" ]; then
  exec "$PY" -m pytest -q -p no:cacheprovider "${WORKERS[@]}" -m "slow and not interop"
elif [ "$*" = "-m interop" ]; then
  # tensorflow-cpu + tensorflow-datasets (the rlds-interop extra) in a venv of their own
  # that sees the first one's packages (numpy, protobuf, expstore) through a .pth file
  VI=${EXPSTORE_VENV_INTEROP:-$VENV-interop}
  [ -x "$VI/bin/python" ] || "$PY" -c "import sys, venv; venv.create(sys.argv[1], with_pip=True)" "$VI"
  echo "import site; site.addsitedir(r'$(site "$PY")')" > "$(site "$VI/bin/python")/expstore-base-venv.pth"
  "$VI/bin/python" -m pip install -q --disable-pip-version-check "tensorflow-cpu>=2.16" \
    "tensorflow-datasets>=4.9.4" 2>&1 | grep -v "^WARNING: Location" || true
  "$VI/bin/python" -c "import tensorflow_datasets as t, tensorflow as tf; print('tensorflow', tf.__version__, 'tensorflow-datasets', t.__version__)" 2>&1 | tail -1
  "$VI/bin/python" -m pytest -q -p no:cacheprovider -m interop tests/test_rlds_interop.py
  exec "$(bash scripts/lerobot_env.sh)" -m pytest -q -p no:cacheprovider -m interop \
    tests/test_lerobot_interop.py
fi
exec "$PY" -m pytest -q -p no:cacheprovider "$@"
