#!/usr/bin/env bash
# The environment of LeRobot's own reader/writer for tests/test_lerobot_interop.py (marker
# interop): a venv beside the base one ($EXPSTORE_VENV, default .venv) that sees its packages
# through a .pth file and adds, in its own site-packages (which come first):
#   torch 2.14.1 + torchvision 0.29.1 (lerobot's dataset code imports torchvision, and PyPI's
#   torchvision does not import beside the base venv's CPU torch 2.13.0; this pair lies on this
#   machine's disk for Python 3.11, so nothing is downloaded), torchcodec 0.13 (LeRobot's video
#   decoder; needs the system FFmpeg: apt-get install ffmpeg), numpy<2.3 (lerobot 0.4.4's
#   recorder turns (1,)-arrays into floats, which numpy 2.3+ refuses), lerobot 0.4.4 without its
#   pins (it pins torch<2.11) and the packages its dataset code imports.
# lerobot 0.5 needs Python 3.12, for which no torch lies on this disk (a CUDA build is GBs).
# Usage: bash scripts/lerobot_env.sh   (prints the venv's python; EXPSTORE_LEROBOT_VENV picks it)
set -euo pipefail
cd "$(dirname "$0")/.."
BASE=${EXPSTORE_VENV:-.venv}
V=${EXPSTORE_LEROBOT_VENV:-.venv-lerobot}
PIP=(-m pip install -q --disable-pip-version-check)
[ -x "$V/bin/python" ] || "$BASE/bin/python" -c "import sys, venv; venv.create(sys.argv[1], with_pip=True)" "$V"
site() { "$1" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])"; }
echo "import site; site.addsitedir(r'$(site "$BASE/bin/python")')" \
  > "$(site "$V/bin/python")/expstore-base-venv.pth"
if ! "$V/bin/python" -c "import lerobot.datasets.lerobot_dataset, torchcodec.decoders" 2>/dev/null; then
  "$V/bin/python" "${PIP[@]}" torch==2.14.1 torchvision==0.29.1 "numpy>=2.0,<2.3" 2>&1 \
    | grep -v "^WARNING: Location\| requires \|dependency resolver" || true
  "$V/bin/python" "${PIP[@]}" --no-deps lerobot==0.4.4 torchcodec==0.13.0 2>&1 \
    | grep -v "^WARNING: Location\| requires \|dependency resolver" || true
  "$V/bin/python" "${PIP[@]}" "datasets>=4,<5" "huggingface-hub>=0.34.2,<0.36" "av>=15,<16" \
    jsonlines draccus==0.10.0 deepdiff termcolor einops "accelerate>=1.10,<2" pandas 2>&1 \
    | grep -v "^WARNING: Location\| requires \|dependency resolver" || true
fi
"$V/bin/python" -c "import torch, lerobot.datasets.lerobot_dataset, torchcodec.decoders, av; print('lerobot env: torch', torch.__version__, 'av', av.__version__)" >&2
echo "$V/bin/python"
