"""Static-shape (fixed-capacity KV cache, MIGraphX layout) vs dynamic decoder graphs on ONNX Runtime's CPU provider.

SmolLM2-135M fp32, batch 1, greedy, through transformers' generate(). Three configurations:
the dynamic export (the cache grows each step), the static export running its prefill/decode
bucket graphs (one session each, what MIGraphX compiles), and the static export from its one
model.onnx session. The static graphs attend over the whole buffer every step (capacity slots,
masked), so on a CPU they do more work than the dynamic graph at short contexts; on MIGraphX the
fixed shapes are what avoids a recompile per step. Runs alternate between configurations so
background load hits all alike; medians of `--runs`. Prints a table and writes JSON (`--out`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--work-dir", type=Path, default=Path("out/bench-static"),
                        help="Where the two exports are written (reused when present).")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--prompt-bucket", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import onnxruntime
    import torch
    from transformers import AutoTokenizer

    from optimum_amdx.exporters import StaticShapes, export_model
    from optimum_amdx.models import resolve_model
    from optimum_amdx.onnxruntime import ORTModelForCausalLM

    src = resolve_model(args.model)
    tok = AutoTokenizer.from_pretrained(src)
    capacity = args.prompt_bucket + args.new_tokens
    dynamic_dir, static_dir = args.work_dir / "dynamic", args.work_dir / f"static-s{args.prompt_bucket}-c{capacity}"
    export_s = {}
    for folder, shapes in ((dynamic_dir, None), (static_dir, StaticShapes((1,), (args.prompt_bucket,), capacity))):
        if not (folder / "amdx_export.json").is_file():
            t = time.perf_counter()
            export_model(src, folder, static_shapes=shapes, overwrite=True)
            export_s[folder.name] = time.perf_counter() - t

    models = {
        "dynamic": ORTModelForCausalLM.from_pretrained(dynamic_dir, provider="cpu"),
        "static buckets": ORTModelForCausalLM.from_pretrained(static_dir, provider="cpu"),
        "static one session": ORTModelForCausalLM.from_pretrained(static_dir, provider="cpu", use_static_shapes=False),
    }
    prompt = "Explain in a few paragraphs why the sky is blue and why sunsets are red."
    inputs = tok(prompt, return_tensors="pt")

    def timed(model, n_new):
        t = time.perf_counter()
        out = model.generate(**inputs, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
                             pad_token_id=tok.eos_token_id)
        return time.perf_counter() - t, out

    load_start = os.getloadavg()
    for model in models.values():
        timed(model, 4)  # warm-up (sessions are created lazily)
    times = {name: {"prefill": [], "total": []} for name in models}
    outputs = {}
    with torch.inference_mode():
        for _ in range(args.runs):
            for name, model in models.items():
                prefill, _ = timed(model, 1)
                total, outputs[name] = timed(model, args.new_tokens)
                times[name]["prefill"].append(prefill)
                times[name]["total"].append(total)
    summary = {}
    for name, t in times.items():
        total, prefill = statistics.median(t["total"]), statistics.median(t["prefill"])
        summary[name] = {"prefill_s": prefill, "total_s": total,
                         "decode_tokens_per_s": (args.new_tokens - 1) / max(total - prefill, 1e-9)}
    same = all(torch.equal(outputs["dynamic"], o) for o in outputs.values())
    report = {
        "device": "2-core CPU (this machine)",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
                    "load_average_start": load_start, "load_average_end": os.getloadavg()},
        "model": src.name, "prompt_tokens": int(inputs["input_ids"].shape[1]), "prompt_bucket": args.prompt_bucket,
        "capacity": capacity, "new_tokens": args.new_tokens, "runs": args.runs, "same_greedy_tokens": same,
        "export_seconds": export_s, "results": summary,
    }
    m = report["machine"]
    print(f"\n{report['model']} fp32, batch 1, greedy, {args.new_tokens} new tokens, prompt {report['prompt_tokens']} "
          f"tokens (static: bucket {args.prompt_bucket}, capacity {capacity}); {m['cores']} CPU cores, onnxruntime "
          f"{m['onnxruntime']}, load avg {m['load_average_start'][0]:.1f} -> {m['load_average_end'][0]:.1f}")
    print("\n| graphs (ORT CPU EP) | decode tok/s | prefill s | total s |")
    print("|---|---|---|---|")
    for name, r in summary.items():
        print(f"| {name} | {r['decode_tokens_per_s']:.1f} | {r['prefill_s']:.3f} | {r['total_s']:.2f} |")
    print(f"same greedy tokens in all three: {same}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
