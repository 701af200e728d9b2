"""GPTQ quantization time of a 7B-shaped Llama (random weights) on one GPU, and a W4A16 kernel check.

Quantizes `--shape` (default llama-2-7b: 32 layers, hidden 4096, MLP 11008) built in fp16 on the
GPU with `--samples` x `--seqlen` random calibration token ids (128 x 2048 by default; token
identity does not change the work), 4-bit, group size 128, true-sequential. Prints the floor first:
the FLOPs of the Hessian accumulation (fp32) and of the block forward passes (fp16), each over the
matmul rate measured here. Then checks `QuantLinear`'s W4A16 kernel path against dequantize+matmul
on the quantized layers, at decode and prefill row counts.

    python benchmarks/gptq_speed.py --out gptq_speed.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from optimum_amdx.benchmark.ceilings import measure_matmul_flops


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()



def _kernel_check(model, device: str) -> list[dict]:
    from optimum_amdx.quantization import QuantLinear

    rows = []
    layers = model.model.layers
    picks = [("layers.0.self_attn.q_proj", layers[0].self_attn.q_proj),
             ("layers.0.mlp.down_proj", layers[0].mlp.down_proj),
             (f"layers.{len(layers) - 1}.mlp.gate_proj", layers[-1].mlp.gate_proj)]
    g = torch.Generator(device=device).manual_seed(0)
    for name, layer in picks:
        assert isinstance(layer, QuantLinear)
        w = layer.dequantize().t()  # [K, N] float32
        for m in (1, 16, 512):
            x = torch.randn(m, layer.in_features, device=device, dtype=torch.float16, generator=g)
            out = layer(x).float()
            ref = x.float() @ w
            err = float((out - ref).abs().max())
            scale = float(ref.abs().max())
            rows.append({"layer": name, "m": m, "max_abs_err": err, "ref_max": scale, "rel": err / scale,
                         "kernel_ready": bool(layer.kernel_weight().kernel_ready)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=2048)
    parser.add_argument("--desc-act", action="store_true")
    parser.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke test of the script)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    dev = args.device

    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config
    from optimum_amdx.quantization import GPTQConfig, GPTQQuantizer

    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no GPU visible; pass --device cpu for a smoke test")
    device_name = torch.cuda.get_device_name(0) if dev == "cuda" else "cpu"
    cfg = shape_config(args.shape)
    hidden, inter, n_layers = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    kv = hidden * cfg.num_key_value_heads // cfg.num_attention_heads
    tokens = args.samples * args.seqlen
    layer_params = hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inter
    hessian_flops = n_layers * 2 * tokens * (3 * hidden**2 + inter**2)
    forward_passes = 5  # 4 true-sequential steps (q/k/v, o, gate/up, down) + 1 output pass per block
    forward_flops = n_layers * forward_passes * 2 * tokens * layer_params
    fp32_rate = measure_matmul_flops(dev, torch.float32)
    fp16_rate = measure_matmul_flops(dev, torch.float16)
    floor_s = hessian_flops / fp32_rate + forward_flops / fp16_rate
    print(f"device {device_name}; matmul fp32 {fp32_rate / 1e12:.1f} TF/s, fp16 {fp16_rate / 1e12:.1f} TF/s")
    print(f"floor: Hessians {hessian_flops / 1e15:.2f} PFLOP fp32 -> {hessian_flops / fp32_rate:.0f} s; "
          f"block forwards {forward_flops / 1e15:.2f} PFLOP fp16 -> {forward_flops / fp16_rate:.0f} s; total {floor_s:.0f} s")

    torch.manual_seed(0)
    t0 = time.perf_counter()
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float16 if dev == "cuda" else torch.float32).eval()
    _sync(dev)
    build_s = time.perf_counter() - t0
    gen = torch.Generator().manual_seed(0)
    samples = [torch.randint(0, cfg.vocab_size, (1, args.seqlen), generator=gen) for _ in range(args.samples)]
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=128, desc_act=args.desc_act, n_samples=args.samples,
                                         seqlen=args.seqlen), device=dev, verbose=True)
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    quantizer.quantize(model, dataset=samples)
    _sync(dev)
    quant_s = time.perf_counter() - t0
    peak_gb = torch.cuda.max_memory_allocated() / 2**30 if dev == "cuda" else 0.0
    phases = {}
    for s in quantizer.stats:
        phases[s.modules] = phases.get(s.modules, 0.0) + s.seconds
    kernel_rows = _kernel_check(model, dev)
    result = {"device": device_name, "shape": args.shape, "samples": args.samples, "seqlen": args.seqlen,
              "desc_act": args.desc_act, "build_s": build_s, "quantize_s": quant_s, "peak_gib": peak_gb,
              "floor_s": floor_s, "fp32_tflops": fp32_rate / 1e12, "fp16_tflops": fp16_rate / 1e12,
              "gptq_solve_s_by_group": phases, "kernel_check": kernel_rows, "under_5_min": quant_s < 300}
    print(f"\n{args.shape} GPTQ 4-bit g128 on {device_name}: {args.samples} x {args.seqlen} tokens")
    print(f"{'quantize (s)':<28}{quant_s:>10.1f}   (floor {floor_s:.0f} s, target < 300 s)")
    print(f"{'GPTQ solves (s)':<28}{sum(phases.values()):>10.1f}   " + ", ".join(f"{k} {v:.1f}" for k, v in phases.items()))
    print(f"{'peak GPU memory (GiB)':<28}{peak_gb:>10.1f}")
    print(f"\n{'layer':<28}{'m':>5}{'max |err|':>12}{'|ref| max':>11}{'rel':>10}  kernel")
    for r in kernel_rows:
        print(f"{r['layer']:<28}{r['m']:>5}{r['max_abs_err']:>12.3e}{r['ref_max']:>11.3f}{r['rel']:>10.2e}  {r['kernel_ready']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
