"""One W4A16 call per case, for Nsight Compute (`ncu --clock-control none -k regex:w4a16 python ...`).

Each case runs twice (profile the second: ``--launch-skip 1``; the first sizes the grid) after
compilation, on a fresh random GPTQ weight (g128, symmetric); no timing here: ncu replays each kernel
and reads its counters (DRAM throughput, sectors per request, stall reasons, achieved occupancy). A case
may end in ``:KEY=V,...``: knobs over the call's config (the stream config at one row; from 2 rows the pipelined
GEMM's, where ``class=NAME`` starts from another `PIPELINED_CONFIGS` class; values are integers, true/false or
names). ``--accumulate`` runs each case as the decode step does
at 1-16 rows (`w4a16.w4a16_accumulate`: float32 sums into an accumulator, no split-K flush).
Usage: python benchmarks/profile_w4a16.py [--accumulate] 1x4096x14336 1x4096x14336:num_warps=4 16x4096x14336
"""

from __future__ import annotations

import sys

import torch

from optimum_amdx.kernels import _w4a16_pipelined_triton as kp
from optimum_amdx.kernels._w4a16_gemm_triton import family
from optimum_amdx.kernels._w4a16_triton import stream_config
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import (accumulating_route, dispatch_route, pack_gptq_int32, prepare_gptq_weight,
                                        w4a16_accumulate, w4a16_matmul)


def _knob(value: str) -> "int | bool | str":
    """A knob's value: an integer, true/false, or a name (a class)."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    return int(value) if value.lstrip("-").isdigit() else value


def main(cases: list[str]) -> int:
    accumulate = "--accumulate" in cases
    for case in (c for c in cases if c != "--accumulate"):
        shape, _, extra = case.partition(":")  # "1x4096x14336:num_warps=4", "64x14336x4096:class=rows64_n128"
        m, k, n = (int(v) for v in shape.split("x"))
        config = None
        route = None
        knobs = {key: _knob(v) for key, v in (item.split("=") for item in extra.split(",") if item)}
        if m == 1 and knobs:
            config = {**stream_config(device_arch(), m), **knobs}
        elif knobs:  # the pipelined GEMM's config (its class, or the one `class` names) under the knobs
            route = "pipelined"
            cls = knobs.pop("class", None)
            config = (dict(kp.PIPELINED_CONFIGS[str(cls)]) if cls else
                      kp.pipelined_config(m, k, n, 1, True, family(device_arch())))
            config.update(knobs)
        q = torch.randint(0, 16, (k, n), device="cuda", dtype=torch.int32)
        scales = (torch.rand(k // 128, n, device="cuda") * 0.02 + 0.001).half()
        qzeros = pack_gptq_int32(torch.full((k // 128, n), 7, device="cuda", dtype=torch.int32), 4, dim=1)
        w = prepare_gptq_weight(pack_gptq_int32(q, 4, dim=0), qzeros, scales, None, group_size=128)
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        taken = route or dispatch_route(m, w, x.dtype, device_arch())
        print(f"{case}: route {taken}, config {config}", file=sys.stderr)
        if accumulate and (config is not None or accumulating_route(x, w) is None):
            print(f"{case}: no accumulating route (or knobs given, which only the flushed call takes)", file=sys.stderr)
            return 2
        acc = torch.zeros(m, n, device="cuda", dtype=torch.float32) if accumulate else None
        for _ in range(2):  # the second call runs the grid the first one sized (`_resident_programs`)
            torch.cuda.synchronize()
            if accumulate:
                w4a16_accumulate(x, w, acc)
            else:
                w4a16_matmul(x, w, route=route, config=config)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1x4096x14336"]))
