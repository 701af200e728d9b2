"""Sentence embeddings with all-MiniLM-L6-v2 on ONNX Runtime (exported on first use), plus similarities.

    python examples/ort_embeddings.py
    python examples/ort_embeddings.py --provider migraphx --static-shapes   # fixed-shape buckets for MIGraphX
"""

from __future__ import annotations

import argparse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="all-minilm-l6-v2")
    parser.add_argument("--provider", default=None, help="migraphx, rocm, cuda or cpu (default: best available).")
    parser.add_argument("--static-shapes", action="store_true",
                        help="Export batch/sequence buckets (1,8 x 32,128) and run on them.")
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer

    from optimum_amdx.exporters import StaticShapes
    from optimum_amdx.models import resolve_model
    from optimum_amdx.onnxruntime import ORTModelForFeatureExtraction, mean_pooling

    export_kwargs = {"optimize": "extended"}
    if args.static_shapes:
        export_kwargs["static_shapes"] = StaticShapes((1, 8), (32, 128))
    model = ORTModelForFeatureExtraction.from_pretrained(
        args.model, export=True, export_kwargs=export_kwargs, provider=args.provider,
        use_static_shapes=True if args.static_shapes else None,
    )
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.model))
    sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The new movie is awesome.",
        "A cheetah is running behind its prey.",
    ]
    enc = tokenizer(sentences, padding=True, truncation=True, return_tensors="pt")
    embeddings = mean_pooling(model(**enc).last_hidden_state, enc["attention_mask"])
    embeddings = torch.nn.functional.normalize(embeddings, dim=-1)
    print(f"{model.provider}: {embeddings.shape[0]} embeddings of size {embeddings.shape[1]}")
    sims = embeddings @ embeddings.T
    for i, s in enumerate(sentences[1:], start=1):
        print(f"  similarity({sentences[0]!r}, {s!r}) = {sims[0, i]:.3f}")


if __name__ == "__main__":
    main()
