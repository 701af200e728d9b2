"""RMSNorm (with and without the residual add) and in-place rotary on a GPU vs copy bandwidth and PyTorch.

Bytes counted are the ones each kernel must move: RMSNorm reads x (and the residual) and writes y
(and x + residual); rotary reads and writes the rotated part of q and k (cos/sin rows are counted
too). Target: >= 85% of the measured copy bandwidth. The PyTorch alternative is the eager
reference beside each kernel (what transformers runs).
Usage: python benchmarks/bench_norm_rotary.py --out norm_rotary.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

import torch

from optimum_amdx.benchmark.timing import device_ms as events_ms, graph_ms as graphed_ms
from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels.rmsnorm import rms_norm, rms_norm_reference
from optimum_amdx.kernels.rotary import rotary_embedding_, rotary_embedding_reference


def norm_case(tokens: int, hidden: int, residual: bool, copy_bw: float) -> dict[str, Any]:
    x = torch.randn(tokens, hidden, device="cuda", dtype=torch.float16)
    r = torch.randn_like(x) if residual else None
    w = torch.randn(hidden, device="cuda", dtype=torch.float16)
    eager_ms = events_ms(lambda: rms_norm(x, w, 1e-6, r))
    ms = graphed_ms([lambda: rms_norm(x, w, 1e-6, r)] * 5)
    torch_ms = graphed_ms([lambda: rms_norm_reference(x, w, 1e-6, r)] * 5)
    nbytes = x.numel() * 2 * (4 if residual else 2) + hidden * 2
    return {"kernel": "rms_norm" + ("+residual" if residual else ""), "shape": f"{tokens}x{hidden}", "ms": ms, "eager_ms": eager_ms,
            "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw, "torch_ms": torch_ms, "speedup": torch_ms / ms}


def decode_norm_case(batch: int, hidden: int, copy_bw: float) -> dict[str, Any]:
    """Decode-sized RMSNorm+residual (a few rows), replayed from a graph: latency, not bandwidth."""
    xs = [torch.randn(batch, hidden, device="cuda", dtype=torch.float16) for _ in range(32)]
    r = torch.randn(batch, hidden, device="cuda", dtype=torch.float16)
    w = torch.randn(hidden, device="cuda", dtype=torch.float16)
    ms = graphed_ms([lambda x=x: rms_norm(x, w, 1e-6, r) for x in xs])
    torch_ms = graphed_ms([lambda x=x: rms_norm_reference(x, w, 1e-6, r) for x in xs])
    nbytes = batch * hidden * 2 * 4 + hidden * 2
    return {"kernel": "rms_norm+residual", "shape": f"{batch}x{hidden}", "ms": ms, "eager_ms": float("nan"),
            "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw, "torch_ms": torch_ms, "speedup": torch_ms / ms}


def rotary_case(tokens: int, hq: int, hk: int, d: int, interleaved: bool, copy_bw: float) -> dict[str, Any]:
    q = torch.randn(tokens, hq, d, device="cuda", dtype=torch.float16)
    k = torch.randn(tokens, hk, d, device="cuda", dtype=torch.float16)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device="cuda", dtype=torch.float32) / d))
    freqs = torch.outer(torch.arange(8192, device="cuda", dtype=torch.float32), inv)
    cos, sin = freqs.cos(), freqs.sin()
    pos = torch.randint(0, 8192, (tokens,), device="cuda")
    eager_ms = events_ms(lambda: rotary_embedding_(q, k, cos, sin, pos, interleaved))
    ms = graphed_ms([lambda: rotary_embedding_(q, k, cos, sin, pos, interleaved)] * 5)
    torch_ms = graphed_ms([lambda: rotary_embedding_reference(q, k, cos, sin, pos, interleaved)] * 5)
    nbytes = 2 * (q.numel() + k.numel()) * 2 + tokens * d * 4 + tokens * 8
    return {"kernel": "rotary_" + ("gptj" if interleaved else "neox"), "shape": f"{tokens}x({hq}+{hk})x{d}", "ms": ms, "eager_ms": eager_ms,
            "pct_copy_bw": 100 * nbytes / (ms * 1e-3) / copy_bw, "torch_ms": torch_ms, "speedup": torch_ms / ms}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write results as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_norm_rotary needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    copy_bw = measure_copy_bandwidth("cuda")
    rows = [norm_case(t, h, res, copy_bw) for t, h in ((4096, 4096), (16384, 4096), (32768, 8192)) for res in (False, True)]
    rows += [decode_norm_case(b, 4096, copy_bw) for b in (1, 32)]
    rows += [rotary_case(t, 32, 8, 128, il, copy_bw) for t in (4096, 32768) for il in (False, True)]
    rows += [rotary_case(16384, 32, 32, 128, False, copy_bw)]
    print(f"device {torch.cuda.get_device_name()}; copy {copy_bw / 1e9:.0f} GB/s")
    print("times replayed from a graph (GPU time); 'eager us' includes the Python launch")
    print(f"{'kernel':20} {'shape':22} {'us':>8} {'%copy':>6} {'eager us':>9} {'torch us':>9} {'speedup':>8}")
    for r in rows:
        print(f"{r['kernel']:20} {r['shape']:22} {r['ms'] * 1e3:8.1f} {r['pct_copy_bw']:6.1f} {r['eager_ms'] * 1e3:9.1f} "
              f"{r['torch_ms'] * 1e3:9.1f} {r['speedup']:7.2f}x")
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "copy_GB_s": copy_bw / 1e9, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
