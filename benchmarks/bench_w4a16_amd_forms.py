"""The pipelined W4A16 GEMM in the form an AMD family runs, against the routes it replaced there.

Since round 18 the AMD families run the pipelined GEMM in its portable form (plain word loads, the fp16
dequantization in Triton's own int16/fp16 operations, two stages; `_w4a16_pipelined_triton.amd_config`). Per
projection shape and row count, side by side in one run: the fused GEMM (`route="gemm"`, AMD's route before),
dequant + BLAS, and the pipelined GEMM as each family in `--forms` configures it (on an AMD GPU the default is its
own family, so the table checks `w4a16.ROUTE_LIMITS` there; on NVIDIA `--forms cdna,rdna3` emulates them: the
same Triton code, other silicon). `--dtype bf16` times bf16 activations, which AMD sends here only on weights of one
scale group per tile (its bf16 planes of q - z; other layouts are skipped). `--overrides "K=V;K=V"` also times each
form with each override set on its config (an A/B of one knob in one run). Each cell is checked against the float32
reference first. Times are medians of
graph replays over enough weight copies that L2 cannot hold them. Prints a table and writes JSON (--out).
Usage: python benchmarks/bench_w4a16_amd_forms.py --forms cdna,rdna3 --rows 2,16,64,128,256 --out forms.json
"""

from __future__ import annotations

import argparse
import sys

import torch

from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels._w4a16_gemm_triton import family
from optimum_amdx.kernels._w4a16_pipelined_triton import AMD_CLASSES, pipelined_config
from optimum_amdx.kernels._w4a16_triton import _chunks, _group_arg
from optimum_amdx.kernels.runtime import device_arch
from optimum_amdx.kernels.w4a16 import W4A16Weight, w4a16_matmul, w4a16_matmul_reference

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_w4a16 import _clone, parse_configs, random_gptq  # noqa: E402 - this folder is on sys.path when run as a script

SHAPES = {  # name: (K, N, group, act-order); q/k/v and gate/up fused as the engine runs them
    "llama3-qkv": (4096, 6144, 128, False), "o": (4096, 4096, 128, False), "llama3-gate-up": (4096, 28672, 128, False),
    "llama3-down": (14336, 4096, 128, False), "llama2-qkv": (4096, 12288, 128, False),
    "llama2-gate-up": (4096, 22016, 128, False), "llama2-down": (11008, 4096, 128, False),
    "act-order-g32": (4096, 14336, 32, True), "act-order-g128": (4096, 14336, 128, True),
}


def time_us(w0: W4A16Weight, x: torch.Tensor, route: str, config: dict | None = None) -> float:
    """Median microseconds of one call over L2-cold weight copies, replayed from one graph."""
    ws = [w0] + [_clone(w0) for _ in range(l2_cold_copies(w0.qweight.numel() * 4) - 1)]
    return graph_ms([lambda w=w: w4a16_matmul(x, w, route=route, config=config) for w in ws]) * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--forms", help=f"AMD families whose form to time, of {sorted(AMD_CLASSES)} (default: this GPU's)")
    p.add_argument("--rows", default="2,4,16,32,64,128,256", help="row counts, comma-separated")
    p.add_argument("--shapes", default=",".join(SHAPES), help=f"of {sorted(SHAPES)}")
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16", help="activation dtype")
    p.add_argument("--group", type=int, help="scale group size of the shapes without act-order (default: theirs, 128)")
    p.add_argument("--overrides", default="", help="also time each form with these config overrides: K=V:K=V;K=V...")
    p.add_argument("--out", help="write results as JSON here")
    args = p.parse_args()
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        sys.exit("error: this benchmark needs a GPU (torch.cuda).")
    arch = device_arch()
    forms = args.forms.split(",") if args.forms else [family(arch)]
    shapes = args.shapes.split(",")
    bad = [f for f in forms if f not in AMD_CLASSES] + [s for s in shapes if s not in SHAPES]
    if bad:
        sys.exit(f"error: unknown {', '.join(bad)}; --forms takes {sorted(AMD_CLASSES)} (required off AMD), "
                 f"--shapes {sorted(SHAPES)}.")
    rows_list = [int(r) for r in args.rows.split(",")]
    columns = [(form, None, {}) for form in forms] + [(form, name, o) for form in forms
                                                      for name, o in parse_configs(args.overrides)]
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    if dtype == torch.bfloat16:  # AMD runs bf16 here on one scale group per tile only (`pipelined_eligible`)
        shapes = [s for s in shapes if (args.group if args.group and not SHAPES[s][3] else SHAPES[s][2]) >= 128]
    print(f"device {torch.cuda.get_device_name()} ({arch}); forms {', '.join(forms)}; {args.dtype}; us, graph-replayed, "
          "L2-cold")
    print(f"{'shape':16s} {'M':>4s} {'gemm':>7s} {'dequant':>8s} "
          + " ".join(f"{f + (f'[{o}]' if o else ''):>16s}" for f, o, _ in columns))
    results = []
    for name in shapes:
        k, n, group, act_order = SHAPES[name]
        group = args.group if args.group and not act_order else group
        w, _ = random_gptq(k, n, group, act_order, seed=0, asym=act_order)
        chunks = _chunks(_group_arg(w))
        for m in rows_list:
            x = torch.randn(m, k, device="cuda", dtype=dtype)
            ref = w4a16_matmul_reference(x, w).float()
            row = {"shape": name, "k": k, "n": n, "group": group, "act_order": act_order, "m": m,
                   "gemm_us": time_us(w, x, "gemm"), "dequant_us": time_us(w, x, "dequant"), "forms": {}}
            cells = []
            for form, override, values in columns:
                cfg = {**pipelined_config(m, k, n, chunks, dtype == torch.float16, form), **values}
                out = w4a16_matmul(x, w, route="pipelined", config=dict(cfg)).float()
                err = ((out - ref).abs().max() / ref.abs().max()).item()
                if err > (4e-3 if dtype == torch.float16 else 2e-2):
                    sys.exit(f"error: {name} at {m} rows in the {form} form is off by {err:.1e} of the largest output")
                us = time_us(w, x, "pipelined", dict(cfg))
                row["forms"][form + (f"[{override}]" if override else "")] = {"us": us, "config": cfg, "err": err}
                cells.append(f"{us:7.1f} ({min(row['gemm_us'], row['dequant_us']) / us:4.2f}x)")
            results.append(row)
            print(f"{name:16s} {m:4d} {row['gemm_us']:7.1f} {row['dequant_us']:8.1f} "
                  + " ".join(f"{c:>16s}" for c in cells), flush=True)
    print("(x) = the better of the fused GEMM and dequant + BLAS over the form's time")
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(), "arch": arch, "dtype": args.dtype,
                              "uuid": str(torch.cuda.get_device_properties(0).uuid), "forms": forms,
                              "results": results})


if __name__ == "__main__":
    main()
