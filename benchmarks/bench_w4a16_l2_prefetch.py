"""Would the decode step's W4A16 calls gain from their weights already in L2? A probe, before any engine change.

The 16-row calls of the small weights are one wave of short programs that wait on DRAM (RESULTS.md round 20: the
4096x4096 call at 31 % of DRAM bandwidth). If the same call runs much faster with its weight in L2, the bytes could
be brought there while an earlier kernel runs that leaves DRAM bandwidth idle: the decode attention at 16
sequences reads its K/V at about 60 % of the bandwidth (round 17). This script measures, on the Llama decode
shapes (g128 fp16, the accumulating form of `w4a16.w4a16_accumulate`, CUDA-graph replays):

  * ``cold``: the call over L2-cold weight copies (as every W4A16 figure of RESULTS.md);
  * ``warm``: the call repeated on one copy (in L2 when it fits: H100 50 MB);
  * ``touch``: a read-only streaming kernel over the same bytes alone (how fast they can be brought to L2);
  * ``touch+call``: the two back to back, serial;
  * ``attn+o`` against ``attn||touch+o``: per layer, the decode attention (Llama-3-8B heads, 16 sequences,
    512 cached tokens, its own cache per layer) and then the o projection (4096x4096), without and with the
    touch of that layer's o weight on a second stream beside the attention (fork before, join after);
  * the attention prefetching that layer's o weight into L2 itself (``prefetch.global.L2::evict_last``, at its
    programs' start or end) was measured with the code of commit 140a69f (RESULTS.md round 21) and removed.

Prints one line per cell and writes JSON.
Usage: python benchmarks/bench_w4a16_l2_prefetch.py [--rows 1,16] [--layers 8] [--out F.json]
"""
import argparse
import json
import os
import sys
from typing import Any, Optional

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_decode_sweep import make_layers  # noqa: E402
from bench_w4a16 import _clone, call_bytes, random_gptq  # noqa: E402

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth  # noqa: E402
from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels.paged_attention import unified_attention  # noqa: E402
from optimum_amdx.kernels.w4a16 import accumulating_route, w4a16_accumulate  # noqa: E402

SHAPES = [(4096, 4096), (4096, 6144), (14336, 4096), (4096, 28672)]


@triton.jit
def _touch_kernel(src, sink, n_vec, VEC: tl.constexpr, ITERS: tl.constexpr, EVICT: tl.constexpr):
    """Read `n_vec` vectors of VEC int32 words (each program ITERS of them, grid-strided), xor them and store one
    word per program to `sink`: a read of the bytes that no compiler drops, leaving them in L2."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * VEC
    offs = pid * VEC + tl.arange(0, VEC)
    acc = tl.zeros([VEC], dtype=tl.int32)
    for i in tl.range(0, ITERS):
        o = offs + i * step
        if EVICT:
            acc ^= tl.load(src + o, mask=o < n_vec * VEC, other=0, eviction_policy="evict_last")
        else:
            acc ^= tl.load(src + o, mask=o < n_vec * VEC, other=0)
    tl.store(sink + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def touch(t: torch.Tensor, sink: torch.Tensor, programs: int, evict: bool = True) -> None:
    """Read all of `t` (its bytes, viewed as int32 words) with `programs` programs."""
    words = t.view(torch.int32).reshape(-1)
    vec = 2048
    n_vec = triton.cdiv(words.numel(), vec)
    iters = triton.cdiv(n_vec, programs)
    _touch_kernel[(programs,)](words, sink, n_vec, VEC=vec, ITERS=iters, EVICT=evict, num_warps=4)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,16")
    parser.add_argument("--programs", default="132,264,528", help="comma list of touch-kernel grid sizes")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--out", default="w4a16-l2-prefetch.json")
    args = parser.parse_args(argv)
    result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16_l2_prefetch needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    copy_bw = measure_copy_bandwidth("cuda")
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "uuid": str(torch.cuda.get_device_properties(0).uuid),
                           "copy_GBps": copy_bw / 1e9, "cells": [], "layers": []}
    print(res["device"], res["uuid"], f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    rows = [int(r) for r in args.rows.split(",") if r]
    programs = [int(p) for p in args.programs.split(",") if p]
    sink = torch.zeros(1 << 16, device="cuda", dtype=torch.int32)
    for k, n in SHAPES:
        w0, _ = random_gptq(k, n, 128, False, seed=k + n)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=torch.float16)
            route = accumulating_route(x, w0)
            accs = [torch.zeros(m, n, device="cuda", dtype=torch.float32) for _ in ws]
            call = lambda w, a: w4a16_accumulate(x, w, a, route)  # noqa: E731
            cell: dict[str, Any] = {"K": k, "N": n, "M": m, "route": route,
                                    "floor_us": call_bytes(w0, m) / copy_bw * 1e6}
            cell["cold_us"] = graph_ms([lambda w=w, a=a: call(w, a) for w, a in zip(ws, accs)]) * 1e3
            cell["warm_us"] = graph_ms([lambda: call(w0, accs[0])] * len(ws)) * 1e3
            for p in programs:
                cell[f"touch{p}_us"] = graph_ms([lambda w=w: touch(w.qweight, sink, p) for w in ws]) * 1e3
                cell[f"touch{p}+call_us"] = graph_ms(
                    [lambda w=w, a=a: (touch(w.qweight, sink, p), call(w, a)) for w, a in zip(ws, accs)]) * 1e3
            res["cells"].append(cell)
            print(json.dumps({c: (round(v, 2) if isinstance(v, float) else v) for c, v in cell.items()}), flush=True)
    # attention then the o projection, per layer, without and with the o weight touched beside the attention
    o0, _ = random_gptq(4096, 4096, 128, False, seed=7)
    layers = [(d, _clone(o0)) for d in make_layers(16, args.ctx, 32, 8, args.layers, torch.float16)]
    outs = [torch.empty(16, 32, 128, device="cuda", dtype=torch.float16) for _ in layers]
    acc = torch.zeros(16, 4096, device="cuda", dtype=torch.float32)
    side = torch.cuda.Stream()

    def attn(d, o):
        return unified_attention(**d, max_query_len=1, max_seq_len=args.ctx, out=o)

    def serial(d, o, w):
        attn(d, o)
        w4a16_accumulate(o.view(16, 4096), w, acc)

    def overlapped(d, o, w, p, evict):
        cur = torch.cuda.current_stream()
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            touch(w.qweight, sink, p, evict)
        attn(d, o)
        cur.wait_stream(side)
        w4a16_accumulate(o.view(16, 4096), w, acc)

    row: dict[str, Any] = {"layers": args.layers, "ctx": args.ctx}
    row["attn_us"] = graph_ms([lambda d=d, o=o: attn(d, o) for (d, _), o in zip(layers, outs)]) * 1e3
    row["attn+o_us"] = graph_ms([lambda d=d, o=o, w=w: serial(d, o, w) for (d, w), o in zip(layers, outs)]) * 1e3
    for p in programs:
        for evict in (True, False):
            key = f"attn||touch{p}{'' if evict else '_noevict'}+o_us"
            row[key] = graph_ms([lambda d=d, o=o, w=w: overlapped(d, o, w, p, evict)
                                 for (d, w), o in zip(layers, outs)]) * 1e3
    res["layers"].append(row)
    print(json.dumps({c: (round(v, 2) if isinstance(v, float) else v) for c, v in row.items()}), flush=True)
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
