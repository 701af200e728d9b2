"""Decode attention at the shapes of the decode step: % of copy bandwidth on the K/V it must read, and
which tile config / key split would do better.

For each `shape:batch` (Llama-3-8B: 32 query / 8 KV heads; Llama-2-7B: 32 / 32; head_dim 128), a paged
cache of `--context` tokens per sequence in shuffled 16-token blocks, one query token per sequence,
as a decode step has. One cache per layer, rotated over enough layers (<= 32) that L2 cannot serve
the K/V, and the launches replayed from one captured graph (the way the step runs them). Times: the
shipped choice (`unified_attention`, its config and split rule) and a grid of configs and splits
(`--grid`). `--eager-default` only runs the shipped choice eagerly a few times (for ncu).

Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch

SHAPES = {"llama-3-8b": (32, 8), "llama-2-7b": (32, 32)}
HEAD_DIM = 128


def make_layers(batch: int, ctx: int, heads: int, kv_heads: int, layers: int, dtype: torch.dtype) -> list[dict]:
    blocks = math.ceil(ctx / 16)
    out = []
    for _ in range(layers):
        shape = (batch * blocks, 16, kv_heads, HEAD_DIM)
        out.append({
            "q": torch.randn(batch, heads, HEAD_DIM, device="cuda", dtype=dtype),
            "k_cache": torch.randn(shape, device="cuda", dtype=dtype),
            "v_cache": torch.randn(shape, device="cuda", dtype=dtype),
            "block_tables": torch.randperm(batch * blocks, device="cuda", dtype=torch.int32).view(batch, blocks),
            "seq_lens": torch.full((batch,), ctx, device="cuda", dtype=torch.int32),
            "query_start_loc": torch.arange(batch + 1, device="cuda", dtype=torch.int32),
        })
    return out


def grid(batch: int, kv_heads: int, sms: int) -> list[tuple[dict[str, Any], int]]:
    few = batch * kv_heads < sms
    tiles = [(64, 4, 2), (128, 4, 2), (64, 4, 3), (128, 4, 3), (64, 8, 2), (128, 8, 2), (32, 4, 2), (64, 4, 1)]
    splits = (4, 8, 16, 32) if few else (1, 2)
    if few:
        tiles = tiles[:2] + [(32, 4, 2), (32, 4, 3)]
    return [({"BLOCK_M": 16, "BLOCK_N": n, "num_warps": w, "num_stages": s}, sp) for n, w, s in tiles for sp in splits]


def main(argv: list[str] | None = None) -> int:
    from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth
    from optimum_amdx.benchmark.timing import graph_ms
    from optimum_amdx.kernels._paged_attention_triton import unified_attention_triton
    from optimum_amdx.kernels.paged_attention import unified_attention
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama-2-7b:16,llama-3-8b:64,llama-3-8b:16,llama-3-8b:1")
    p.add_argument("--context", type=int, default=513)
    p.add_argument("--grid", action="store_true")
    p.add_argument("--eager-default", action="store_true")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    dtype = torch.float16
    family = arch_family(device_arch())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = measure_copy_bandwidth("cuda")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "copy_TBps": bw / 1e12,
                              "context": args.context, "rows": []}
    print(f"{result['device']}: copy {bw / 1e12:.2f} TB/s", flush=True)
    for spec in args.shapes.split(","):
        shape, batch = spec.split(":")
        batch = int(batch)
        heads, kv_heads = SHAPES[shape]
        kv = 2 * batch * args.context * kv_heads * HEAD_DIM * 2
        layers = 2 if args.eager_default else min(32, max(2, math.ceil(400e6 / kv)))
        data = make_layers(batch, args.context, heads, kv_heads, layers, dtype)
        outs = [torch.empty_like(d["q"]) for d in data]
        if args.eager_default:
            for d, o in zip(data, outs):
                unified_attention(**d, max_query_len=1, max_seq_len=args.context, out=o)
            torch.cuda.synchronize()
            continue

        def calls(cfg=None, splits=None):
            if cfg is None:
                return [lambda d=d, o=o: unified_attention(**d, max_query_len=1, max_seq_len=args.context, out=o)
                        for d, o in zip(data, outs)]
            return [lambda d=d, o=o: unified_attention_triton(
                d["q"], d["k_cache"], d["v_cache"], d["block_tables"], d["seq_lens"], d["query_start_loc"], 1,
                args.context, None, None, o, splits, family, cfg) for d, o in zip(data, outs)]

        def record(label, ms, cfg=None, splits=None):
            row = {"shape": shape, "batch": batch, "kernel": label, "us": ms * 1e3, "kv_bytes": kv,
                   "floor_us": kv / bw * 1e6, "pct_copy_bw": 100 * kv / bw / (ms * 1e-3), "config": cfg,
                   "splits": splits}
            result["rows"].append(row)
            print(f"{shape} b={batch:3d} {label:8s} {row['us']:7.1f} us  floor {row['floor_us']:6.1f} us  "
                  f"{row['pct_copy_bw']:5.1f}% of copy bw  {cfg or ''} splits={splits}", flush=True)
            return row

        best = record("default", graph_ms(calls()))
        if args.grid:
            for cfg, splits in grid(batch, kv_heads, sms):
                try:
                    row = record("grid", graph_ms(calls(cfg, splits), reps=10), cfg, splits)
                except Exception as exc:  # noqa: BLE001 - a config that does not fit this GPU's shared memory
                    print(f"  skip {cfg} splits={splits}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                    continue
                best = row if row["us"] < best["us"] else best
            print(f"BEST {shape} b={batch}: {best['us']:.1f} us ({best['pct_copy_bw']:.1f}%) {best['config']} "
                  f"splits={best['splits']}", flush=True)
        data = outs = None  # free this shape's caches before the next
        torch.cuda.empty_cache()
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
