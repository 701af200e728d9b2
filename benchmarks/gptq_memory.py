"""Bytes a 4-bit GPTQ model holds in its codes at each point of its life: right after quantization, after its first
forward (the layers repacked for the W4A16 kernels) and inside the paged engine (q/k/v and gate/up fused).

Builds `--shape` with `--layers` decoder layers and a small vocabulary (the linears are what is counted), RTN-quantizes
it to 4 bits (group 128, as `optimum-amdx benchmark --quantization gptq-4bit[-act-order]` does), then after each phase counts every
live int32 tensor storage once (the codes, and the much smaller zeros, group and order indices). The floor is one copy:
K x N / 2 bytes a linear. Device-agnostic: on the CPU it needs no GPU and gives the same counts.

    python benchmarks/gptq_memory.py --shape llama-3-8b --layers 2 --device cpu --out gptq_memory.json
"""

from __future__ import annotations

import argparse
import gc
import warnings
from pathlib import Path

import torch


def held_int32_bytes(device: str) -> int:
    """Bytes of every live int32 tensor storage on `device`, each storage once (views share one)."""
    gc.collect()
    seen: dict[int, int] = {}
    with warnings.catch_warnings():  # asking some of torch's deprecated objects for their type warns
        warnings.simplefilter("ignore", FutureWarning)
        tensors = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for t in tensors:
        if t.dtype == torch.int32 and t.device.type == torch.device(device).type:
            storage = t.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3-8b")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quantization", default="gptq-4bit", choices=["gptq-4bit", "gptq-4bit-act-order"])
    parser.add_argument("--out", type=Path, default=None, help="write the rows as JSON here too")
    args = parser.parse_args()

    import optimum_amdx
    from optimum_amdx.io import result_path_or_exit, write_json

    if args.out is not None:
        result_path_or_exit(args.out)
    from optimum_amdx.benchmark.backends import apply_quantization
    from optimum_amdx.modeling import AMDModelForCausalLM
    from optimum_amdx.models.shapes import shape_config
    from optimum_amdx.quantization import QuantLinear
    from transformers import AutoModelForCausalLM

    config = shape_config(args.shape, num_hidden_layers=args.layers, vocab_size=256)
    torch.manual_seed(0)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float16).eval()
    model, _ = apply_quantization(model, args.quantization, args.device)
    one_copy = sum(m.in_features * m.out_features // 2 for m in model.modules() if isinstance(m, QuantLinear))

    rows = []

    def record(phase: str) -> None:
        held = held_int32_bytes(args.device)
        rows.append({"phase": phase, "int32_bytes": held, "one_copy_bytes": one_copy, "copies": held / one_copy})

    record("quantized (standard GPTQ tensors)")
    ids = torch.randint(1, 256, (1, 8), device=args.device)
    with torch.no_grad():
        model(ids)
    record("after the first forward (repacked)")
    engine = AMDModelForCausalLM(model, num_blocks=16, max_model_len=64)
    engine.generation_config.eos_token_id = None
    engine.generate([ids[0].tolist()], max_new_tokens=2)
    record("in the paged engine, after generate")

    print(f"{args.shape}, {args.layers} layers, {args.quantization}, {args.device}, "
          f"package {Path(optimum_amdx.__file__).parent}")
    print(f"{'phase':40s} {'int32 MB':>10s} {'copies of the codes':>20s}")
    for r in rows:
        print(f"{r['phase']:40s} {r['int32_bytes'] / 1e6:10.1f} {r['copies']:20.3f}")
    if args.out is not None:
        write_json(args.out, {"shape": args.shape, "layers": args.layers, "quantization": args.quantization,
                              "device": args.device,
                              "package": str(Path(optimum_amdx.__file__).parent), "rows": rows})


if __name__ == "__main__":
    main()
