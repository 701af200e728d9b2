"""Tensor-parallel greedy decode: TP=1 vs TP=2 (transformers TP and DeepSpeed AutoTP), same tokens?

    python benchmarks/tp_generate.py --shape llama-1b --dtype bfloat16 --batches 1,8 --out tp.json

Builds a seeded random-weight model of the named shape, then starts examples/tp_generate.py
through `optimum_amdx.distributed.launch` (topology-aware GPU choice, visible-device variables) for
TP=1 and for TP=2 with each backend. Prints a table (tokens/s, equality with TP=1) and writes JSON.

Floor: batch-1 decode reads every weight once per token, so per GPU a token costs at least
(2 bytes x parameters / TP) / measured copy bandwidth. The script measures the copy bandwidth on
GPU 0 in the same run. Eager transformers decode is bound by kernel launches at this size, far
above that floor; the table reports both.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _copy_bandwidth_tbs() -> float | None:
    """Measured device-to-device copy on GPU 0 in TB/s (bytes read + written), None without a GPU."""
    import torch

    from optimum_amdx.benchmark.ceilings import measure_copy_bandwidth

    return measure_copy_bandwidth("cuda") / 1e12 if torch.cuda.is_available() else None


def make_model(shape: str, dtype: str, seed: int, out: Path) -> int:
    """Seeded random weights of `shape`, saved as safetensors; returns the parameter count."""
    import torch
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config

    torch.manual_seed(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return n



def run_case(model_dir: Path, tp: int, backend: str, args, workdir: Path) -> dict:
    from optimum_amdx.distributed.launch import plan_launch

    out = workdir / f"tp{tp}_{backend}_{args.dtype}.json"
    script = ["examples/tp_generate.py", "--model", str(model_dir), "--backend", backend, "--dtype", args.dtype,
              "--batch", args.batches, "--prompt-len", str(args.prompt_len), "--max-new-tokens",
              str(args.max_new_tokens), "--repeats", str(args.repeats), "--seed", str(args.seed), "--out", str(out)]
    plan = plan_launch(script, tp, cpu=args.cpu)
    env = plan.environment()
    if args.cpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
    start = time.perf_counter()
    proc = subprocess.run(plan.command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.case_timeout)
    case = {"tp": tp, "backend": backend, "dtype": args.dtype, "devices": plan.devices,
            "choice": plan.explanation, "wall_s": time.perf_counter() - start, "returncode": proc.returncode}
    if proc.returncode == 0 and out.exists():
        case.update(json.loads(out.read_text()))
    else:
        case["error"] = (proc.stderr or proc.stdout)[-2500:]
    return case


def first_difference(a: list[list[int]], b: list[list[int]]) -> int | None:
    """Index of the first generated position where any sequence differs; None when equal."""
    for row_a, row_b in zip(a, b):
        for k, (x, y) in enumerate(zip(row_a, row_b)):
            if x != y:
                return k
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-1b")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--backends", default="transformers,deepspeed")
    parser.add_argument("--fp32-recheck", action="store_true",
                        help="when 16-bit TP tokens differ from TP=1, repeat the comparison in float32")
    parser.add_argument("--cpu", action="store_true", help="CPU processes over gloo (for a smoke test)")
    parser.add_argument("--case-timeout", type=int, default=240)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)

    import torch

    workdir = Path(tempfile.mkdtemp(prefix="tp_bench_"))
    model_dir = workdir / f"{args.shape}-{args.dtype}"
    n_params = make_model(args.shape, args.dtype, args.seed, model_dir)
    bw = _copy_bandwidth_tbs()
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"

    cases = [run_case(model_dir, 1, "none", args, workdir)]
    for backend in [b for b in args.backends.split(",") if b]:
        cases.append(run_case(model_dir, args.tp, backend, args, workdir))
    reference = cases[0]
    if args.fp32_recheck and args.dtype != "float32":
        ref_runs = {r["batch"]: r["tokens"] for r in reference.get("runs", [])}
        mismatch = [c for c in cases[1:] if "runs" in c and any(first_difference(r["tokens"], ref_runs[r["batch"]])
                                                                 is not None for r in c["runs"])]
        if mismatch:
            args32 = argparse.Namespace(**{**vars(args), "dtype": "float32", "repeats": 0})
            dir32 = workdir / f"{args.shape}-float32"
            make_model(args.shape, "float32", args.seed, dir32)
            cases.append(run_case(dir32, 1, "none", args32, workdir))
            for c in mismatch:
                cases.append(run_case(dir32, args.tp, c["backend"], args32, workdir))

    rows = []
    refs = {(c["dtype"], r["batch"]): r["tokens"] for c in cases if c["tp"] == 1 and "runs" in c for r in c["runs"]}
    for c in cases:
        if "runs" not in c:
            rows.append({"tp": c["tp"], "backend": c["backend"], "dtype": c["dtype"], "batch": "-",
                         "error": c.get("error", "")[-300:]})
            continue
        for r in c["runs"]:
            ref = refs.get((c["dtype"], r["batch"]))
            diff = None if ref is None else first_difference(r["tokens"], ref)
            bytes_per_param = 4 if c["dtype"] == "float32" else 2
            floor_ms = (bytes_per_param * n_params / c["tp"] / (bw * 1e12) * 1e3) if bw else None
            per_token_ms = r["seconds_median"] / args.max_new_tokens * 1e3 if r["seconds_median"] else None
            rows.append({"tp": c["tp"], "backend": c["backend"], "dtype": c["dtype"], "batch": r["batch"],
                         "tokens_per_s": r["tokens_per_s"], "ms_per_step": per_token_ms, "floor_ms_per_step": floor_ms,
                         "same_tokens_as_tp1": diff is None, "first_difference_at": diff, "devices": c["devices"]})

    print(f"\n{args.shape} ({n_params / 1e9:.2f}B params, random weights), {device}, copy bandwidth "
          f"{bw:.2f} TB/s" if bw else f"\n{args.shape}, {device}")
    print(f"{'TP':>3} {'backend':<13} {'dtype':<9} {'batch':>5} {'tok/s':>9} {'ms/step':>8} {'floor ms':>8}  same as TP=1")
    for r in rows:
        if "error" in r:
            print(f"{r['tp']:>3} {r['backend']:<13} {r['dtype']:<9} {'-':>5}  FAILED: {r['error'].splitlines()[-1:]}")
            continue
        tps = f"{r['tokens_per_s']:.1f}" if r["tokens_per_s"] else "-"
        ms = f"{r['ms_per_step']:.2f}" if r["ms_per_step"] else "-"
        floor = f"{r['floor_ms_per_step']:.3f}" if r["floor_ms_per_step"] else "-"
        same = "yes" if r["same_tokens_as_tp1"] else f"no (first at {r['first_difference_at']})"
        print(f"{r['tp']:>3} {r['backend']:<13} {r['dtype']:<9} {r['batch']:>5} {tps:>9} {ms:>8} {floor:>8}  {same}")
    result = {"shape": args.shape, "num_params": n_params, "device": device, "copy_bandwidth_tbs": bw,
              "max_new_tokens": args.max_new_tokens, "prompt_len": args.prompt_len, "rows": rows, "cases": cases}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str))
        print(f"wrote {args.out}")
    return 0 if all("error" not in r and r["same_tokens_as_tp1"] for r in rows if r["dtype"] == args.dtype) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
