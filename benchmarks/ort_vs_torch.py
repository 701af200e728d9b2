"""ONNX Runtime (our export, fp32, optimized) against PyTorch eager on the CPU.

1. SmolLM2-135M greedy decoding, batch 1, 128 new tokens, both through transformers' generate():
   decode tokens/s and prefill latency; also checks both produce the same tokens.
2. all-MiniLM-L6-v2 sentence embeddings (mean pooling): sentences/s at batch 32.

Runs alternate between the two runtimes so background load hits both alike; the median of
`--runs` is reported. The floors are measured here too: fp32 decode must stream every weight
once per token (bytes / measured copy bandwidth) and do 2 FLOPs per weight (FLOPs / measured
matmul rate). Prints a table and writes JSON (`--out`).
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


def measure_copy_bandwidth(trials: int = 10) -> float:
    """Bytes read + written per second for a 256 MiB float32 copy: the best of `trials`.

    A floor is a best case, and on a shared machine other jobs only ever make a trial slower,
    so the fastest trial is the closest to what the memory system can do.
    """
    import numpy as np

    src = np.random.default_rng(0).standard_normal(64 * 1024 * 1024, dtype=np.float32)
    dst = np.empty_like(src)
    times = []
    for _ in range(trials):
        t = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return 2 * src.nbytes / min(times)


def measure_matvec_rate(hidden: int = 576, out: int = 1536) -> float:
    """FLOP/s of a batch-1 fp32 matrix-vector product of decode's shape (best of 50, see above)."""
    import torch

    w = torch.randn(out, hidden)
    x = torch.randn(1, hidden)
    for _ in range(5):
        x @ w.T
    times = []
    for _ in range(50):
        t = time.perf_counter()
        x @ w.T
        times.append(time.perf_counter() - t)
    return 2 * hidden * out / min(times)


def bench_decoder(model_name: str, onnx_dir: Path | None, new_tokens: int, runs: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from optimum_amdx.exporters import export_model
    from optimum_amdx.models import resolve_model
    from optimum_amdx.onnxruntime import ORTModelForCausalLM

    src = resolve_model(model_name)
    tok = AutoTokenizer.from_pretrained(src)
    if onnx_dir is None or not (onnx_dir / "model.onnx").is_file():
        onnx_dir = onnx_dir or Path("out/bench-smollm2-onnx")
        export_model(src, onnx_dir, optimize="extended", overwrite=True)
    pt = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    ort_model = ORTModelForCausalLM.from_pretrained(onnx_dir, provider="cpu")
    prompt = "Explain in a few paragraphs why the sky is blue and why sunsets are red."
    inputs = tok(prompt, return_tensors="pt")
    gen = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.eos_token_id)

    def timed(model, n_new):
        kwargs = dict(gen, max_new_tokens=n_new, min_new_tokens=n_new)
        t = time.perf_counter()
        out = model.generate(**inputs, **kwargs)
        return time.perf_counter() - t, out

    for model in (pt, ort_model):  # warm-up
        timed(model, 4)
    results: dict[str, dict[str, list]] = {"torch": {"total": [], "prefill": []}, "ort": {"total": [], "prefill": []}}
    outputs = {}
    with torch.inference_mode():
        for _ in range(runs):
            for name, model in (("torch", pt), ("ort", ort_model)):
                prefill, _ = timed(model, 1)
                total, out = timed(model, new_tokens)
                results[name]["prefill"].append(prefill)
                results[name]["total"].append(total)
                outputs[name] = out
    summary = {}
    for name, r in results.items():
        total, prefill = statistics.median(r["total"]), statistics.median(r["prefill"])
        summary[name] = {
            "tokens_per_s": new_tokens / total,
            "decode_tokens_per_s": (new_tokens - 1) / max(total - prefill, 1e-9),
            "prefill_s": prefill,
            "total_s": total,
        }
    params = sum(p.numel() for p in pt.parameters())
    return {
        "model": str(src.name),
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "new_tokens": new_tokens,
        "runs": runs,
        "parameters": params,
        "same_tokens": bool(torch.equal(outputs["torch"], outputs["ort"])),
        "torch": summary["torch"],
        "ort": summary["ort"],
        "speedup_decode": summary["ort"]["decode_tokens_per_s"] / summary["torch"]["decode_tokens_per_s"],
        "onnx_dir": str(onnx_dir),
        "ort_providers": ort_model.providers,
    }


def bench_encoder(model_name: str, batch: int, runs: int) -> dict:
    import torch
    from transformers import AutoModel, AutoTokenizer

    from optimum_amdx.models import resolve_model
    from optimum_amdx.onnxruntime import ORTModelForFeatureExtraction, mean_pooling

    src = resolve_model(model_name)
    tok = AutoTokenizer.from_pretrained(src)
    pt = AutoModel.from_pretrained(src, dtype=torch.float32).eval()
    ort_model = ORTModelForFeatureExtraction.from_pretrained(src, export=True, export_kwargs={"optimize": "extended"},
                                                             provider="cpu")
    words = ("the quick brown fox jumps over a lazy dog while researchers measure embeddings of short "
             "sentences on two cores").split()
    sentences = [" ".join(words[(i * 7) % len(words):] + words[: (i * 7) % len(words)][: 5 + i % 9]) for i in range(batch)]
    enc = tok(sentences, padding=True, return_tensors="pt")

    def run(model):
        t = time.perf_counter()
        with torch.inference_mode():
            hidden = model(**enc).last_hidden_state
        emb = mean_pooling(hidden, enc["attention_mask"])
        return time.perf_counter() - t, emb

    run(pt), run(ort_model)
    times = {"torch": [], "ort": []}
    embs = {}
    for _ in range(runs):
        for name, model in (("torch", pt), ("ort", ort_model)):
            dt, embs[name] = run(model)
            times[name].append(dt)
    per_s = {name: batch / statistics.median(t) for name, t in times.items()}
    return {
        "model": str(src.name),
        "batch": batch,
        "tokens_per_sentence_padded": int(enc["input_ids"].shape[1]),
        "torch_sentences_per_s": per_s["torch"],
        "ort_sentences_per_s": per_s["ort"],
        "speedup": per_s["ort"] / per_s["torch"],
        "max_abs_diff_embeddings": float((embs["torch"] - embs["ort"]).abs().max()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default")
    parser.add_argument("--encoder", default="all-minilm-l6-v2")
    parser.add_argument("--onnx-dir", type=Path, default=None, help="Reuse an existing optimized export.")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import onnxruntime
    import torch

    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
               "onnxruntime": onnxruntime.__version__, "load_average_start": os.getloadavg()}
    copy_bw = measure_copy_bandwidth()
    matvec = measure_matvec_rate()
    dec = bench_decoder(args.model, args.onnx_dir, args.new_tokens, args.runs)
    enc = bench_encoder(args.encoder, args.batch, args.runs)
    machine["load_average_end"] = os.getloadavg()
    copy_bw = max(copy_bw, measure_copy_bandwidth())
    weight_bytes = dec["parameters"] * 4
    floors = {
        "copy_bandwidth_GBps": copy_bw / 1e9,
        "matvec_GFLOPs": matvec / 1e9,
        "decode_floor_bandwidth_tokens_per_s": copy_bw / 2 / weight_bytes,
        "decode_floor_compute_tokens_per_s": matvec / (2 * dec["parameters"]),
    }
    for name in ("torch", "ort"):
        dec[name]["percent_of_bandwidth_floor"] = 100 * dec[name]["decode_tokens_per_s"] / floors[
            "decode_floor_bandwidth_tokens_per_s"]
    report = {"machine": machine, "floors": floors, "decoder": dec, "encoder": enc}

    print(f"\nMachine: {machine['cores']} CPU cores, torch {machine['torch']}, onnxruntime {machine['onnxruntime']}, "
          f"load avg {machine['load_average_start'][0]:.1f} -> {machine['load_average_end'][0]:.1f}")
    print(f"Floors: copy {floors['copy_bandwidth_GBps']:.1f} GB/s (read+write) -> {weight_bytes / 1e6:.0f} MB of fp32 "
          f"weights per token: <= {floors['decode_floor_bandwidth_tokens_per_s']:.0f} tok/s; matvec "
          f"{floors['matvec_GFLOPs']:.1f} GFLOP/s -> <= {floors['decode_floor_compute_tokens_per_s']:.0f} tok/s")
    print(f"\n| {dec['model']} greedy, {dec['new_tokens']} new tokens, batch 1 | decode tok/s | % of bandwidth floor "
          f"| prefill ({dec['prompt_tokens']} tok) s | total s |")
    print("|---|---|---|---|---|")
    for name in ("torch", "ort"):
        r = dec[name]
        print(f"| {'PyTorch eager fp32' if name == 'torch' else 'ORT CPU EP fp32 optimized'} | {r['decode_tokens_per_s']:.1f} | "
              f"{r['percent_of_bandwidth_floor']:.0f}% | {r['prefill_s']:.3f} | {r['total_s']:.2f} |")
    print(f"ORT / PyTorch decode: {dec['speedup_decode']:.2f}x; same greedy tokens: {dec['same_tokens']}")
    print(f"\n| {enc['model']} batch {enc['batch']} (padded to {enc['tokens_per_sentence_padded']} tokens) | sentences/s |")
    print("|---|---|")
    print(f"| PyTorch eager fp32 | {enc['torch_sentences_per_s']:.1f} |")
    print(f"| ORT CPU EP fp32 optimized | {enc['ort_sentences_per_s']:.1f} |")
    print(f"ORT / PyTorch: {enc['speedup']:.2f}x; embeddings max abs diff {enc['max_abs_diff_embeddings']:.2e}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
