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
step "serve: /health, one completion, SIGTERM exits 0"
port=$("$bin/python" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$amdx" serve --model default --device cpu --port "$port" --max-num-seqs 2 --max-model-len 512 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
"$bin/python" - "$port" <<'PY'
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(600):
    try:
        if urllib.request.urlopen(f"{url}/health", timeout=2).status == 200:
            break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("serve did not come up")
body = json.dumps({"model": "default", "prompt": "The three primary colors are", "max_tokens": 8}).encode()
req = urllib.request.Request(f"{url}/v1/completions", body, {"Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(req, timeout=300))
assert answer["choices"][0]["text"] and answer["usage"]["completion_tokens"] > 0, answer
PY
kill -TERM "$server"
wait "$server"
trap - EXIT
step "launch --dry-run"
printf 'print("hello")\n' > "$out/hello.py"
"$amdx" launch --cpu --gpus 1 --dry-run -- "$out/hello.py"
step "done: every CLI command ran on the default model"
