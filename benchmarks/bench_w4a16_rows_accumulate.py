"""2-16-row W4A16 as the decode step runs it (the pipelined GEMM into a float32 accumulator): tiles and K splits.

The pipelined GEMM's 16-row classes were tuned on the flushed call (split-K workspace, ticket, read-back by the last
sharer: `bench_w4a16.py`), but from 2 to 16 rows the decode step leaves its sums in an accumulator
(`w4a16.w4a16_accumulate`, RESULTS.md round 13), where a split costs only its atomic adds. This script times that
form on the Llama decode shapes (g128, symmetric, fp16) over L2-cold weight copies (CUDA-graph replays), under the
shipped config and a grid around it: either class (``staged``: `rows16`, ``regs``: `rows16_regs`), forced split
counts, 16-, 32- and 128-column tiles, other stage counts, register caps. Prints one line per (shape, rows) with
each config's time and the best one's % of copy bandwidth, and writes JSON (RESULTS.md round 20).
With ``--dtype bf16`` the activations are bf16 and ``f32_prev`` is bf16's float32 form on round 22's class (RESULTS.md
round 23).
Usage: python benchmarks/bench_w4a16_rows_accumulate.py [--rows 16] [--configs base,staged_s16,...] [--repeat 3]
       [--dtype fp16|bf16] [--out F.json]
"""
import argparse
import os
import statistics
import sys
from typing import Any, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_w4a16 import _clone, call_bytes, random_gptq  # noqa: E402

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth  # noqa: E402
from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies  # noqa: E402
from optimum_amdx.io import result_path_or_exit, write_json  # noqa: E402
from optimum_amdx.kernels import _w4a16_pipelined_triton as kp  # noqa: E402
from optimum_amdx.kernels.runtime import device_arch  # noqa: E402

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 12288), (4096, 22016), (11008, 4096)]


def _grid() -> dict[str, dict[str, Any]]:
    """Named overrides of the shipped config: ``_class`` replaces the class, the rest update its keys."""
    out: dict[str, dict[str, Any]] = {"base": {}}
    for cls, tag in (("rows16", "staged"), ("rows16_regs", "regs")):
        out[tag] = {"_class": cls}
        for split in (1, 2, 4, 8, 16, 32):
            out[f"{tag}_s{split}"] = {"_class": cls, "SPLIT": split}
            out[f"{tag}_n128_s{split}"] = {"_class": cls, "SPLIT": split, "BLOCK_N": 128, "num_warps": 8}
        for split in (2, 4, 8, 16):  # narrower column tiles: more programs without more K splits
            out[f"{tag}_n32w2_s{split}"] = {"_class": cls, "SPLIT": split, "BLOCK_N": 32, "num_warps": 2}
            out[f"{tag}_n32w4_s{split}"] = {"_class": cls, "SPLIT": split, "BLOCK_N": 32, "num_warps": 4}
            out[f"{tag}_n16w1_s{split}"] = {"_class": cls, "SPLIT": split, "BLOCK_N": 16, "num_warps": 1}
        for reg in (56, 64, 80, 96):  # a register cap: more programs per SM
            out[f"{tag}_r{reg}"] = {"_class": cls, "maxnreg": reg}
        out[f"{tag}_st2"] = {"_class": cls, "num_stages": 2}
        out[f"{tag}_st4"] = {"_class": cls, "num_stages": 4}
    out["regs_w8"] = {"_class": "rows16_regs", "num_warps": 8}
    for entry in out.values():  # fp16's form of the register class (the shipped class serves bf16's float32 form)
        if entry.get("_class") == "rows16_regs":
            entry["HALF_DEQ"] = True
    for reg in (64, 80, 96, 128):  # the shipped class of the call, under a register cap (17-64 rows: with --flush)
        out[f"base_r{reg}"] = {"maxnreg": reg}
    # the tile's dot of q - z scaled after it (SCALE_AFTER: one group per tile, one K tile per step)
    out["base_sa"] = {"SCALE_AFTER": True}
    out["base_nosa"] = {"SCALE_AFTER": False}
    out["staged_sa"] = {"_class": "rows16", "SCALE_AFTER": True}
    out["staged_nosa"] = {"_class": "rows16", "SCALE_AFTER": False}
    out["staged_sa_s1"] = {"_class": "rows16", "SCALE_AFTER": True, "SPLIT": 1}
    out["staged_sa_ww"] = {"_class": "rows16", "SCALE_AFTER": True, "within_waves": True}
    out["staged_sa_r72"] = {"_class": "rows16", "SCALE_AFTER": True, "maxnreg": 72}
    out["staged_sa_w7"] = {"_class": "rows16", "SCALE_AFTER": True, "waves": 7, "maxnreg": 72}
    # two K tiles a loop step in the scaled loop (the `_w4a16_pipelined_triton` docstring), at 2 stages and at 3
    out["unroll2"] = {"UNROLL": 2, "num_stages": 2}
    out["unroll2_st3"] = {"UNROLL": 2, "num_stages": 3}
    # 17-32 rows on wide outputs (with --flush): the staged classes against the register class
    out["narrow32"] = {"_class": "narrow32"}
    out["narrow32_w2"] = {"_class": "narrow32", "waves": 2}
    out["regs_sa"] = {"_class": "rows16_regs", "SCALE_AFTER": True, "HALF_DEQ": True}
    # 33-64 rows (with --flush): the scaled form on any grid, under a register cap that keeps 4 programs per SM;
    # the 64 x 128 tile (half the activation reads per weight byte), scaled or not, on narrow outputs too
    out["sa_any"] = {"SCALE_AFTER": True, "scale_after_waves": 1 << 10}
    out["sa_r128"] = {"SCALE_AFTER": True, "scale_after_waves": 1 << 10, "maxnreg": 128}
    out["sa_w8"] = {"SCALE_AFTER": True, "scale_after_waves": 1 << 10, "num_warps": 8, "waves": 2}
    out["sa_s1"] = {"SCALE_AFTER": True, "SPLIT": 1}
    out["sa_cap4"] = {"scale_after_waves": 4, "maxnreg": 128}  # K splits for 4 programs per SM, all capped
    # small weights at 17-64 rows: shorter K runs (more splits), other stage counts, the 32-row tile's K splits
    out["k4"] = {"min_k_tiles": 4}
    out["st2"] = {"num_stages": 2}
    out["st4"] = {"num_stages": 4}
    out["narrow32_k4"] = {"_class": "narrow32", "min_k_tiles": 4}
    out["narrow32_k4_w6"] = {"_class": "narrow32", "min_k_tiles": 4, "waves": 6}
    out["sa_w8_s2"] = {"SCALE_AFTER": True, "scale_after_waves": 1 << 10, "num_warps": 8, "SPLIT": 2}
    out["n128_sa_r128"] = {"_class": "rows64_n128", "SCALE_AFTER": True, "maxnreg": 128}
    out["n128_sa_r128_k8"] = {"_class": "rows64_n128", "SCALE_AFTER": True, "maxnreg": 128, "min_k_tiles": 8}
    for tag, extra in (("n128", {}), ("n128_sa", {"SCALE_AFTER": True})):
        out[tag] = {"_class": "rows64_n128", **extra}
        out[f"{tag}_w3"] = {"_class": "rows64_n128", "waves": 3, **extra}
        out[f"{tag}_k8"] = {"_class": "rows64_n128", "min_k_tiles": 8, **extra}
    # bf16 (--dtype bf16): its float32 form on the class round 22 gave it (register word loads, float32
    # dequantization), against the shipped config (the scaled fp16 class with bf16 planes, round 23)
    out["f32_prev"] = {"_f32_prev": True}
    out["rows64_cls"] = {"_class": "rows64"}  # bf16: its planes on the 64 x 64 tile (the class scales one-group tiles)
    return out


CFGS = _grid()


def config_for(name: str, m: int, k: int, n: int, half: bool = True) -> dict[str, Any]:
    """The config `name` stands for at `m` rows of a `k` x `n` g128 weight (Hopper; `half`: fp16, else bf16)."""
    extra = dict(CFGS[name])
    cls = extra.pop("_class", None)
    if extra.pop("_f32_prev", False):
        return kp.float32_config(kp.PIPELINED_CONFIGS[kp._class_name(m, k, n, 1, False)])
    cfg = dict(kp.PIPELINED_CONFIGS[cls]) if cls else kp.pipelined_config(m, k, n, 1, half, "hopper")
    cfg.update(extra)
    return cfg


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="w4a16-rows-accumulate.json")
    parser.add_argument("--rows", default="16", help="comma list of row counts (2-16; more with --flush)")
    parser.add_argument("--shapes", default="", help="comma list KxN (default: the Llama decode shapes)")
    parser.add_argument("--configs", default=",".join(CFGS), help="comma list of " + ", ".join(CFGS))
    parser.add_argument("--repeat", type=int, default=1, help="rounds over the configs (each cell: their median)")
    parser.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="activation dtype")
    parser.add_argument("--flush", action="store_true", help="time the flushed call (fp16 output, split-K tickets), "
                        "as from 17 rows on, instead of the accumulating one")
    args = parser.parse_args(argv)
    result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        print("bench_w4a16_rows_accumulate needs a GPU (torch.cuda)", file=sys.stderr)
        return 2
    arch = device_arch()
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in CFGS]
    if unknown:
        print(f"unknown configs {unknown}; known: {', '.join(CFGS)}", file=sys.stderr)
        return 2
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",") if s] or SHAPES
    rows = [int(r) for r in args.rows.split(",") if r]
    copy_bw = measure_copy_bandwidth("cuda")
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "flush": args.flush, "dtype": args.dtype,
                           "uuid": str(torch.cuda.get_device_properties(0).uuid),
                           "copy_GBps": copy_bw / 1e9, "configs": {c: CFGS[c] for c in names}, "rows": []}
    print(res["device"], res["uuid"], f"copy {copy_bw / 1e9:.0f} GB/s", flush=True)
    for k, n in shapes:
        w0, _ = random_gptq(k, n, 128, False, seed=k + n)
        ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
        for m in rows:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            accs = [None if args.flush else torch.zeros(m, n, device="cuda", dtype=torch.float32) for _ in ws]
            floor = call_bytes(w0, m) / copy_bw * 1e6
            row: dict[str, Any] = {"K": k, "N": n, "M": m, "floor_us": floor, "us": {}}
            samples: dict[str, list[float]] = {name: [] for name in names}
            for _ in range(args.repeat):  # the configs in turn, `repeat` rounds: drift hits every config alike
                for name in names:
                    cfg = config_for(name, m, k, n, dtype == torch.float16)
                    try:
                        us = graph_ms([lambda w=w, a=a: kp.pipelined_matmul(x, w, None, arch, config=cfg,
                                                                             accumulate_into=a)
                                       for w, a in zip(ws, accs)]) * 1e3
                    except Exception as exc:  # noqa: BLE001 - a failing config is recorded, not fatal
                        print(f"{k}x{n} m={m} {name}: error {str(exc)[:200]}", flush=True)
                        us = float("nan")
                    samples[name].append(us)
            for name, vals in samples.items():
                row["us"][name] = statistics.median(vals)
            if args.repeat > 1:
                row["samples_us"] = samples
            best = min((v, c) for c, v in row["us"].items() if v == v)
            row["best"] = best[1]
            res["rows"].append(row)
            cells = " ".join(f"{c} {v:5.2f}" for c, v in row["us"].items())
            print(f"{k:>5}x{n:<5} m={m:<2} floor {floor:5.2f} | best {best[1]} {best[0]:5.2f} "
                  f"({floor / best[0] * 100:4.1f}%) | {cells}", flush=True)
            del accs
        del ws
        torch.cuda.empty_cache()
    write_json(args.out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
