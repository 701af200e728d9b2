"""Where end-to-end decode time goes besides the step's graph: a device timeline of one generate() call.

The harness's TPOT (`optimum-amdx benchmark`) is host time per token, so it holds what runs around each
step's graph replay as well: the input upload, the pending-token patch, sampling, the token's copy back. This
script loads the model as the harness does (`RocmBackend`), times a few generate() calls (TTFT, mean and
median inter-token latency), then profiles one more (torch profiler) and, over the middle of its decode steps,
reports the device's busy and idle time, the largest idle gaps, and every kernel that runs at most about once a
step (the per-step work outside the layers: lm_head, argmax, copies, gathers). RESULTS.md round 19 found the
greedy argmax there (torch's, 37.7 us a step on an H100 for a 128256-token vocabulary). Writes JSON (--out).
Usage: python benchmarks/trace_decode.py --model llama-3-8b --quantization gptq-4bit [--batch 16] --out trace.json
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_generate import _prompt, _union  # noqa: E402

from optimum_amdx.benchmark.backends import LoadSizes, get_backend, resolve_source  # noqa: E402
from optimum_amdx.benchmark.timing import Clock, make_token_timer, split_timings  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--quantization", default="none")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--batch", type=int, default=1, help="sequences per generate() call, all of --prompt tokens")
    p.add_argument("--max-batch", type=int, default=None, help="the load's batch bound (default --batch; the "
                   "benchmark matrix loads once for its largest batch)")
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before the model loads; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("trace_decode.py needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    source = resolve_source(args.model)
    sizes = LoadSizes(max_batch=args.max_batch or args.batch, max_prompt=args.prompt,
                      max_total=args.prompt + args.new_tokens)
    runner = get_backend("rocm").load(source, torch.float16, args.quantization, "cuda", 0, sizes)
    vocab = source.config.vocab_size
    clock = Clock("cuda", host_marks=True)
    calls = []
    for i in range(args.calls + 1):  # the first call warms up (compiles, captures)
        timer = make_token_timer(clock)
        clock.synchronize()
        wall = time.time()  # to line the steps up with a clock log (`nvidia-smi -lms`) taken beside the run
        start = clock.mark()
        runner.generate(_prompt(vocab, args.batch, args.prompt, 100 + i), None, args.new_tokens, timer)
        t = split_timings(clock, start, timer.marks, clock.mark())
        itl = sorted(t["itl_s"])
        if i:
            calls.append({"ttft_ms": t["ttft_s"] * 1e3, "tpot_mean_ms": sum(itl) / len(itl) * 1e3,
                          "tpot_median_ms": itl[len(itl) // 2] * 1e3,
                          "itl_ms": [round(v * 1e3, 4) for v in t["itl_s"]],  # in step order
                          "wall_start_s": wall})
            slow = sorted(enumerate(calls[-1]["itl_ms"]), key=lambda kv: -kv[1])[:6]
            print(f"call {i}: TTFT {calls[-1]['ttft_ms']:.2f} ms, TPOT mean {calls[-1]['tpot_mean_ms']:.3f} "
                  f"median {calls[-1]['tpot_median_ms']:.3f} ms; slowest steps (index, ms) {slow}", flush=True)
    clock.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                            torch.profiler.ProfilerActivity.CUDA]) as prof:
        runner.generate(_prompt(vocab, args.batch, args.prompt, 7), None, args.new_tokens, None)
        clock.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    dev = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: e["ts"])
    a, b = dev[int(len(dev) * 0.3)]["ts"], dev[int(len(dev) * 0.9)]["ts"]  # past the prompt, before the end
    window = [e for e in dev if a <= e["ts"] < b]
    busy = _union([(e["ts"], e["ts"] + e["dur"]) for e in window])
    busy_us = sum(y - x for x, y in busy)
    gaps, cursor = [], a
    for x, y in busy:
        if x > cursor:
            gaps.append(x - cursor)
        cursor = max(cursor, y)
    count: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    for e in window:
        count[e["name"][:90]] += 1
        total[e["name"][:90]] += e["dur"]
    per_layer = max(count.values())  # a kernel of every layer runs layers x steps times
    per_step = {k: {"count": c, "us": total[k], "mean_us": total[k] / c} for k, c in count.items()
                if c <= per_layer // 16}
    top_gaps = [round(g, 1) for g in sorted(gaps, reverse=True)[:8]]
    print(f"decode window {(b - a) / 1e3:.3f} ms: device busy {busy_us / 1e3:.3f} ms, idle "
          f"{(b - a - busy_us) / 1e3:.3f} ms; largest gaps (us) {top_gaps}")
    print("| kernel (at most ~once a step) | count | total us | mean us |\n|---|---|---|---|")
    for k, r in sorted(per_step.items(), key=lambda kv: -kv[1]["us"]):
        print(f"| {k} | {r['count']} | {r['us']:.0f} | {r['mean_us']:.2f} |")
    result: dict[str, Any] = {"model": args.model, "quantization": args.quantization, "batch": args.batch,
                              "device": torch.cuda.get_device_name(),
                              "uuid": str(torch.cuda.get_device_properties(0).uuid), "calls": calls,
                              "window_us": b - a, "busy_us": busy_us, "gaps_us": sorted(gaps, reverse=True)[:50],
                              "per_step_kernels": per_step}
    if args.out:
        write_json(args.out, result)
    runner.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
