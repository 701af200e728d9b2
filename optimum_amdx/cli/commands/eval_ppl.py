"""`optimum-amdx eval-ppl`: perplexity of a model (fp16/fp32 or a GPTQ checkpoint) on held-out text."""

from __future__ import annotations

import argparse
import json
from typing import TextIO

from ..output import json_data_command

NAME = "eval-ppl"
HELP = "Perplexity of a causal LM (plain or GPTQ) on held-out text, to compare fp16, RTN and GPTQ."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model id, local folder (plain or GPTQ), or 'default'")
    parser.add_argument("--dataset", default="pydoc",
                        help="pydoc (offline; its held-out last 10%%), wikitext2 / c4 (test split, online), or a local file (last 10%% of rows)")
    parser.add_argument("--seqlen", type=int, default=512, help="tokens per evaluation window")
    parser.add_argument("--max-windows", type=int, default=None, help="evaluate at most this many windows")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if any)")
    parser.add_argument("--dtype", default="auto", help="auto (fp16 on GPU, fp32 on CPU), fp16, bf16, fp32")
    parser.add_argument("--allow-pickle", action="store_true", help="Allow loading .bin/.pt weights (runs pickle; only for sources you trust).")
    parser.add_argument("--json", action="store_true", help="print JSON")


def _context_length(config: dict) -> int | None:
    """max_position_embeddings (or n_positions) from a model's config.json, or None."""
    value = config.get("max_position_embeddings") or config.get("n_positions")
    return int(value) if isinstance(value, int) else None


@json_data_command
def run(args: argparse.Namespace, stdout: TextIO) -> int:
    import time

    from ...models import default_device, load_model, load_tokenizer, open_model, parse_dtype
    from ...quantization import perplexity
    from ...quantization.calibration import describe_split, get_eval_tokens
    from ...quantization.perplexity import check_eval_sizes

    check_eval_sizes(args.seqlen, args.max_windows)
    device = args.device or default_device()
    dtype = parse_dtype(args.dtype, device)
    folder = open_model(args.model, allow_pickle=args.allow_pickle)
    check_eval_sizes(args.seqlen, args.max_windows, _context_length(folder.config))
    tokens = get_eval_tokens(args.dataset, load_tokenizer(folder))  # a bad dataset fails before the model loads
    if len(tokens) < args.seqlen:
        from ...errors import InvalidArgumentError

        raise InvalidArgumentError(
            f"The evaluation text has {len(tokens)} tokens, fewer than one window of {args.seqlen}; use a smaller --seqlen."
        )
    loaded = load_model(folder, dtype=dtype, device=device)
    model, path, gptq = loaded.model, folder.path, loaded.gptq
    start = time.perf_counter()
    ppl = perplexity(model, tokens, seqlen=args.seqlen, max_windows=args.max_windows, verbose=not args.json)
    seconds = time.perf_counter() - start
    n_windows = min(len(tokens) // args.seqlen, args.max_windows or 10**9)
    split = describe_split() if str(args.dataset).lower() in ("pydoc", "pydoc_data", "default") else "held-out split"
    result = {"model": str(path), "gptq": gptq, "dataset": str(args.dataset), "split": split, "seqlen": args.seqlen,
              "windows": n_windows, "tokens": n_windows * args.seqlen, "perplexity": ppl, "seconds": round(seconds, 2),
              "device": device, "dtype": str(dtype).replace("torch.", "")}
    if args.json:
        print(json.dumps(result), file=stdout)
    else:
        print(f"perplexity {ppl:.3f} on {result['tokens']} tokens of {args.dataset} ({split}); "
              f"{'GPTQ' if gptq else 'unquantized'} model, {result['dtype']} on {device}, {seconds:.1f} s")
    return 0
