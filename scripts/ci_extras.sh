#!/usr/bin/env bash
# CI: every extra works with only the core install under it, and the core lower bounds are real.
#   bash scripts/ci_extras.sh [FOLDER]      (default .ci-envs; rebuilt from scratch)
# 1. FOLDER/core: torch 2.13.0 + optimum-amdx with no extras, every core dependency at the lowest version
#    pyproject.toml allows (scripts/lower-bounds.txt); it imports everything that needs no extra, and
#    converts and runs the default model from a fresh cache (the GGUF path needs gguf + accelerate).
# 2. FOLDER/<extra>: an environment made in seconds on top of core (a .pth file adds core's
#    site-packages; pip installs only what the extra adds), so the check sees core + that extra only.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:-.ci-envs}
PY=${PYTHON:-python3}
rm -rf "$base"
mkdir -p "$base"
core="$base/core"
"$PY" -m venv "$core"
pip=(-m pip install -q --disable-pip-version-check)
"$core/bin/python" "${pip[@]}" "torch==2.13.0"
"$core/bin/python" "${pip[@]}" -e . -c scripts/lower-bounds.txt --config-settings editable_mode=compat
"$core/bin/python" scripts/check_extras.py env core
OPTIMUM_AMDX_CACHE="$base/cache" "$core/bin/optimum-amdx" generate --model default --max-new-tokens 8 \
  "The three primary colors are"
site=$("$core/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
for extra in $("$core/bin/python" scripts/check_extras.py extras); do
  env="$base/$extra"
  "$PY" -m venv --without-pip "$env"
  xsite=$("$env/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "import site; site.addsitedir('$site')" > "$xsite/_amdx_core.pth"
  "$core/bin/python" -m pip --python "$env/bin/python" install -q --disable-pip-version-check \
    -e ".[$extra]" --config-settings editable_mode=compat
  "$env/bin/python" scripts/check_extras.py env "$extra"
done
echo "every extra imports its features on top of the core install" >&2
