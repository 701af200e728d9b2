"""Greedy generation with tensor parallelism: one process per GPU, started by `optimum-amdx launch`.

    # a random-weight model to try it on (any causal-LM folder with safetensors works)
    python examples/tp_generate.py --make-random tiny-llama /tmp/tiny
    optimum-amdx launch --gpus 2 -- examples/tp_generate.py --model /tmp/tiny --backend transformers
    optimum-amdx launch --gpus 2 -- examples/tp_generate.py --model /tmp/tiny --backend deepspeed
    optimum-amdx launch --gpus 1 -- examples/tp_generate.py --model /tmp/tiny      # the 1-GPU reference
    optimum-amdx launch --cpu --gpus 2 -- examples/tp_generate.py --model /tmp/tiny --dtype float32

Rank 0 prints the greedy tokens and the median time, and writes them to --out (JSON).
"""

from __future__ import annotations

import argparse
import json
import sys


def make_random(shape: str, out: str, seed: int, dtype: str) -> None:
    """Save a seeded random-weight model of a named shape (optimum_amdx.models.shapes) to `out`."""
    import torch
    from transformers import AutoModelForCausalLM

    from optimum_amdx.models.shapes import shape_config

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(shape_config(shape), dtype=getattr(torch, dtype))
    model.save_pretrained(out)
    print(f"saved random {shape} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters) to {out}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="model folder (config.json + safetensors)")
    parser.add_argument("--make-random", nargs=2, metavar=("SHAPE", "DIR"), help="write a random model and exit")
    parser.add_argument("--backend", choices=["transformers", "deepspeed", "none"], default="transformers")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--batch", default="1", help="batch size, or a comma list such as 1,8 (one load)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="JSON file for rank 0's result")
    args = parser.parse_args(argv)

    if args.make_random:
        make_random(args.make_random[0], args.make_random[1], args.seed, args.dtype)
        return 0
    if not args.model:
        parser.error("--model is required (or --make-random SHAPE DIR)")

    from optimum_amdx.distributed.tp import run

    batches = [int(b) for b in args.batch.split(",")]
    result = run(args.model, args.backend, args.dtype, batches, args.prompt_len, args.max_new_tokens,
                 args.repeats, args.seed)
    if result["rank"] == 0:
        print(f"[{result['backend']} x{result['world_size']} on {result['device']}] tokens: {result['tokens'][0]}")
        for r in result["runs"]:
            if r["seconds_median"]:
                print(f"batch {r['batch']}: median {r['seconds_median'] * 1000:.1f} ms for {args.max_new_tokens} "
                      f"new tokens -> {r['tokens_per_s']:.1f} tokens/s")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
