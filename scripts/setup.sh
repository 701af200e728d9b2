#!/usr/bin/env bash
# Create ./.venv with optimum-amdx and everything its features and tests need (CPU machine).
# torch is pinned to 2.13.0 first: an unpinned torch would pull several GB of CUDA packages.
# On an AMD machine install ROCm PyTorch yourself first (see README), then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[all,dev,peers]" --config-settings editable_mode=compat
python -m pip install -q pytest-xdist
echo "optimum-amdx is installed in $(pwd)/.venv"
