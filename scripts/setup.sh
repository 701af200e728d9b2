#!/usr/bin/env bash
# Make a virtual environment with optimum-amdx (editable) on a CPU or NVIDIA machine.
#   bash scripts/setup.sh           .venv        runtime: every feature (extra "all"), nothing else
#   bash scripts/setup.sh --dev     .venv        the same plus the test tools (extra "dev")
#   bash scripts/setup.sh --peers   .venv-peers  runtime + dev + peer libraries (GPT-QModel pins numpy 2.2.6,
#                                                so it lives apart and only the interop tests run there)
# VENV=path overrides the folder, PYTHON=python3.X the interpreter.
# torch is pinned to 2.13.0 and installed first: an unpinned torch would pull several GB of CUDA packages.
# On an AMD machine install ROCm PyTorch into the venv first (see README), then run this script.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
case "${1:-}" in
  "") extras="all"; venv=${VENV:-.venv} ;;
  --dev) extras="all,dev"; venv=${VENV:-.venv} ;;
  --peers) extras="all,dev,peers"; venv=${VENV:-.venv-peers} ;;
  *) echo "error: unknown option ${1}; use no option, --dev or --peers" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
  "${pip[@]}" "torch==2.13.0"
fi
"${pip[@]}" -e ".[$extras]" --config-settings editable_mode=compat
echo "optimum-amdx is installed in $(pwd)/$venv (extras: $extras)" >&2
