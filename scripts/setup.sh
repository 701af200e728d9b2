#!/usr/bin/env bash
# Create ./.venv with optimum-amdx and every optional feature (CPU machine).
#   bash scripts/setup.sh         runtime: all features
#   bash scripts/setup.sh --dev   also the test tools and the peer libraries tests compare against (GPT-QModel)
# torch is pinned to 2.13.0 first: an unpinned torch would pull several GB of CUDA packages.
# On an AMD machine install ROCm PyTorch into the venv first (see README), then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
extras="all"
if [ "${1:-}" = "--dev" ]; then
  extras="all,dev,peers"
fi
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[$extras]" --config-settings editable_mode=compat
echo "optimum-amdx is installed in $(pwd)/.venv (extras: $extras)" >&2
