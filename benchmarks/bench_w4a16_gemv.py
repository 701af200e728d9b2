"""W4A16 at one row (issue 13, goal 1): the stream kernel's packed fp16 loop beside its float32 loop.

One run on the current GPU measures copy bandwidth, then for the seven Llama shapes, groups 128 and
32, with and without act-order: the shipped one-row config (packed fp16 loop on NVIDIA) and the
same config with the float32 loop (`PACKED=False`, what AMD runs and what shipped before), as time
and % of copy bandwidth (bytes = packed weights + scales + zeros + perm + x + out); then a sweep of
the packed loop's knobs (a register cap, which keeps ptxas from sinking the next tile's loads below
the math; warps; the next tile's constants loaded ahead; programs per SM) on eight shapes, the
Llama-3-8B decode shapes among them. Times are medians of CUDA-graph replays over enough weight
copies that L2 cannot hold them (the same helpers as bench_w4a16.py).
With --fixed-cost it instead takes the one-row call's fixed cost apart (RESULTS.md sections round8 and
round9: about 3.6 us of every g128 call besides streaming on an H100, 4.2 us on an H200): the
graph-replay cost of an empty kernel with the stream kernel's grid, then K swept from 128 to 8192 rows
on a 14336-wide g128 weight, once with the shipped grid (programs split column blocks: the
float32-atomic flush, the fence and the ticket) and once with one program per column block
(`programs` = N / 128: whole blocks, direct stores, no flush); a line fitted to each gives its
intercept, and the difference of the two intercepts is what the split-K flush costs.
Usage: python benchmarks/bench_w4a16_gemv.py --out gemv.json [--quick | --fixed-cost | --sweep-only [--sweep JSON]
[--sweep-shapes JSON]]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from typing import Any, Optional

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_w4a16 import LLAMA_SHAPES, call_bytes, ours_ms, random_gptq  # noqa: E402
from m1_cost_model import least_squares  # noqa: E402

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels._w4a16_triton import stream_config  # noqa: E402
from optimum_amdx.kernels.runtime import device_arch  # noqa: E402

SWEEP_SHAPES = [(4096, 14336, 128, False), (4096, 14336, 128, True), (4096, 14336, 32, True), (8192, 28672, 128, False),
                (4096, 4096, 128, False), (4096, 28672, 128, False), (14336, 4096, 128, False), (4096, 6144, 128, False)]
SWEEP = [{}, {"maxnreg": 72}, {"maxnreg": 96}, {"num_warps": 4}, {"LOOKAHEAD": True}, {"programs_per_cu": 3},
         {"XPREP": True}]


def _save(result: dict[str, Any], path: Optional[str]) -> None:
    """Written after every row, so a run cut short keeps what it measured."""
    if path:
        write_json(path, result)


def _pct(w: Any, ms: float, copy_bw: float) -> float:
    return 100 * call_bytes(w, 1) / (ms * 1e-3) / copy_bw


@triton.jit
def _touch(out_ptr):
    """The empty kernel of `fixed_cost`: one store per program."""
    tl.store(out_ptr + tl.program_id(0), 1.0)


FIXED_COST_N = 14336
FIXED_COST_KS = [128, 256, 512, 1024, 2048, 4096, 8192]


def fixed_cost(copy_bw: float, base: dict[str, Any]) -> dict[str, Any]:
    """The one-row fixed cost taken apart (see the module docstring); times in us."""
    from optimum_amdx.benchmark.timing import graph_ms
    from optimum_amdx.kernels.runtime import compute_units

    sms = compute_units(torch.device("cuda"))
    grid = 4 * sms  # the shipped 8-warp one-row grid: 4 resident programs per SM
    sink = torch.empty(grid, device="cuda")
    empty_us = 1e3 * graph_ms([lambda: _touch[(grid,)](sink, num_warps=8)] * 64)
    out: dict[str, Any] = {"empty_kernel_us": empty_us, "grid": grid, "N": FIXED_COST_N, "rows": []}
    print(f"fixed cost: empty kernel of {grid} programs, graph-replayed: {empty_us:.2f} us", flush=True)
    nb = FIXED_COST_N // 128
    for k in FIXED_COST_KS:
        w, _ = random_gptq(k, FIXED_COST_N, 128, False, seed=k)
        tiles = (k // 128) * nb
        split_us = ours_ms(w, 1, dict(base)) * 1e3
        whole_us = ours_ms(w, 1, dict(base, programs=nb)) * 1e3
        row = {"K": k, "tiles": tiles, "split_us": split_us, "tiles_per_program_split": tiles / min(grid, tiles),
               "whole_blocks_us": whole_us, "tiles_per_program_whole": k // 128,
               "pct_copy_split": _pct(w, split_us * 1e-3, copy_bw)}
        out["rows"].append(row)
        print(f"  K={k:5d}: split grid {split_us:6.2f} us ({row['tiles_per_program_split']:.2f} tiles/program), "
              f"one program per column block {whole_us:6.2f} us ({k // 128} tiles/program)", flush=True)
        del w
    split = least_squares([(r["tiles_per_program_split"], r["split_us"]) for r in out["rows"] if r["tiles"] >= grid])
    whole = least_squares([(r["tiles_per_program_whole"], r["whole_blocks_us"]) for r in out["rows"]])
    out["fit"] = {"split_fixed_us": split[0], "split_per_tile_us": split[1], "whole_fixed_us": whole[0],
                  "whole_per_tile_us": whole[1], "flush_us": split[0] - whole[0],
                  "rest_us": whole[0] - empty_us}
    print(f"fixed cost: split grid {split[0]:.2f} us + {split[1]:.3f} us/tile; whole blocks {whole[0]:.2f} us + "
          f"{whole[1]:.3f} us/tile; so the flush costs {split[0] - whole[0]:.2f} us, the launch {empty_us:.2f} us "
          f"and the rest (first loads, tail) {whole[0] - empty_us:.2f} us", flush=True)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write results as JSON here")
    parser.add_argument("--quick", action="store_true", help="three shapes, no sweep")
    parser.add_argument("--no-sweep", action="store_true", help="skip the knob sweep")
    parser.add_argument("--sweep-only", action="store_true", help="only the knob sweep (no seven-shape table)")
    parser.add_argument("--fixed-cost", action="store_true", help="only take the one-row fixed cost apart")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16",
                        help="activations of the knob sweep (bf16: the packed loop scales each K tile's x into fp16)")
    parser.add_argument("--sweep", help="the knob sweep's configs as a JSON list of dicts merged over the shipped "
                        "one-row config (default: the built-in list); e.g. '[{}, {\"maxnreg\": 48}]'")
    parser.add_argument("--sweep-shapes", help="the knob sweep's weights as a JSON list of [K, N, group, act_order] "
                        "(default: the built-in eight); e.g. '[[4096, 4096, 128, true]]'")
    args = parser.parse_args(argv)
    sweep = SWEEP
    sweep_shapes = SWEEP_SHAPES
    if args.sweep_shapes:
        try:
            sweep_shapes = [tuple(s) for s in json.loads(args.sweep_shapes)]
        except (json.JSONDecodeError, TypeError) as exc:
            parser.error(f"--sweep-shapes is not a JSON list of lists ({exc}); e.g. '[[4096, 4096, 128, true]]'")
        if not sweep_shapes or not all(len(s) == 4 and all(isinstance(v, int) for v in s[:3]) for s in sweep_shapes):
            parser.error("--sweep-shapes takes [K, N, group, act_order] per weight, e.g. '[[4096, 4096, 128, true]]'")
    if args.sweep:
        try:
            sweep = json.loads(args.sweep)
        except json.JSONDecodeError as exc:
            parser.error(f"--sweep is not JSON ({exc}); pass a list of dicts such as '[{{}}, {{\"maxnreg\": 48}}]'")
        if not isinstance(sweep, list) or not all(isinstance(c, dict) for c in sweep):
            parser.error("--sweep takes a JSON list of dicts, e.g. '[{}, {\"num_warps\": 4}]'")
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16_gemv needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    copy_bw = measure_copy_bandwidth("cuda")
    arch = device_arch()
    base = stream_config(arch, 1)
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "arch": arch, "torch": torch.__version__,
                              "copy_GB_s": copy_bw / 1e9, "config": base, "m1": [], "sweep": []}
    print(f"device {result['device']} ({arch}); copy {copy_bw / 1e9:.0f} GB/s; config {base}", flush=True)
    if args.fixed_cost:
        result["fixed_cost"] = fixed_cost(copy_bw, base)
        _save(result, args.out)
        return 0
    shapes = [] if args.sweep_only else LLAMA_SHAPES[:3] if args.quick else LLAMA_SHAPES
    for (k, n), group, act in itertools.product(shapes, (128, 32), (False, True)):
        w, _ = random_gptq(k, n, group, act, seed=k + n + group + int(act), asym=act)
        row = {"K": k, "N": n, "group": group, "act_order": act, "asym": act,
               "floor_us": call_bytes(w, 1) / copy_bw * 1e6}
        for name, cfg in (("packed", dict(base)), ("fp32", dict(base, PACKED=False))):
            ms = ours_ms(w, 1, cfg)
            row[f"{name}_us"] = ms * 1e3
            row[f"{name}_pct"] = _pct(w, ms, copy_bw)
        result["m1"].append(row)
        _save(result, args.out)
        print(f"  M=1 {k:>5}x{n:<5} g{group:<3} act={int(act)} floor {row['floor_us']:5.1f} us | fp32 loop "
              f"{row['fp32_us']:6.1f} us {row['fp32_pct']:5.1f}% | packed {row['packed_us']:6.1f} us "
              f"{row['packed_pct']:5.1f}%", flush=True)
        del w
    if not (args.quick or args.no_sweep):
        for k, n, group, act in sweep_shapes:
            w, _ = random_gptq(k, n, group, act, seed=k + n + group + int(act), asym=act)
            for extra in sweep:
                cfg = dict(base, **extra)
                try:
                    ms = ours_ms(w, 1, cfg, dtype=torch.float16 if args.dtype == "fp16" else torch.bfloat16)
                except Exception as exc:  # noqa: BLE001 - a failing config is recorded, not fatal
                    result["sweep"].append({"K": k, "N": n, "group": group, "act_order": act, "extra": extra,
                                            "error": str(exc)[:200]})
                    print(f"  sweep {k}x{n} g{group} act={int(act)} {extra}: error {str(exc)[:120]}", flush=True)
                    continue
                result["sweep"].append({"K": k, "N": n, "group": group, "act_order": act, "extra": extra,
                                        "dtype": args.dtype, "us": ms * 1e3, "pct": _pct(w, ms, copy_bw)})
                _save(result, args.out)
                print(f"  sweep {k}x{n} g{group} act={int(act)} {extra}: {ms * 1e3:.1f} us "
                      f"({_pct(w, ms, copy_bw):.1f}%)", flush=True)
            del w
    print(f"\nM=1, {result['device']}, copy {copy_bw / 1e9:.0f} GB/s: us (% of copy bandwidth), float32 loop -> packed")
    print(f"{'K x N':>12} | {'g128':>22} | {'g128 act,asym':>22} | {'g32':>22} | {'g32 act,asym':>22}")
    for k, n in shapes:
        cells = {(r["group"], r["act_order"]): r for r in result["m1"] if (r["K"], r["N"]) == (k, n)}
        line = f"{k:>5}x{n:<6}"
        for key in ((128, False), (128, True), (32, False), (32, True)):
            r = cells[key]
            line += f" | {r['fp32_us']:5.1f} ({r['fp32_pct']:4.1f}) -> {r['packed_us']:5.1f} ({r['packed_pct']:4.1f})"
        print(line)
    _save(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
