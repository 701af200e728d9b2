"""Fit the one-row W4A16 times of a `bench_w4a16.py --m1-only` JSON to ``fixed + per_tile * tiles_per_program``.

The stream kernel gives each of its programs (programs per SM x SMs, at most one per 128x128 tile) an
equal run of tiles, so its time should grow with the tiles each program streams; the intercept is what a
call costs besides streaming (launch, the first load's latency, the split-K flush) and the slope is the
steady streaming rate. Least squares per layout (group, act-order), on the device figures in the JSON.
Usage: python benchmarks/m1_cost_model.py benchmarks/results/w4a16-m1-final-h100.json [--programs 528] [--out fit.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Optional

from optimum_amdx.io import result_path_or_exit, write_json

TILE = 128
TILE_BYTES = TILE * TILE // 2
"""Bytes of packed 4-bit words in one 128 x 128 tile."""


def least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else float("nan")
    return my - slope * mx, slope


def fit(rows: list[dict[str, Any]], programs: int) -> list[dict[str, Any]]:
    """One least-squares line per (group, act_order) over the shapes of `rows` (the JSON's "m1" list)."""
    out = []
    layouts = sorted({(r["group"], bool(r["act_order"])) for r in rows})
    for group, act in layouts:
        pts = []
        for r in rows:
            if r["group"] != group or bool(r["act_order"]) != act:
                continue
            tiles = math.ceil(r["K"] / TILE) * math.ceil(r["N"] / TILE)
            pts.append((tiles / min(programs, tiles), r["ms"] * 1e3, r))
        n = len(pts)
        fixed, slope = least_squares([(p[0], p[1]) for p in pts])
        resid = max(abs(fixed + slope * p[0] - p[1]) for p in pts)
        out.append({"group": group, "act_order": act, "shapes": n, "fixed_us": fixed, "per_tile_us": slope,
                    "stream_TB_s": programs * TILE_BYTES / (slope * 1e-6) / 1e12, "max_residual_us": resid,
                    "fixed_share": {f"{p[2]['K']}x{p[2]['N']}": fixed / p[1] for p in pts}})
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="a bench_w4a16.py JSON with an 'm1' list (K, N, group, act_order, ms)")
    parser.add_argument("--programs", type=int, default=4 * 132,
                        help="programs of the stream grid (default: H100, 132 SMs x 4 resident 8-warp programs)")
    parser.add_argument("--out", help="write the fit as JSON here")
    args = parser.parse_args(argv)
    if args.out:
        result_path_or_exit(args.out)  # before any work; --out replaces only a result we wrote
    with open(args.json) as f:
        data = json.load(f)
    if not data.get("m1"):
        print(f"{args.json} has no 'm1' rows (run bench_w4a16.py --m1-only)", file=sys.stderr)
        return 2
    result = {"source": args.json, "device": data.get("device"), "copy_GB_s": data.get("copy_GB_s"),
              "programs": args.programs, "fits": fit(data["m1"], args.programs)}
    copy = data.get("copy_GB_s")
    print(f"{result['device']}: time = fixed + per_tile x tiles per program ({args.programs} programs)")
    print(f"{'group':>5} {'act':>4} {'fixed us':>9} {'per tile us':>12} {'stream TB/s':>12} {'% copy':>7} {'max resid':>10}")
    for r in result["fits"]:
        pct = 100 * r["stream_TB_s"] * 1e3 / copy if copy else float("nan")
        print(f"{r['group']:>5} {int(r['act_order']):>4} {r['fixed_us']:9.2f} {r['per_tile_us']:12.3f} "
              f"{r['stream_TB_s']:12.2f} {pct:7.1f} {r['max_residual_us']:10.2f}")
    if args.out:
        write_json(args.out, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
