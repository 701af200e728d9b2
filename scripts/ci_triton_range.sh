#!/usr/bin/env bash
# Kernel tests (Triton interpreter against the PyTorch references) and the AMD compile check
# (gfx90a/gfx942/gfx950/gfx1100, checked against that version's committed table) on the oldest and
# newest Triton we support. The main test run covers the Triton the dev extra pins (3.7.1, torch 2.13's).
#
#   scripts/ci_triton_range.sh PYTHON        # PYTHON: the test venv's python (our package + dev tools)
#
# Cheap by design: each Triton is a wheel unpacked once with `pip install --no-deps --target` into a
# cache folder and put first on PYTHONPATH, so the venv is never modified. No NumPy pin is needed:
# Triton 3.6's interpreter defect under NumPy 2.4 is repaired in optimum_amdx/kernels/triton_compat.py.
# Environment: TRITON_RANGE_VERSIONS (default "3.6.0 3.9.0"), TRITON_RANGE_DIR (the wheel cache),
# TRITON_RANGE_JOBS (pytest workers, default 2).
set -euo pipefail
PY=${1:?usage: scripts/ci_triton_range.sh PYTHON}
cd "$(dirname "$0")/.."
ROOT=$PWD
VERSIONS=${TRITON_RANGE_VERSIONS:-"3.6.0 3.9.0"}
CACHE=${TRITON_RANGE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/optimum_amdx/triton-range}
JOBS=${TRITON_RANGE_JOBS:-2}
status=0
summary=()
for v in $VERSIONS; do
  dir="$CACHE/triton-$v"
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "triton==$v"
    touch "$dir/.complete"
  fi
  export_path="$ROOT:$dir${PYTHONPATH:+:$PYTHONPATH}"
  got=$(PYTHONPATH="$export_path" "$PY" -c "import triton; print(triton.__version__)")
  if [ "$got" != "$v" ]; then
    echo "ci_triton_range: expected Triton $v first on the path, got $got" >&2
    exit 2
  fi
  echo "=== Triton $v: tests/kernels (interpreter + AMD compile check)"
  start=$SECONDS
  if PYTHONPATH="$export_path" "$PY" -m pytest -p no:cacheprovider -q -n "$JOBS" tests/kernels; then
    result=passed
  else
    result=FAILED
    status=1
  fi
  summary+=("Triton $v: $result in $((SECONDS - start)) s")
done
printf '%s\n' "${summary[@]}"
exit $status
