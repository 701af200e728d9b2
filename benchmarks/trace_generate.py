"""Where the time to first token goes: a host-and-device timeline of single `generate()` calls.

The harness's TTFT (`optimum-amdx benchmark`) is host time from a synchronized start to the moment
the host holds every first token. This script loads the model the same way (`RocmBackend`), warms
up, then:

- times `--calls` generate() calls as the harness does, and beside each one the Python garbage
  collector's pauses inside it (`gc.callbacks`), so a collector pause can be told from GPU work;
- profiles one more call (torch profiler, CPU and device activity) and splits its TTFT window into:
  host time before the first kernel starts, device-busy time (the union of kernel intervals),
  device-idle gaps (the largest ones with the host calls that overlap them), and the runtime API
  calls that can stall a stream (allocations, frees, synchronizations) with their counts and time.

Prints the tables and writes JSON (`--out`); `--trace` also saves the Chrome trace. Reuses the
benchmark package's backend, timing and model builders, so what it measures is what the harness runs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
import time
from typing import Any

import torch

from optimum_amdx.benchmark import harness
from optimum_amdx.benchmark.backends import LoadSizes, get_backend, resolve_source
from optimum_amdx.benchmark.timing import Clock, make_token_timer, split_timings
from optimum_amdx.io import result_path_or_exit, write_json

_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
_STALLERS = ("cudaMalloc", "cudaFree", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize",
             "cudaMemcpy", "cudaMemcpyAsync", "cudaHostAlloc", "cudaMallocHost", "cudaStreamWaitEvent",
             "cudaGraphLaunch", "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


class GcPauses:
    """Sums the garbage collector's pause time while active (via `gc.callbacks`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0
        self._t0 = 0.0
        gc.callbacks.append(self._hook)

    def _hook(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._t0
            self.count += 1

    def take(self) -> tuple[float, int]:
        out = (self.seconds, self.count)
        self.seconds, self.count = 0.0, 0
        return out


def _prompt(vocab: int, batch: int, length: int, seed: int) -> torch.Tensor:
    """A seeded random prompt drawn as the harness draws its own."""
    return harness._prompt(torch, torch.Generator().manual_seed(seed), vocab, batch, length, "cuda")[0]


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def analyze(trace: dict[str, Any], window_name: str) -> dict[str, Any]:
    """Split the `window_name` annotation's interval of a Chrome trace into host and device parts (us)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    window = next(e for e in events if e.get("name") == window_name and e.get("cat") == "user_annotation")
    w0, w1 = float(window["ts"]), float(window["ts"]) + float(window["dur"])
    kernels = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events
               if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and float(e["ts"]) < w1
               and float(e["ts"]) + float(e["dur"]) > w0]
    busy = _union([(max(a, w0), min(b, w1)) for a, b in kernels])
    gaps, cursor = [], w0
    for a, b in busy:
        if a > cursor:
            gaps.append((cursor, a))
        cursor = max(cursor, b)
    if cursor < w1:
        gaps.append((cursor, w1))
    host = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver", "cpu_op", "python_function")
            and float(e["ts"]) < w1 and float(e["ts"]) + float(e["dur"]) > w0]

    def overlapping(a: float, b: float) -> list[str]:
        hits = sorted((e for e in host if float(e["ts"]) < b and float(e["ts"]) + float(e["dur"]) > a
                       and float(e["dur"]) > 20), key=lambda e: -float(e["dur"]))
        return [f"{e['name']} ({float(e['dur']) / 1e3:.2f} ms)" for e in hits[:6]]

    runtime: dict[str, list[float]] = {}
    for e in host:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and any(e["name"].startswith(s) for s in _STALLERS):
            runtime.setdefault(e["name"], []).append(float(e["dur"]))
    top_gaps = sorted(gaps, key=lambda g: g[0] - g[1])[:8]
    return {
        "window_ms": (w1 - w0) / 1e3,
        "host_before_first_kernel_ms": ((busy[0][0] if busy else w1) - w0) / 1e3,
        "device_busy_ms": sum(b - a for a, b in busy) / 1e3,
        "device_idle_ms": sum(b - a for a, b in gaps) / 1e3,
        "kernels": len(kernels),
        "gaps": [{"at_ms": (a - w0) / 1e3, "ms": (b - a) / 1e3, "host": overlapping(a, b)} for a, b in top_gaps],
        "runtime_calls": {k: {"count": len(v), "ms": sum(v) / 1e3, "max_ms": max(v) / 1e3}
                          for k, v in sorted(runtime.items(), key=lambda kv: -sum(kv[1]))},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="llama-3-8b")
    p.add_argument("--dtype", default="fp16", choices=sorted(_DTYPES))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new-tokens", type=int, default=16)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--out", default=None)
    p.add_argument("--trace", default=None, help="also write the profiled call's Chrome trace here")
    args = p.parse_args()
    if args.out:
        result_path_or_exit(args.out)  # before the model loads; --out replaces only a result we wrote
    if args.trace:
        result_path_or_exit(args.trace, "--trace")
    if not torch.cuda.is_available():
        raise SystemExit("trace_generate.py needs a GPU (torch.cuda).")

    source = resolve_source(args.model)
    sizes = LoadSizes(max_batch=args.batch, max_prompt=args.prompt, max_total=args.prompt + args.new_tokens)
    runner = get_backend("rocm").load(source, _DTYPES[args.dtype], "none", "cuda", 0, sizes)
    vocab = source.config.vocab_size
    clock = Clock("cuda", host_marks=True)
    runner.generate(_prompt(vocab, args.batch, args.prompt, 1), None, args.new_tokens, make_token_timer(clock))
    clock.synchronize()

    pauses = GcPauses()
    calls = []
    for i in range(args.calls):
        ids = _prompt(vocab, args.batch, args.prompt, 100 + i)
        timer = make_token_timer(clock)
        clock.synchronize()
        pauses.take()
        start = clock.mark()
        runner.generate(ids, None, args.new_tokens, timer)
        end = clock.mark()
        t = split_timings(clock, start, timer.marks, end)
        gc_s, gc_n = pauses.take()
        calls.append({"ttft_ms": t["ttft_s"] * 1e3, "e2e_ms": t["e2e_s"] * 1e3, "gc_ms": gc_s * 1e3, "gc_runs": gc_n})
    print(f"{args.model} {args.dtype} batch {args.batch} prompt {args.prompt}: per call")
    print("| call | TTFT ms | e2e ms | GC pauses ms (runs) |\n|---|---|---|---|")
    for i, c in enumerate(calls):
        print(f"| {i} | {c['ttft_ms']:.2f} | {c['e2e_ms']:.2f} | {c['gc_ms']:.2f} ({c['gc_runs']}) |")

    ids = _prompt(vocab, args.batch, args.prompt, 999)
    window = torch.profiler.record_function("amdx::ttft")

    class FirstTokenEnds:
        def __init__(self) -> None:
            self.puts = 0

        def put(self, value: Any) -> None:
            self.puts += 1
            if self.puts == 2:
                window.__exit__(None, None, None)

        def end(self) -> None:
            pass

    clock.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        window.__enter__()
        runner.generate(ids, None, args.new_tokens, FirstTokenEnds())
        clock.synchronize()
    with tempfile.TemporaryDirectory() as tmp:  # --trace gets the trace whole, below (atomic, marked as ours)
        path = os.path.join(tmp, "trace.json") if args.trace else "/tmp/trace_generate.json"
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    if args.trace:  # a JSON-object Chrome trace: viewers take other top-level keys as metadata
        write_json(args.trace, trace, "--trace", indent=None)
    split = analyze(trace, "amdx::ttft")
    print(f"\nprofiled call (profiler overhead included): TTFT window {split['window_ms']:.2f} ms, host before the "
          f"first kernel {split['host_before_first_kernel_ms']:.2f} ms, device busy {split['device_busy_ms']:.2f} ms "
          f"over {split['kernels']} kernels, device idle {split['device_idle_ms']:.2f} ms")
    print("| gap at ms | idle ms | host calls overlapping it |\n|---|---|---|")
    for g in split["gaps"]:
        print(f"| {g['at_ms']:.2f} | {g['ms']:.2f} | {'; '.join(g['host'])} |")
    print("| runtime call | count | total ms | max ms |\n|---|---|---|---|")
    for name, r in split["runtime_calls"].items():
        print(f"| {name} | {r['count']} | {r['ms']:.2f} | {r['max_ms']:.3f} |")
    result = {"model": args.model, "dtype": args.dtype, "batch": args.batch, "prompt": args.prompt,
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": calls, "profiled": split}
    if args.out:
        write_json(args.out, result)
    runner.close()


if __name__ == "__main__":
    main()
