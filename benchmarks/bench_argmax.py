"""Greedy sampling's argmax: `kernels.argmax.argmax_rows` against torch.argmax, one row to a batch of rows.

Times each on fp16 logits of the Llama vocabularies (128256: Llama-3, 32000: Llama-2) at 1, 16 and 64 rows as
device time: calls replayed from a CUDA graph, so the host's launch cost is left out, as it is in the engine,
whose host launches the sampling while the GPU still runs the step (a Python launch of two Triton kernels takes
longer on the host than they take on the GPU). The logits stay in L2, as they do right after the lm_head writes
them. Prints a table and writes JSON.
Usage: python benchmarks/bench_argmax.py [--out argmax.json]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

import torch

from optimum_amdx.benchmark.timing import graph_ms
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels.argmax import argmax_rows


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write results as JSON here")
    parser.add_argument("--vocabs", default="128256,32000")
    parser.add_argument("--rows", default="1,16,64")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_argmax needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": []}
    print(f"device {result['device']}")
    print("| vocab | rows | torch.argmax us | argmax_rows us | speedup |\n|---|---|---|---|---|")
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, vocab, device="cuda", dtype=torch.float16)
            if not torch.equal(argmax_rows(x), x.argmax(dim=-1)):
                raise SystemExit(f"argmax_rows disagrees with torch.argmax at {rows}x{vocab}")
            t_torch = graph_ms([lambda: x.argmax(dim=-1)] * 20) * 1e3
            t_ours = graph_ms([lambda: argmax_rows(x)] * 20) * 1e3
            result["rows"].append({"vocab": vocab, "rows": rows, "torch_us": t_torch, "ours_us": t_ours})
            print(f"| {vocab} | {rows} | {t_torch:.1f} | {t_ours:.1f} | {t_torch / t_ours:.1f}x |", flush=True)
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
