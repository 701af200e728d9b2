"""The act-order x gather of the W4A16 GEMMs on a GPU: the column kernel against the row kernel.

An act-order weight (and one whose K is off the 128-row tiles) makes the pipelined and fused GEMMs gather x into
the layout's row order once per call (`_w4a16_gemm_triton.gather_x`). The column kernel loads each element from
its scattered source column (2-byte loads, one L1 wavefront each); the row kernel reads each row whole, coalesced,
and gathers on chip (`tl.gather`), whole rows per program or chunks of a row re-read from L2. Per K and row count,
side by side in one run: the column kernel, the default choice (`gather_form`), and row-kernel forms
(ROW, CHUNK, warps). Times are medians of graph replays over enough copies of x that L2 cannot hold them; the
floor is the read and write of x over the measured copy bandwidth (at most 16 copies: at few rows x stays in L2, as
where its producer just wrote it). Prints a table and writes JSON (--out).
Usage: python benchmarks/bench_w4a16_gather.py --k 4096,14336 --rows 1,16,256 --out gather.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

import torch

from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth
from optimum_amdx.benchmark.timing import graph_ms, l2_cold_copies
from optimum_amdx.io import result_path_or_exit, write_json
from optimum_amdx.kernels._w4a16_gemm_triton import gather_form, gather_x
from optimum_amdx.kernels.runtime import compute_units

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_w4a16 import random_gptq  # noqa: E402 - this folder is on sys.path when run as a script


def forms_for(k: int, m: int) -> dict[str, Optional[tuple[int, int, int]] | str]:
    """The forms timed for one cell: the column kernel, the default, and the row kernel's variants."""
    row = 1 << (k - 1).bit_length()
    forms: dict[str, Optional[tuple[int, int, int]] | str] = {"cols": None, "auto": "auto"}
    for chunk in sorted({row, max(1024, row // 4), 4096, 1024}, reverse=True):
        for warps in (4, 8, 16):
            if chunk <= row and (row, chunk, warps) != gather_form(m, k):
                forms[f"rows{chunk}/w{warps}"] = (row, chunk, warps)
    return forms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--k", default="4096,11008,14336", help="input widths K, comma-separated")
    p.add_argument("--rows", default="1,16,64,256,1024,2048", help="row counts, comma-separated")
    p.add_argument("--out", help="write results as JSON here")
    args = p.parse_args()
    if args.out:
        result_path_or_exit(args.out)  # before any measuring; --out replaces only a result we wrote
    if not torch.cuda.is_available():
        sys.exit("bench_w4a16_gather.py needs a GPU (torch.cuda).")
    dev = torch.device("cuda")
    units = compute_units(dev)
    copy_gbs = measure_copy_bandwidth("cuda") / 1e9
    results: list[dict[str, Any]] = []
    print(f"{torch.cuda.get_device_name()}, {units} SMs/CUs, copy {copy_gbs:.0f} GB/s")
    for k in (int(v) for v in args.k.split(",")):
        w, _ = random_gptq(k, 128, 128, act_order=True, seed=k)
        for m in (int(v) for v in args.rows.split(",")):
            nbytes = 2 * m * k * 2
            copies = min(l2_cold_copies(nbytes), 16)  # few rows: x stays in L2, as where its producer just wrote it
            xs = [torch.randn(m, k, device=dev, dtype=torch.float16) for _ in range(copies)]
            ref = gather_x(xs[0], w, True, None)
            floor_us = nbytes / (copy_gbs * 1e3)
            cells: dict[str, float] = {}
            for name, form in forms_for(k, m).items():
                if not torch.equal(gather_x(xs[0], w, True, form), ref):
                    sys.exit(f"form {name} gathered other values than the column kernel (K={k}, M={m})")
                cells[name] = graph_ms([lambda x=x, f=form: gather_x(x, w, True, f) for x in xs]) * 1e3
            best = min((v, n) for n, v in cells.items() if n not in ("cols", "auto"))
            print(f"K={k:6d} M={m:5d} floor {floor_us:6.2f} us | cols {cells['cols']:7.2f} | auto "
                  f"{cells['auto']:7.2f} {gather_form(m, k)} | best row form {best[1]} {best[0]:7.2f} | "
                  f"cols/auto {cells['cols'] / cells['auto']:.2f}x")
            results.append({"k": k, "rows": m, "floor_us": floor_us, "auto_form": gather_form(m, k),
                            "us": cells})
    if args.out:
        write_json(args.out, {"device": torch.cuda.get_device_name(),
                              "uuid": str(torch.cuda.get_device_properties(0).uuid), "copy_gbs": copy_gbs,
                              "results": results})


if __name__ == "__main__":
    main()
