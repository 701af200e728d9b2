#!/usr/bin/env bash
# The pending GPU measurements of benchmarks/RESULTS.md (section pending-gpu), as stages that each fit one
# device call (at most 10 minutes; every step has its own timeout, so a slow step costs its slot and no
# more). Run from the repository root on the device machine (its python3 holds torch, Triton and
# transformers; our package is put on PYTHONPATH). Results go to $OUT (the device tool's folder; at most
# eight files come back, two folders deep), else ./gpu-pending-out.
#
#   bash benchmarks/gpu_pending.sh verify    # GPU tests of the W4A16, norm, attention, GPTQ and engine code, the one-row fixed cost
#   bash benchmarks/gpu_pending.sh decode    # Llama-3-8B GPTQ decode step: plain vs act-order, gathers moved or not
#   bash benchmarks/gpu_pending.sh e2e-l3    # optimum-amdx benchmark, Llama-3-8B: fp16, GPTQ, GPTQ with a 4-bit lm_head
#   bash benchmarks/gpu_pending.sh e2e-l2    # the same for Llama-2-7B: fp16, GPTQ
#   bash benchmarks/gpu_pending.sh m1        # the seven-shape one-row table with the shipped config and the read floor, then the knob sweep
#   bash benchmarks/gpu_pending.sh pdl       # programmatic dependent launch: GPU tests with it on, decode step off vs on (fp16, GPTQ, both shapes)
#   bash benchmarks/gpu_pending.sh attn      # decode attention: the shipped config and split rule against the grid, 1-64 sequences
#   bash benchmarks/gpu_pending.sh prefill   # 512-2048-row projections: fp16, dequant + BLAS and the fused GEMMs (pipelined configs), both shapes
#   bash benchmarks/gpu_pending.sh attncfg   # decode attention: the shipped config against register caps and one stage, at 1-16 splits
#   bash benchmarks/gpu_pending.sh peers     # issue 13's kernel table at 1-64 rows with the peers, then 128-512 rows without them
#   bash benchmarks/gpu_pending.sh rows16    # Nsight Compute on Llama-2-7B's four 16-row W4A16 calls as its batch-16 decode step runs them
#   bash benchmarks/gpu_pending.sh unroll    # two K tiles a loop step (UNROLL, round 34): GPU tests, the accumulating calls at 4-16 rows, the decode step at 4 and 16
#
# peers: GemLite comes from $GEMLITE_PATH, a folder holding its `gemlite` package (the device has no network), put on
# this step's PYTHONPATH only so its pins never reach our environment. Prepare it on a machine with the registry:
#   pip download --no-deps --no-binary :all: gemlite==0.6.0.post2 && tar xzf gemlite-0.6.0.post2.tar.gz
#   mkdir -p .tmpdev/gl && cp -r gemlite-0.6.0.post2/gemlite .tmpdev/gl/   # then carry .tmpdev, GEMLITE_PATH=.tmpdev/gl
# Without it the table still runs, with torch's int4mm as the only peer.
set -uo pipefail
case "${1:-}" in
  verify|decode|e2e-l3|e2e-l2|m1|pdl|attn|prefill|attncfg|peers|rows16|unroll) ;;
  *) echo "usage: bash benchmarks/gpu_pending.sh verify|decode|e2e-l3|e2e-l2|m1|pdl|attn|prefill|attncfg|peers|rows16|unroll" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
out=${OUT:-gpu-pending-out}
mkdir -p "$out"
status=0
step() {  # step SECONDS LOG COMMAND...: run with a timeout, keep the output's tail in LOG
  local limit=$1 log=$2
  shift 2
  echo "=== $(date +%T) $*" | tee -a "$out/$log"
  timeout "$limit" "$@" 2>&1 | tail -n 60 >> "$out/$log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 0 ] || { echo "step exited $rc: $*" | tee -a "$out/$log"; status=1; }
}
bench() {  # bench SECONDS NAME MODEL QUANTIZATIONS: optimum-amdx benchmark, JSON kept as NAME.json
  local dir
  dir=$(mktemp -d)
  step "$1" "$2.log" python3 -m optimum_amdx.cli.main benchmark --model "$3" --backends rocm --quantization "$4" \
    --batch-sizes 1,16,64 --prompt-lengths 512 --new-tokens 64 --warmup 1 --repeats 3 --measure-ceilings -o "$dir/run"
  [ -f "$dir/run/results.json" ] && cp "$dir/run/results.json" "$out/$2.json"
  [ -f "$dir/run/table.txt" ] && cat "$dir/run/table.txt" >> "$out/$2.log"
  rm -rf "$dir"
}
nvidia-smi -L > "$out/device.txt" 2>&1
python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())" >> "$out/device.txt" 2>&1
case "${1:-}" in
  verify)
    step 330 gputests.log python3 -m pytest -q -p no:cacheprovider -m gpu -x \
      tests/kernels/test_w4a16_pipelined.py tests/kernels/test_w4a16_stream.py \
      tests/kernels/test_w4a16.py tests/kernels/test_norm_rotary.py tests/kernels/test_paged_attention.py \
      tests/kernels/test_decode_fusions.py tests/quantization/test_gpu.py tests/modeling/test_gpu.py
    step 200 fixed-cost.log python3 benchmarks/bench_w4a16_gemv.py --fixed-cost --out "$out/w4a16-fixed-cost.json" ;;
  decode)
    step 560 decode-step.log python3 benchmarks/decode_step.py --shapes llama-3-8b \
      --quantizations gptq-4bit,gptq-4bit-act-order --act-order-hoist on,off --batch-sizes 1,16,64 \
      --variants +skinny_gemm --profile --out "$out/decode-step-gptq-act-order.json" ;;
  e2e-l3)
    bench 560 benchmark-llama3-8b llama-3-8b none,gptq-4bit,gptq-4bit-lm-head ;;
  e2e-l2)
    bench 560 benchmark-llama2-7b llama-2-7b none,gptq-4bit ;;
  m1)
    step 300 m1.log python3 benchmarks/bench_w4a16.py --m1-only --read-floor --no-peers --out "$out/w4a16-m1.json"
    step 250 gemv-sweep.log python3 benchmarks/bench_w4a16_gemv.py --out "$out/w4a16-gemv.json" ;;
  pdl)
    step 240 gputests.log python3 -m pytest -q -p no:cacheprovider -m gpu -x tests/kernels/test_w4a16_stream.py \
      tests/kernels/test_decode_fusions.py tests/kernels/test_paged_attention.py \
      tests/kernels/test_norm_rotary.py tests/modeling/test_gpu.py
    step 400 decode-step.log python3 benchmarks/decode_step.py --shapes llama-2-7b,llama-3-8b \
      --quantizations none,gptq-4bit --batch-sizes 1,4,16,64 --variants +skinny_gemm --pdl off,on \
      --out "$out/decode-step-pdl.json" ;;
  attn)
    step 500 attention-sweep.log python3 benchmarks/attention_decode_sweep.py --grid \
      --shapes llama-3-8b:1,llama-3-8b:16,llama-3-8b:64,llama-2-7b:16,llama-2-7b:64 --out "$out/attention-decode-sweep.json" ;;
  prefill)
    step 400 prefill.log python3 benchmarks/bench_w4a16_prefill.py --rows 512,1024,2048 --fused \
      --pipelined "HALF_DEQ=1;BLOCK_M=128:HALF_DEQ=1;BLOCK_M=128:num_warps=4:HALF_DEQ=1;BLOCK_M=128:BLOCK_N=64:num_warps=4:HALF_DEQ=1" \
      --out "$out/w4a16-prefill.json" ;;
  attncfg)
    step 420 attention-configs.log python3 benchmarks/attention_decode_sweep.py \
      --shapes llama-3-8b:16,llama-3-8b:64,llama-2-7b:16,llama-2-7b:64,llama-3-8b:1,llama-3-8b:4 \
      --configs "maxnreg=128;maxnreg=128:num_stages=1;maxnreg=96;BLOCK_N=32:maxnreg=128;num_stages=3:maxnreg=128" \
      --splits 1,2,3,4,6,8,16 --out "$out/attention-configs.json" ;;
  peers)
    gemlite=""
    if [ -z "${GEMLITE_PATH:-}" ]; then
      echo "GEMLITE_PATH not set: GemLite is left out of the peers table" | tee -a "$out/peers.log"
    elif [ -d "$GEMLITE_PATH/gemlite" ]; then
      gemlite=$(cd "$GEMLITE_PATH" && pwd)
    else
      echo "GEMLITE_PATH=$GEMLITE_PATH holds no gemlite/ package folder: GemLite is left out" | tee -a "$out/peers.log"
    fi
    step 330 peers.log env PYTHONPATH="${gemlite:+$gemlite:}$PYTHONPATH" python3 benchmarks/bench_w4a16.py --skip-m1 \
      --batch-ms 1,2,4,16,32,64 --out "$out/w4a16-peers.json"
    step 200 rows128-512.log python3 benchmarks/bench_w4a16.py --skip-m1 --no-peers --batch-ms 128,255,256,512 \
      --out "$out/w4a16-rows128-512.json" ;;
  rows16)  # the accumulating form (no split-K flush), each call twice; ncu writes its report whole to ncu-rows16.txt
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    step 240 ncu-rows16.log "$ncu" --clock-control none -k regex:w4a16 --log-file "$out/ncu-rows16.txt" \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section WarpStateStats \
      --section SchedulerStats --section LaunchStats \
      python3 benchmarks/profile_w4a16.py --accumulate 16x4096x12288 16x4096x4096 16x4096x22016 16x11008x4096 ;;
  unroll)  # UNROLL=2 at 2 stages against the shipped rows16 (baseline first and last in the decode step)
    step 120 unroll-tests.log python3 -m pytest -q -x tests/kernels/test_w4a16_pipelined.py -k unroll
    step 150 unroll-calls.log python3 benchmarks/bench_w4a16_rows_accumulate.py --rows 4,16 --configs base,unroll2,unroll2_st3 \
      --repeat 3 --out "$out/unroll-calls.json"
    step 240 unroll-decode.log python3 benchmarks/decode_step.py --shapes llama-2-7b,llama-3-8b --dtypes fp16 \
      --quantizations gptq-4bit --batch-sizes 4,16 --variants +skinny_gemm --w4a16-knob UNROLL+num_stages=1+3,2+2,1+3 \
      --out "$out/unroll-decode.json" ;;
esac
echo "gpu_pending.sh ${1}: $([ $status -eq 0 ] && echo all steps passed || echo some steps failed), files in $out"
exit $status
