"""Prototype (issue 13, batch-1 decode): the decode step's accumulating one-row W4A16 calls under a 48-register cap.

Nsight Compute (RESULTS.md round29, 7) found these calls held to 4 programs of 8 warps per SM by their 56-64
registers (50 % occupancy) and bound by latency. A 48-register cap fits a fifth program; the sm_90 build of the
paired (prepared-pairs) accumulating form spills nothing under it, the plain-x form 32 bytes. This script times each
Llama-3-8B decode shape in the engine's form (float32 accumulator, no flush; paired input where the engine gives it)
with the shipped config and with ``maxnreg`` 48, graph-replayed over L2-cold weight copies.
Usage: python benchmarks/proto_w4a16_row_regcap.py [out.json]
"""

from __future__ import annotations

import os
import sys

import torch

from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels._w4a16_triton import stream_config, stream_matmul
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import pair_order

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_w4a16 import _clone, random_gptq  # noqa: E402

CASES = ((4096, 6144, True), (4096, 4096, False), (14336, 4096, True), (4096, 28672, True))
"""(K, N, paired input): q/k/v, o (its input comes plain from the attention), down, gate/up."""


def main() -> None:
    if len(sys.argv) > 1:
        result_path_or_exit(sys.argv[1], "out")  # before measuring: it replaces only a result we wrote
    arch = device_arch()
    rows = []
    for k, n, paired in CASES:
        w0, _ = random_gptq(k, n, 128, False, seed=k + n)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        xin = x[:, pair_order(k, x.device)].contiguous() if paired else x
        acc = torch.zeros(1, n, device="cuda", dtype=torch.float32)
        row = {"K": k, "N": n, "paired": paired, "us": {}}
        for cap in (None, 48):
            cfg = dict(stream_config(arch, 1))
            if cap:
                cfg["maxnreg"] = cap
            row["us"][str(cap)] = graph_ms([lambda w=w: stream_matmul(xin, w, None, acc, arch, config=cfg,
                                                                      accumulate=True, paired=paired)
                                            for w in ws]) * 1e3
        rows.append(row)
        print(f"{k}x{n} paired={int(paired)}: shipped {row['us']['None']:.2f} us, maxnreg 48 {row['us']['48']:.2f} us",
              flush=True)
    if len(sys.argv) > 1:
        write_json(sys.argv[1], {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
