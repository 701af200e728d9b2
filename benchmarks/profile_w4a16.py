"""One W4A16 call per case, for Nsight Compute (`ncu --clock-control none -k regex:w4a16 python ...`).

Each case runs twice (profile the second: ``--launch-skip 1``; the first sizes the grid) after
compilation, on a fresh random GPTQ weight (g128, symmetric); no timing here: ncu replays each kernel
and reads its counters (DRAM throughput, sectors per request, stall reasons, achieved occupancy). A case
may end in ``:KEY=V,...`` (integer stream-config knobs).
Usage: python benchmarks/profile_w4a16.py 1x4096x14336 1x4096x14336:num_warps=4 16x4096x14336
"""

from __future__ import annotations

import sys

import torch

from optimum_amdx.kernels._w4a16_triton import stream_config
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import pack_gptq_int32, prepare_gptq_weight, w4a16_matmul


def main(cases: list[str]) -> int:
    for case in cases:
        shape, _, extra = case.partition(":")  # "1x4096x14336:num_warps=4": integer knobs over the stream config
        m, k, n = (int(v) for v in shape.split("x"))
        config = None
        if extra:
            config = stream_config(device_arch(), m)
            config.update({key: int(v) for key, v in (item.split("=") for item in extra.split(","))})
        q = torch.randint(0, 16, (k, n), device="cuda", dtype=torch.int32)
        scales = (torch.rand(k // 128, n, device="cuda") * 0.02 + 0.001).half()
        qzeros = pack_gptq_int32(torch.full((k // 128, n), 7, device="cuda", dtype=torch.int32), 4, dim=1)
        w = prepare_gptq_weight(pack_gptq_int32(q, 4, dim=0), qzeros, scales, None, group_size=128)
        x = torch.randn(m, k, device="cuda", dtype=torch.float16)
        for _ in range(2):  # the second call runs the grid the first one sized (`_resident_programs`)
            torch.cuda.synchronize()
            w4a16_matmul(x, w, config=config)
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:] or ["1x4096x14336"]))
