"""Prefill projections: could a second stream hide the GPTQ dequantization behind the BLAS GEMMs? (issue 13, TTFT)

At 512 prompt rows the GPTQ projections cost dequantization + BLAS (or the fused pipelined GEMM), about 1.4x
fp16 (RESULTS.md round 18). cuBLAS does not fill the GPU on every projection at 512 rows (q/k/v: 96 tiles of
128 x 256 on 132 SMs; o_proj 64) and leaves memory bandwidth spare, while the dequantization is memory-bound.
This script measures, for N layers of one model's four projections (q/k/v, o, gate/up, down; distinct weights
per layer so L2 stays cold), CUDA-graph-replayed, ms per layer:

- fp16: BLAS on dense fp16 weights (the floor the goal compares to);
- shipped: `w4a16_matmul` as the dispatcher routes it;
- serial: dequantize, then BLAS, one projection after the other;
- overlap_B: the dequantizations on a second stream, each allowed to start once the GEMM B projections back has
  finished (B dense buffers, as an engine would hold them; `overlap_all`: no limit), the GEMMs on the first
  stream each after its weight is ready (fork/join events inside the captured graph).

Prints a table and writes JSON. Usage: python benchmarks/bench_w4a16_prefill_overlap.py [--model llama-3-8b]
[--rows 512] [--layers 4] [--out F.json]
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_w4a16 import random_gptq  # noqa: E402

from optimum_amdx.benchmark.timing import device_ms  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels._w4a16_triton import dequantize_dense  # noqa: E402
from optimum_amdx.kernels.w4a16 import w4a16_matmul  # noqa: E402

PROJECTIONS = {  # model -> [(K, N)] of q/k/v, o_proj, gate/up, down
    "llama-3-8b": [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)],
    "llama-2-7b": [(4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)],
}


def _graph_ms(body: Callable[[], None]) -> float:
    """Median ms of one replay of `body` captured in a CUDA graph (warmed up once eagerly)."""
    body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        body()
    ms = device_ms(graph.replay, reps=20)
    del graph
    return ms


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3-8b", choices=sorted(PROJECTIONS))
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16_prefill_overlap needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    shapes = PROJECTIONS[args.model] * args.layers
    ws = [random_gptq(k, n, 128, False, seed=i)[0] for i, (k, n) in enumerate(shapes)]
    dense = [dequantize_dense(w, torch.float16) for w in ws]
    xs = {k: torch.randn(args.rows, k, device="cuda", dtype=torch.float16) for k, _ in shapes}
    keep: list[torch.Tensor] = []

    def fp16() -> None:
        for (k, _), d in zip(shapes, dense):
            keep.append(torch.nn.functional.linear(xs[k], d))

    def shipped() -> None:
        for (k, _), w in zip(shapes, ws):
            keep.append(w4a16_matmul(xs[k], w))

    def serial() -> None:
        for (k, _), w in zip(shapes, ws):
            keep.append(torch.nn.functional.linear(xs[k], dequantize_dense(w, torch.float16)))

    side = torch.cuda.Stream()

    def overlapped(buffers: int) -> Callable[[], None]:
        """Dequantization i on the side stream may start once GEMM i - buffers has finished (its buffer is free)."""
        def body() -> None:
            main_stream = torch.cuda.current_stream()
            side.wait_stream(main_stream)
            made: list[tuple[torch.Tensor, torch.cuda.Event]] = []
            done: list[torch.cuda.Event] = []
            for i in range(len(ws) + 1):
                if i < len(ws):
                    with torch.cuda.stream(side):
                        if i >= buffers:
                            side.wait_event(done[i - buffers])
                        d = dequantize_dense(ws[i], torch.float16)
                        event = torch.cuda.Event()
                        event.record(side)
                        made.append((d, event))
                if i >= 1:
                    d, event = made[i - 1]
                    main_stream.wait_event(event)
                    keep.append(torch.nn.functional.linear(xs[shapes[i - 1][0]], d))
                    finished = torch.cuda.Event()
                    finished.record(main_stream)
                    done.append(finished)
            main_stream.wait_stream(side)
            keep.extend(d for d, _ in made)
        return body

    result: dict[str, Any] = {"device": torch.cuda.get_device_name(),
                              "uuid": str(torch.cuda.get_device_properties(0).uuid), "model": args.model,
                              "rows": args.rows, "layers": args.layers}
    for name, body in (("fp16", fp16), ("shipped", shipped), ("serial", serial), ("overlap_2", overlapped(2)),
                       ("overlap_3", overlapped(3)), ("overlap_all", overlapped(len(ws))), ("fp16_again", fp16)):
        keep.clear()
        result[name + "_ms_per_layer"] = _graph_ms(body) / args.layers
        keep.clear()
        torch.cuda.empty_cache()
        print(f"{args.model} {args.rows} rows, {name}: {result[name + '_ms_per_layer'] * 1e3:.1f} us per layer",
              flush=True)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
