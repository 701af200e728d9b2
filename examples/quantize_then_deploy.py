"""Quantize the bundled SmolLM2-135M with GPTQ, save it, reload it on the AMD path, generate, and
print perplexity and speed.

    python examples/quantize_then_deploy.py [--out smollm2-gptq] [--samples 32 --seqlen 512]

Calibration and evaluation use the offline pydoc_data.topics text (first 90% / held-out last 10%).
On a GPU the reloaded model's linears run our Triton W4A16 kernel; on the CPU they dequantize.
"""

from __future__ import annotations

import argparse
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="default")
    parser.add_argument("--out", default="smollm2-gptq")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--seqlen", type=int, default=512)
    parser.add_argument("--eval-windows", type=int, default=8)
    args = parser.parse_args()

    from optimum_amdx import GPTQConfig, GPTQQuantizer, pipeline
    from optimum_amdx.models import default_device, load_causal_lm, load_tokenizer
    from optimum_amdx.quantization import load_gptq_model, perplexity
    from optimum_amdx.quantization.calibration import get_eval_tokens

    device = default_device()
    tokenizer = load_tokenizer(args.model)
    model = load_causal_lm(args.model, dtype=torch.float32, device="cpu")

    # 1. quantize (the algorithm runs on the GPU when there is one) and save a standard GPTQ checkpoint
    quantizer = GPTQQuantizer(GPTQConfig(bits=4, group_size=128, n_samples=args.samples, seqlen=args.seqlen))
    quantizer.quantize(model, tokenizer)
    out = quantizer.save_pretrained(model, args.out, tokenizer, overwrite=True)
    print(f"saved {out} in {quantizer.seconds:.1f} s of quantization")

    # 2. deploy: the usual pipeline, on the AMD (rocm) path; GPTQ folders load with our QuantLinear
    pipe = pipeline("text-generation", model=str(out), accelerator="rocm")
    start = time.perf_counter()
    result = pipe("The three primary colors are", max_new_tokens=32, do_sample=False)
    seconds = time.perf_counter() - start
    print(result[0]["generated_text"])
    print(f"generate: 32 new tokens in {seconds:.2f} s ({32 / seconds:.1f} tokens/s, batch 1, {device})")

    # 3. quality: perplexity of fp and GPTQ on the held-out text
    tokens = get_eval_tokens("pydoc", tokenizer)
    dtype = torch.float16 if device == "cuda" else torch.float32
    quantized = load_gptq_model(out, device, dtype)
    full = load_causal_lm(args.model, dtype=dtype, device=device)
    for name, m in (("unquantized", full), ("GPTQ 4-bit g128", quantized)):
        start = time.perf_counter()
        ppl = perplexity(m, tokens, seqlen=512, max_windows=args.eval_windows)
        print(f"{name:<18} perplexity {ppl:7.3f}  ({args.eval_windows} x 512 tokens in {time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
