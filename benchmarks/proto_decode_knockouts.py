"""Prototype (issue 13, batch-1 decode): what each kernel family costs the graph-replayed decode step, by leaving it out.

The GPTQ step on an H200 runs 10 kernels a layer (RMSNorm, q/k/v, rotary + cache, attention, split reduce, o,
RMSNorm, gate/up, SiLU * up, down). Fusing two of them saves a kernel boundary (the wait for the kernel before, the
ramp, the drain), not the fused kernel's own work. Before writing a fusion this script bounds what it could buy: it
captures the step with one family *knocked out*, its call replaced by the tensor its first (warm-up) call returned,
so nothing of it runs in the graph and every other kernel reads the same shapes. The step's result is then wrong, and
only its time is used. The saving of a knockout is the most a fusion that removes that kernel could win (the work
itself would move, not vanish).

Knockouts: ``silu`` (SiLU * up), ``rope`` (rotary + cache), ``norm`` (every RMSNorm), ``attn`` (attention and its
split reduce), ``w4a16`` (every accumulating W4A16 call, the GPTQ projections). Each is timed beside the full step in
the same run, PDL as shipped.

Usage: python benchmarks/proto_decode_knockouts.py [--shapes llama-3-8b,llama-2-7b] [--quantizations none,gptq-4bit]
       [--batch-sizes 1,16] [--knockouts silu,rope,norm,attn,w4a16] [--out F.json]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
from typing import Any, Callable, Iterator

import torch

from optimum_amdx.benchmark.timing import call_seconds
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels import w4a16 as w4a16_mod
from optimum_amdx.modeling import paged_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from decode_step import VARIANTS, StepBench  # noqa: E402

KNOCKOUTS: dict[str, tuple[Any, str]] = {
    "silu": (paged_model, "silu_and_mul"),
    "rope": (paged_model, "rotary_and_cache_accumulated"),
    "norm": (paged_model, "rms_norm"),
    "attn": (paged_model, "unified_attention"),
    "w4a16": (w4a16_mod, "w4a16_accumulate"),
}
"""Knockout name -> (module, function) whose calls the step's graph leaves out."""


def _key(args: tuple, kwargs: dict) -> tuple:
    """The shapes and dtypes of a call's tensors (plus its other arguments' types): calls with one key return one
    stand-in."""
    def part(v: Any) -> Any:
        return (tuple(v.shape), v.dtype) if isinstance(v, torch.Tensor) else type(v).__name__
    return tuple(part(a) for a in args) + tuple((k, part(v)) for k, v in sorted(kwargs.items()))


@contextlib.contextmanager
def knocked_out(name: str | None) -> Iterator[None]:
    """Within the block, the knockout's function runs once per call key (the runner's eager warm-up) and every later
    call returns that result without running: the captured graph holds none of its kernels."""
    if name is None:
        yield
        return
    module, attr = KNOCKOUTS[name]
    real: Callable = getattr(module, attr)
    seen: dict[tuple, Any] = {}

    def standin(*args: Any, **kwargs: Any) -> Any:
        key = _key(args, kwargs)
        if key not in seen:
            seen[key] = real(*args, **kwargs)
        return seen[key]

    setattr(module, attr, standin)
    try:
        yield
    finally:
        setattr(module, attr, real)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama-3-8b,llama-2-7b")
    p.add_argument("--quantizations", default="none,gptq-4bit")
    p.add_argument("--batch-sizes", default="1,16")
    p.add_argument("--knockouts", default=",".join(KNOCKOUTS))
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--max-model-len", type=int, default=576)
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    knockouts = [k for k in args.knockouts.split(",") if k]
    if set(knockouts) - set(KNOCKOUTS):
        raise SystemExit(f"error: --knockouts takes {', '.join(KNOCKOUTS)}; got {args.knockouts!r}")
    if args.out:
        result_path_or_exit(args.out)
    batches = [int(b) for b in args.batch_sizes.split(",")]
    rows = []
    for shape in args.shapes.split(","):
        for quant in args.quantizations.split(","):
            bench = StepBench(shape, torch.float16, max(batches), args.context, args.max_model_len, 16, 0, quant)
            for ko in [None] + [k for k in knockouts if quant != "none" or k != "w4a16"]:
                with knocked_out(ko):
                    runner = bench.runner(VARIANTS["+skinny_gemm"], batches)
                for b in batches:
                    g = bench.load_decode(runner, b)
                    t = call_seconds(g.graph.replay, "cuda", reps=5, warmup=1, calls_per_mark=20)
                    rows.append({"shape": shape, "quantization": quant, "knockout": ko or "none", "batch": b,
                                 "step_ms": t * 1e3})
                    base = next(r["step_ms"] for r in rows if r["shape"] == shape and r["quantization"] == quant
                                and r["batch"] == b and r["knockout"] == "none")
                    rows[-1]["saved_us_per_layer"] = (base - t * 1e3) * 1e3 / bench.geom.num_layers
                    print(f"{shape} {quant:9s} b={b:3d} knockout {ko or 'none':6s}: step {t * 1e3:.3f} ms, saved "
                          f"{rows[-1]['saved_us_per_layer']:.2f} us a layer", flush=True)
                del runner
                gc.collect()
                torch.cuda.empty_cache()
            del bench
            gc.collect()
            torch.cuda.empty_cache()
    print("\n| shape | quantization | batch | knockout | step ms | saved us / layer |\n|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['quantization']} | {r['batch']} | {r['knockout']} | {r['step_ms']:.3f} | "
              f"{r['saved_us_per_layer']:.2f} |")
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "context": args.context, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
