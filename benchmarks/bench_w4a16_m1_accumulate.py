"""One-row W4A16 as the decode step runs it (float32 accumulator, no split-K flush): config knobs, and prepared pairs.

For the Llama decode shapes (g128, symmetric, fp16), times `stream_matmul(..., accumulate=True)` over L2-cold weight
copies (CUDA-graph replays) under each named config: the shipped one, prepared activation pairs with their prepare
launch (`xprep_paid`) and without it (`xprep_free`: the pairs a producer writing the pair order hands over, the
case `w4a16.takes_pairs` serves), 4 or 8 warps everywhere, fewer programs per SM, the loop fence. Prints one line per
shape (us and % of copy bandwidth) and writes JSON (RESULTS.md round 19).
Usage: python benchmarks/bench_w4a16_m1_accumulate.py [--out F.json] [--configs base,xprep_free,...]
"""
import argparse
import os
import sys
from typing import Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_w4a16 import _clone, call_bytes, random_gptq  # noqa: E402

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth  # noqa: E402
from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels import _w4a16_triton as kt  # noqa: E402
from optimum_amdx.kernels.runtime import device_arch  # noqa: E402

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 12288), (4096, 22016), (11008, 4096)]
CFGS = {
    "base": {},
    "xprep_free": {"XPREP": True, "_noprep": True},
    "xprep_paid": {"XPREP": True},
    "w4_all": {"num_warps": 4, "wide_min_units_per_cu": 0, "programs_per_cu": 8},
    "w8_all": {"num_warps": 8, "wide_min_units_per_cu": 0, "programs_per_cu": 8},
    "ppc3": {"programs_per_cu": 3, "wide_min_units_per_cu": 0},
    "ppc2": {"programs_per_cu": 2, "wide_min_units_per_cu": 0},
    "w4_ppc6": {"num_warps": 4, "wide_min_units_per_cu": 0, "programs_per_cu": 6},
    "fence": {"FENCE": True},
    "xprep_free_w4": {"XPREP": True, "_noprep": True, "num_warps": 4, "wide_min_units_per_cu": 0,
                      "programs_per_cu": 8},
    "xprep_free_w8": {"XPREP": True, "_noprep": True, "num_warps": 8, "wide_min_units_per_cu": 0,
                      "programs_per_cu": 8},
}


class _NoLaunch:
    """Stands in for the prepare kernel (`xprep_free`): its launch is skipped, the pairs' buffer left as it is."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="w4a16-m1-accumulate.json")
    parser.add_argument("--configs", default=",".join(CFGS), help="comma list of " + ", ".join(CFGS))
    args = parser.parse_args(argv)
    result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16_m1_accumulate needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    arch = device_arch()
    only = [c for c in args.configs.split(",") if c]
    real_xpack = kt._w4a16_xpack_kernel
    copy_bw = measure_copy_bandwidth("cuda")
    res = {"device": torch.cuda.get_device_name(), "uuid": str(torch.cuda.get_device_properties(0).uuid),
           "copy_GBps": copy_bw / 1e9, "rows": []}
    print(res["device"], res["uuid"], f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    for k, n in SHAPES:
        w0, _ = random_gptq(k, n, 128, False, seed=k + n)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        x = torch.randn(1, k, device="cuda", dtype=torch.float16)
        accs = [torch.zeros(1, n, device="cuda", dtype=torch.float32) for _ in ws]
        floor = call_bytes(w0, 1) / copy_bw * 1e6
        line = f"{k:>5}x{n:<5} floor {floor:5.2f} |"
        row = {"K": k, "N": n, "floor_us": floor}
        for name in only:
            extra = dict(CFGS[name])
            noprep = extra.pop("_noprep", False)
            cfg = dict(kt.stream_config(arch, 1), **extra)
            kt._w4a16_xpack_kernel = _NoLaunch() if noprep else real_xpack
            try:
                us = graph_ms([lambda w=w, a=a: kt.stream_matmul(x, w, None, a, arch, config=cfg, accumulate=True)
                               for w, a in zip(ws, accs)]) * 1e3
            except Exception as exc:  # noqa: BLE001 - a failing config is recorded, not fatal
                print(name, "error", str(exc)[:300], flush=True)
                us = float("nan")
            finally:
                kt._w4a16_xpack_kernel = real_xpack
            row[name] = us
            line += f" {name} {us:5.2f} ({floor / us * 100:4.1f}%)"
        res["rows"].append(row)
        print(line, flush=True)
        del ws, accs
        torch.cuda.empty_cache()
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
