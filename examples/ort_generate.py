"""Export a causal LM to ONNX, then generate with ONNX Runtime through a transformers pipeline.

    python examples/ort_generate.py                       # bundled SmolLM2-135M, CPU (or your AMD GPU EP)
    python examples/ort_generate.py --model <id|dir> --out out/my-onnx --provider migraphx
    python examples/ort_generate.py --static --out out/smollm2-static --provider migraphx   # MIGraphX layout

Same as `optimum-cli export rocm --model default out/smollm2-onnx` followed by
`pipeline("text-generation", model="out/smollm2-onnx", accelerator="ort")`. With `--static` the export
has a fixed-capacity KV cache and fixed-shape prefill/decode graphs (what MIGraphX compiles once).
"""

from __future__ import annotations

import argparse
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="default", help="Hub id, local folder or 'default' (SmolLM2-135M).")
    parser.add_argument("--out", type=Path, default=Path("out/smollm2-onnx"), help="Where the ONNX export goes.")
    parser.add_argument("--provider", default=None, help="migraphx, rocm, cuda or cpu (default: best available).")
    parser.add_argument("--prompt", default="The three primary colors are")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--static", action="store_true",
                        help="Static shapes: batch bucket 1, prompt buckets 32/128, 256 KV slots.")
    parser.add_argument("--migraphx-cache", default=None, help="Folder where MIGraphX keeps compiled programs.")
    args = parser.parse_args()

    from optimum_amdx import export_model, pipeline
    from optimum_amdx.exporters import StaticShapes

    if not (args.out / "model.onnx").is_file():
        shapes = StaticShapes((1,), (32, 128), capacity=256) if args.static else None
        result = export_model(args.model, args.out, optimize=None if args.static else "extended", static_shapes=shapes)
        print(f"exported to {result.output_dir} (max abs diff vs PyTorch "
              f"{result.metadata['validation']['max_abs_diff']:.1e})")
    options = {"migraphx_model_cache_dir": args.migraphx_cache} if args.migraphx_cache else None
    pipe = pipeline("text-generation", model=str(args.out), accelerator="ort", provider=args.provider,
                    provider_options=options)
    print(f"running on {pipe.model.provider}")
    out = pipe(args.prompt, max_new_tokens=args.max_new_tokens, do_sample=False)
    print(out[0]["generated_text"])


if __name__ == "__main__":
    main()
