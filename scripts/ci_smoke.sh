#!/usr/bin/env bash
# CI: one smoke run of every CLI command on the default model, in the runtime install a user gets.
#   bash scripts/ci_smoke.sh [VENV]       (default .venv; outputs go to .ci-smoke/, rebuilt each time)
# Output meant for a file or pipe (env --json, deepspeed-config, benchmark --json) is parsed as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-.venv}/bin"
out=.ci-smoke
rm -rf "$out"
mkdir -p "$out"
amdx="$bin/optimum-amdx"
json="$bin/python -m json.tool"
start=$(date +%s)
step() { echo "--- smoke [$(( $(date +%s) - start )) s]: $*" >&2; }

step "--version"
"$amdx" --version
"$bin/optimum-cli" amdx --version
step "env, env --json | json"
"$amdx" env
"$amdx" env --json | $json > /dev/null
step "deepspeed-config > ds.json"
"$amdx" deepspeed-config --model default --gpu mi300x > "$out/ds.json"
$json "$out/ds.json" > /dev/null
step "generate --chat"
"$amdx" generate --model default --chat --max-new-tokens 8 "Name a color."
step "benchmark --json (tiny)"
"$amdx" benchmark --model default --batch-sizes 1 --prompt-lengths 8 --new-tokens 2 --warmup 0 --repeats 1 \
  --threads 1 --json -o "$out/bench" | $json > /dev/null
test -s "$out/bench/results.json"
step "quantize rtn"
"$amdx" quantize rtn --model default --bits 4 --group-size 64 "$out/rtn"
step "eval-ppl (small)"
"$amdx" eval-ppl --model "$out/rtn" --seqlen 64 --max-windows 2 --json | $json > /dev/null
step "export"
"$amdx" export --model default "$out/onnx"
test -s "$out/onnx/model.onnx"
step "launch --dry-run"
printf 'print("hello")\n' > "$out/hello.py"
"$amdx" launch --cpu --gpus 1 --dry-run -- "$out/hello.py"
step "done: every CLI command ran on the default model"
