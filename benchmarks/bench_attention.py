"""Attention kernels on a GPU against the measured ceilings and torch SDPA.

Measures, in one run: copy bandwidth (bytes read + written per second), the fp16 matmul rate, then
  * paged decode (unified_attention, 1 query token per sequence) as % of copy bandwidth on the KV bytes
    it must read (target >= 80%), eager and replayed from a CUDA/HIP graph;
  * causal prefill (flash_attention, 8 x 32 heads x 2048 x 128 fp16) against torch SDPA's flash backend
    (target >= 1.0x), in TFLOP/s and as % of the matmul rate;
  * with --sweep, a small grid of tile configs for both, so the shipped defaults can be checked.
Prints a table and writes JSON (--out). Usage: python benchmarks/bench_attention.py --out attn.json --sweep
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth, measure_matmul_flops
from optimum_amdx.benchmark.timing import device_ms, graph_ms
from optimum_amdx.io import result_path_or_exit, write_json


def time_ms(fn: Callable[[], Any], reps: int = 30, warmup: int = 5) -> float:
    """Median milliseconds of `fn` over `reps` runs timed with device events."""
    return device_ms(fn, reps=reps, warmup=warmup)


def graph_time_ms(fn: Callable[[], Any], reps: int = 30, calls: int = 10) -> float:
    """Median milliseconds per call of `fn` captured `calls` times in one graph (no launch overhead)."""
    return graph_ms([fn] * calls, reps=reps, warmup_calls=3)


def decode_inputs(num_seqs: int, ctx: int, heads: int, kv_heads: int, head_dim: int, block_size: int = 16) -> dict:
    """Random paged cache holding `num_seqs` contexts of `ctx` tokens in shuffled blocks, one query each."""
    blocks_per_seq = math.ceil(ctx / block_size)
    num_blocks = num_seqs * blocks_per_seq
    shape = (num_blocks, block_size, kv_heads, head_dim)
    return {
        "q": torch.randn(num_seqs, heads, head_dim, device="cuda", dtype=torch.float16),
        "k_cache": torch.randn(shape, device="cuda", dtype=torch.float16),
        "v_cache": torch.randn(shape, device="cuda", dtype=torch.float16),
        "block_tables": torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(num_seqs, blocks_per_seq),
        "seq_lens": torch.full((num_seqs,), ctx, device="cuda", dtype=torch.int32),
        "query_start_loc": torch.arange(num_seqs + 1, device="cuda", dtype=torch.int32),
        "max_query_len": 1,
        "max_seq_len": ctx,
    }


def bench_decode(name: str, num_seqs: int, ctx: int, copy_bw: float, sweep: bool) -> list[dict]:
    from optimum_amdx.kernels.paged_attention import unified_attention
    from optimum_amdx.kernels._paged_attention_triton import unified_attention_triton
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    heads, kv_heads, head_dim = 32, 8, 128
    inp = decode_inputs(num_seqs, ctx, heads, kv_heads, head_dim)
    kv_bytes = 2 * num_seqs * ctx * kv_heads * head_dim * 2
    out = torch.empty_like(inp["q"])
    rows = []

    def row(label: str, ms: float, extra: dict | None = None) -> dict:
        bw = kv_bytes / (ms * 1e-3)
        r = {"case": name, "kernel": label, "ms": ms, "kv_GBps": bw / 1e9, "pct_copy_bw": 100 * bw / copy_bw}
        r.update(extra or {})
        rows.append(r)
        return r

    row("unified_attention (eager)", time_ms(lambda: unified_attention(**inp, out=out)))
    row("unified_attention (graph)", graph_time_ms(lambda: unified_attention(**inp, out=out)))
    k = inp["k_cache"][inp["block_tables"].long()].reshape(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    v = inp["v_cache"][inp["block_tables"].long()].reshape(num_seqs, -1, kv_heads, head_dim).transpose(1, 2)
    k, v = k.contiguous(), v.contiguous()
    q4 = inp["q"].view(num_seqs, heads, 1, head_dim)
    row("torch SDPA, contiguous KV (no paging)",
        time_ms(lambda: F.scaled_dot_product_attention(q4, k, v, enable_gqa=True)))
    del k, v
    if sweep:
        family = arch_family(device_arch())
        if num_seqs * kv_heads >= torch.cuda.get_device_properties(0).multi_processor_count:
            grid = [((128, 4, 2), 1), ((128, 4, 3), 1), ((128, 8, 2), 1), ((64, 4, 2), 1), ((128, 2, 2), 1),
                    ((128, 4, 1), 1), ((128, 4, 2), 2)]
        else:
            grid = [(t, s) for t in ((128, 4, 2), (64, 4, 2)) for s in (8, 16, 32)]
        for (block_n, warps, stages), splits in grid:
            cfg = {"BLOCK_M": 16, "BLOCK_N": block_n, "num_warps": warps, "num_stages": stages}

            def call(cfg=cfg, splits=splits):
                return unified_attention_triton(
                    inp["q"], inp["k_cache"], inp["v_cache"], inp["block_tables"], inp["seq_lens"],
                    inp["query_start_loc"], 1, ctx, None, None, out, splits, family, cfg,
                )

            try:
                ms = graph_time_ms(call, reps=10, calls=5)
            except Exception as exc:  # a config that does not fit this GPU's shared memory
                print(f"  skip {cfg} splits={splits}: {type(exc).__name__}", file=sys.stderr)
                continue
            row("sweep", ms, {"config": cfg, "num_splits": splits})
    return rows


def bench_prefill(copy_bw: float, mm_rate: float, sweep: bool, batch: int = 8, heads: int = 32, seq: int = 2048,
                  head_dim: int = 128) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from optimum_amdx.kernels.flash_attention import flash_attention
    from optimum_amdx.kernels._flash_attention_triton import flash_attention_triton
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    q, k, v = (torch.randn(batch, heads, seq, head_dim, device="cuda", dtype=torch.float16) for _ in range(3))
    flops = 2 * batch * heads * seq * seq * head_dim  # two matmuls, causal half: 4 * B*H*S^2*D / 2
    rows = []

    def sdpa() -> torch.Tensor:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    sdpa_ms = time_ms(sdpa)

    def row(label: str, ms: float, extra: dict | None = None) -> dict:
        tf = flops / (ms * 1e-3)
        r = {"case": f"prefill causal {batch}x{heads}x{seq}x{head_dim} fp16", "kernel": label, "ms": ms,
             "TFLOPs": tf / 1e12, "pct_matmul": 100 * tf / mm_rate, "vs_sdpa_flash": sdpa_ms / ms}
        r.update(extra or {})
        rows.append(r)
        return r

    row("torch SDPA (flash backend)", sdpa_ms)
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        try:
            row("torch SDPA (cuDNN backend)", time_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        except RuntimeError:
            pass
    row("flash_attention", time_ms(lambda: flash_attention(q, k, v, causal=True)))
    row("flash_attention (non-causal, 2x FLOPs)",
        time_ms(lambda: flash_attention(q, k, v, causal=False)) / 2)
    rows += bench_paged_prefill(q, k, v, flops, sdpa_ms, mm_rate, sweep)
    if sweep:
        family = arch_family(device_arch())
        for bm, bn, warps, stages in [(64, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3), (64, 32, 4, 3),
                                      (128, 64, 8, 4)]:
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}
            try:
                ms = time_ms(lambda cfg=cfg: flash_attention_triton(q, k, v, True, None, family, cfg), reps=10)
            except Exception as exc:
                print(f"  skip {cfg}: {type(exc).__name__}", file=sys.stderr)
                continue
            row("sweep", ms, {"config": cfg})
    return rows


def bench_paged_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, flops: float, sdpa_ms: float,
                        mm_rate: float, sweep: bool) -> list[dict]:
    """The same causal prefill through unified_attention, with K/V in a paged cache (block size 16)."""
    from optimum_amdx.kernels.paged_attention import unified_attention
    from optimum_amdx.kernels._paged_attention_triton import unified_attention_triton
    from optimum_amdx.kernels.runtime import arch_family, device_arch

    batch, heads, seq, head_dim = q.shape
    kv_heads = 8
    k, v = k[:, :kv_heads], v[:, :kv_heads]
    blocks = batch * seq // 16
    perm = torch.randperm(blocks, device="cuda")
    k_cache = torch.empty(blocks, 16, kv_heads, head_dim, device="cuda", dtype=q.dtype)
    v_cache = torch.empty_like(k_cache)
    k_cache[perm] = k.transpose(1, 2).reshape(blocks, 16, kv_heads, head_dim)
    v_cache[perm] = v.transpose(1, 2).reshape(blocks, 16, kv_heads, head_dim)
    args = dict(
        q=q.transpose(1, 2).reshape(batch * seq, heads, head_dim).contiguous(), k_cache=k_cache, v_cache=v_cache,
        block_tables=perm.to(torch.int32).view(batch, seq // 16),
        seq_lens=torch.full((batch,), seq, device="cuda", dtype=torch.int32),
        query_start_loc=torch.arange(0, batch * seq + 1, seq, device="cuda", dtype=torch.int32),
        max_query_len=seq, max_seq_len=seq,
    )
    rows = []

    def row(label: str, ms: float, extra: dict | None = None) -> None:
        tf = flops / (ms * 1e-3)  # FLOPs depend on the query heads only
        r = {"case": f"paged prefill {batch}x{heads}/{kv_heads}x{seq}x{head_dim}", "kernel": label, "ms": ms,
             "TFLOPs": tf / 1e12, "pct_matmul": 100 * tf / mm_rate, "vs_sdpa_flash": sdpa_ms / ms}
        r.update(extra or {})
        rows.append(r)

    row("unified_attention", time_ms(lambda: unified_attention(**args)))
    if sweep:
        family = arch_family(device_arch())
        for bm, bn, warps, stages in [(64, 64, 4, 3), (128, 64, 8, 3), (64, 32, 4, 3), (128, 128, 8, 2),
                                      (64, 64, 4, 2), (128, 64, 4, 3), (128, 32, 8, 3)]:
            cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages}

            def call(cfg=cfg):
                return unified_attention_triton(
                    args["q"], k_cache, v_cache, args["block_tables"], args["seq_lens"], args["query_start_loc"],
                    seq, seq, None, None, None, 1, family, cfg,
                )

            try:
                row("sweep", time_ms(call, reps=10), {"config": cfg})
            except Exception as exc:
                print(f"  skip {cfg}: {type(exc).__name__}", file=sys.stderr)
    return rows


def print_table(rows: list[dict]) -> None:
    for r in rows:
        extra = f" {r.get('config', '')} splits={r['num_splits']}" if "num_splits" in r else f" {r.get('config', '')}"
        if "pct_copy_bw" in r:
            print(f"{r['case']:<34} {r['kernel']:<40} {r['ms']*1e3:9.1f} us {r['kv_GBps']:8.0f} GB/s "
                  f"{r['pct_copy_bw']:6.1f}% copy{extra}")
        else:
            print(f"{r['case']:<34} {r['kernel']:<40} {r['ms']*1e3:9.1f} us {r['TFLOPs']:7.1f} TF/s "
                  f"{r['pct_matmul']:5.1f}% mm {r['vs_sdpa_flash']:5.2f}x sdpa{extra}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--sweep", action="store_true", help="also time a small grid of tile configs")
    args = parser.parse_args()
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_attention: needs a GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    copy_bw = measure_copy_bandwidth("cuda")
    mm = measure_matmul_flops("cuda", torch.float16)
    print(f"device: {props.name}  copy {copy_bw/1e12:.2f} TB/s (read+write)  fp16 matmul {mm/1e12:.0f} TF/s")
    rows = bench_decode("decode 32 seqs x 4096, 32/8 heads", 32, 4096, copy_bw, args.sweep)
    rows += bench_decode("decode 4 seqs x 16384, 32/8 heads", 4, 16384, copy_bw, args.sweep)
    rows += bench_prefill(copy_bw, mm, args.sweep)
    best = [r for r in rows if r["kernel"] != "sweep"]
    for case in dict.fromkeys(r["case"] for r in rows):
        sweep_rows = [r for r in rows if r["case"] == case and r["kernel"] == "sweep"]
        if sweep_rows:
            best.append(dict(min(sweep_rows, key=lambda r: r["ms"]), kernel="best of sweep"))
    print_table(rows if args.sweep else best)
    print("---- summary ----")
    print_table(best)
    if args.out:
        write_json(args.out, {"device": props.name, "copy_bw_Bps": copy_bw, "matmul_fp16_flops": mm, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
