"""Decode (and, with `--prefill P`, prompt) attention at the shapes of the engine's steps: how far from
its floor, and which tile config / key split would do better.

For each `shape:batch` (Llama-3-8B: 32 query / 8 KV heads; Llama-2-7B: 32 / 32; head_dim 128), a paged
cache of `--context` tokens per sequence in shuffled 16-token blocks, one query token per sequence,
as a decode step has. One cache per layer, rotated over enough layers (<= 32) that L2 cannot serve
the K/V, and the launches replayed from one captured graph (the way the step runs them). Times: the
shipped choice (`unified_attention`, its config and split rule) and a grid of configs and splits
(`--grid`). `--eager-default` only runs the shipped choice eagerly a few times (for ncu).

`--prefill P`: each sequence is one P-token prompt (P query tokens, no earlier context), as a prefill
step has; the floor is then its causal FLOPs at the measured matmul rate, and torch's SDPA (flash
backend, same heads, no paging) is timed beside it as the reference a dense-cache kernel reaches.

`--runs`: also the shipped choice with each sequence's blocks laid out as one ascending run and
`first_pages` given (the kernel computes block ids instead of loading them from the table; the engine's
one-slot prefill graphs), beside the same run layout read through the table.

Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import itertools
import math
from typing import Any

import torch

SHAPES = {"llama-3-8b": (32, 8), "llama-2-7b": (32, 32)}
HEAD_DIM = 128


def make_layers(batch: int, ctx: int, heads: int, kv_heads: int, layers: int, dtype: torch.dtype,
                q_len: int = 1) -> list[dict]:
    """Per layer: a shuffled paged cache of `ctx` tokens per sequence and `q_len` query tokens per sequence
    (the last `q_len` positions of its context)."""
    blocks = math.ceil(ctx / 16)
    out = []
    for _ in range(layers):
        shape = (batch * blocks, 16, kv_heads, HEAD_DIM)
        out.append({
            "q": torch.randn(batch * q_len, heads, HEAD_DIM, device="cuda", dtype=dtype),
            "k_cache": torch.randn(shape, device="cuda", dtype=dtype),
            "v_cache": torch.randn(shape, device="cuda", dtype=dtype),
            "block_tables": torch.randperm(batch * blocks, device="cuda", dtype=torch.int32).view(batch, blocks),
            "seq_lens": torch.full((batch,), ctx, device="cuda", dtype=torch.int32),
            "query_start_loc": torch.arange(batch + 1, device="cuda", dtype=torch.int32) * q_len,
        })
    return out


def prefill_grid(num_qpk: int) -> list[tuple[dict[str, Any], int]]:
    """Prompt-step tiles: M rows (query tokens x the query heads of one KV head), key tile, warps, stages."""
    cfgs = []
    for bm, bn, warps, stages in itertools.product((64, 128, 256), (32, 64, 128), (4, 8), (2, 3)):
        if bm < num_qpk or (bm == 256 and bn == 128) or (bm == 256 and warps == 4):
            continue
        cfgs.append(({"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}, 1))
    return cfgs


def grid(batch: int, kv_heads: int, sms: int) -> list[tuple[dict[str, Any], int]]:
    few = batch * kv_heads < sms
    tiles = [(64, 4, 2), (128, 4, 2), (64, 4, 3), (128, 4, 3), (64, 8, 2), (128, 8, 2), (32, 4, 2), (64, 4, 1)]
    splits = (4, 8, 16, 32) if few else (1, 2)
    if few:
        tiles = tiles[:2] + [(32, 4, 2), (32, 4, 3)]
    return [({"BLOCK_M": 16, "BLOCK_N": n, "num_warps": w, "num_stages": s}, sp) for n, w, s in tiles for sp in splits]


def main(argv: list[str] | None = None) -> int:
    from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
    from optimum_amdx.benchmark.timing import graph_ms
    from optimum_amdx.io import result_path_or_exit, write_json
    from optimum_amdx.kernels._paged_attention_triton import unified_attention_triton, unified_config
    from optimum_amdx.kernels.paged_attention import unified_attention
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="llama-2-7b:16,llama-3-8b:64,llama-3-8b:16,llama-3-8b:1")
    p.add_argument("--context", type=int, default=513)
    p.add_argument("--grid", action="store_true")
    p.add_argument("--eager-default", action="store_true")
    p.add_argument("--prefill", type=int, default=0, metavar="P",
                   help="P-token prompts instead of one-token decode (the floor is then FLOPs; SDPA beside)")
    p.add_argument("--configs", default="", help="instead of the grid: overrides of the shipped decode config, "
                   "K=V:K=V;K=V (e.g. maxnreg=128;BLOCK_N=32:maxnreg=128), each at every --splits count")
    p.add_argument("--splits", default="", help="with --configs: split counts, comma-separated (default: the grid's)")
    p.add_argument("--runs", action="store_true",
                   help="also time blocks laid out as runs, through the table and with first_pages")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    dtype = torch.float16
    family = arch_family(device_arch())
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bw = measure_copy_bandwidth("cuda")
    q_len = args.prefill or 1
    ctx = args.prefill or args.context
    rate = measure_matmul_flops("cuda") if args.prefill else None
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(0), "copy_TBps": bw / 1e12,
                              "matmul_TFps": rate / 1e12 if rate else None, "context": ctx, "query_len": q_len,
                              "rows": []}
    print(f"{result['device']}: copy {bw / 1e12:.2f} TB/s" + (f", matmul {rate / 1e12:.0f} TF/s" if rate else ""),
          flush=True)
    for spec in args.shapes.split(","):
        shape, batch = spec.split(":")
        batch = int(batch)
        heads, kv_heads = SHAPES[shape]
        kv = 2 * batch * ctx * kv_heads * HEAD_DIM * 2
        # causal QK^T and PV over the prompt: 4 * D FLOPs per visible (query, key) pair and query head
        flops = 4 * HEAD_DIM * heads * batch * (q_len * (q_len + 1) // 2 + q_len * (ctx - q_len))
        floor_s = flops / rate if args.prefill else kv / bw
        layers = 2 if args.eager_default else min(32, max(2, math.ceil(400e6 / kv)))
        data = make_layers(batch, ctx, heads, kv_heads, layers, dtype, q_len)
        outs = [torch.empty_like(d["q"]) for d in data]
        if args.eager_default:
            for d, o in zip(data, outs):
                unified_attention(**d, max_query_len=q_len, max_seq_len=ctx, out=o)
            torch.cuda.synchronize()
            continue

        def calls(cfg=None, splits=None):
            if cfg is None:
                return [lambda d=d, o=o: unified_attention(**d, max_query_len=q_len, max_seq_len=ctx, out=o)
                        for d, o in zip(data, outs)]
            return [lambda d=d, o=o: unified_attention_triton(
                d["q"], d["k_cache"], d["v_cache"], d["block_tables"], d["seq_lens"], d["query_start_loc"], q_len,
                ctx, None, None, o, splits, family, cfg) for d, o in zip(data, outs)]

        def record(label, ms, cfg=None, splits=None):
            row = {"shape": shape, "batch": batch, "kernel": label, "us": ms * 1e3, "kv_bytes": kv,
                   "flops": flops, "floor_us": floor_s * 1e6, "pct_floor": 100 * floor_s / (ms * 1e-3),
                   "pct_copy_bw": 100 * kv / bw / (ms * 1e-3), "config": cfg, "splits": splits}
            result["rows"].append(row)
            print(f"{shape} b={batch:3d} {label:8s} {row['us']:7.1f} us  floor {row['floor_us']:6.1f} us  "
                  f"{row['pct_floor']:5.1f}% of floor  {cfg or ''} splits={splits}", flush=True)
            return row

        best = record("default", graph_ms(calls()))
        if args.runs:  # each sequence's blocks one run (sequence i from block i * blocks), read both ways
            blocks = data[0]["block_tables"].shape[1]
            runs = [dict(d, block_tables=torch.arange(batch * blocks, device="cuda", dtype=torch.int32).view(batch, -1))
                    for d in data]
            first = torch.arange(batch, device="cuda", dtype=torch.int32) * blocks
            for label, extra in (("run-table", {}), ("runs", {"first_pages": first})):
                record(label, graph_ms([lambda d=d, o=o, extra=extra: unified_attention(
                    **d, max_query_len=q_len, max_seq_len=ctx, out=o, **extra) for d, o in zip(runs, outs)]))
        if args.prefill:  # the dense-cache reference: SDPA's flash kernel on [batch, heads, P, D]
            sdpa_q = [torch.randn(batch, heads, q_len, HEAD_DIM, device="cuda", dtype=dtype) for _ in data]
            # K/V expanded to every query head (the flash backend's plain MHA form; compute-bound either way)
            sdpa_kv = [torch.randn(batch, heads, ctx, HEAD_DIM, device="cuda", dtype=dtype) for _ in data]
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
                record("sdpa", graph_ms([lambda q=q, kv=kv: torch.nn.functional.scaled_dot_product_attention(
                    q, kv, kv, is_causal=True) for q, kv in zip(sdpa_q, sdpa_kv)]))
        if args.grid or args.configs:
            if args.configs:
                from bench_w4a16 import parse_configs  # this folder is on sys.path when run as a script

                base = unified_config(family, HEAD_DIM, heads // kv_heads, q_len)
                split_counts = ([int(v) for v in args.splits.split(",")] if args.splits
                                else sorted({sp for _, sp in grid(batch, kv_heads, sms)}))
                cases = [({**base, **over}, sp) for _, over in [("", {})] + parse_configs(args.configs)
                         for sp in split_counts]
            else:
                cases = prefill_grid(heads // kv_heads) if args.prefill else grid(batch, kv_heads, sms)
            for cfg, splits in cases:
                try:
                    row = record("grid", graph_ms(calls(cfg, splits), reps=10), cfg, splits)
                except Exception as exc:  # noqa: BLE001 - a config that does not fit this GPU's shared memory
                    print(f"  skip {cfg} splits={splits}: {type(exc).__name__}: {str(exc)[:80]}", flush=True)
                    continue
                best = row if row["us"] < best["us"] else best
            print(f"BEST {shape} b={batch}: {best['us']:.1f} us ({best['pct_floor']:.1f}% of floor) {best['config']} "
                  f"splits={best['splits']}", flush=True)
        data = outs = None  # free this shape's caches before the next
        torch.cuda.empty_cache()
        if args.out:
            write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
