"""`optimum-amdx serve`: an OpenAI-compatible HTTP server (completions, chat, streaming, metrics) on the paged engine."""

from __future__ import annotations

import argparse
import importlib.util
import os

NAME = "serve"
HELP = ("Serve a causal LM over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models, "
        "/health, /metrics) with continuous batching; 'default' = bundled SmolLM2-135M.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="Hub id, local folder (fp16 or GPTQ), or 'default'.")
    parser.add_argument("--allow-pickle", action="store_true", help="Allow loading .bin/.pt weights (runs pickle; only for sources you trust).")
    parser.add_argument("--served-model-name", default=None,
                        help="The name clients put in 'model' (default: the --model value).")
    parser.add_argument("--host", default="127.0.0.1",
                        help="Address to bind (default 127.0.0.1, this machine only; 0.0.0.0 exposes the server).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("OPTIMUM_AMDX_API_KEY") or None,
                        help="Require 'Authorization: Bearer <key>' on /v1 routes (default: $OPTIMUM_AMDX_API_KEY, "
                             "which keeps the key out of the process list).")
    parser.add_argument("--dtype", default="auto", help="auto (fp16 on GPU, fp32 on CPU), fp16, bf16 or fp32.")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: the GPU if one is visible).")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="Most sequences decoding together.")
    parser.add_argument("--max-model-len", type=int, default=None,
                        help="Longest prompt + completion in tokens (default: min(model limit, 4096)).")
    parser.add_argument("--max-num-batched-tokens", type=int, default=4096,
                        help="Token budget of one engine step (prefill chunk size).")
    parser.add_argument("--memory-fraction", "--gpu-memory-utilization", dest="memory_fraction", type=float,
                        default=0.9, help="Fraction of free GPU memory given to the KV cache.")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None,
                        help="KV pool size in blocks (instead of sizing it from free memory).")
    parser.add_argument("--block-size", type=int, default=16, help="Tokens per KV block.")
    parser.add_argument("--enforce-eager", action="store_true", help="Do not capture decode steps as device graphs.")
    parser.add_argument("--max-queue-len", type=int, default=128,
                        help="Requests allowed to wait beyond the running batch; more get HTTP 429.")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="Largest request body (HTTP 413 above).")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="Seconds in-flight requests may take to finish after SIGTERM before they are aborted.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the shared sampler (requests may pass their own).")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))


def run(args: argparse.Namespace) -> int:
    from ...errors import HardwareError
    from ...serving import REQUIRED_PACKAGES

    missing = [name for name in REQUIRED_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise HardwareError(f"`optimum-amdx serve` needs {', '.join(missing)}: pip install 'optimum-amdx[serve]'.")
    from ...serving.server import ServeConfig, serve

    config = ServeConfig(
        model=args.model, allow_pickle=args.allow_pickle, served_model_name=args.served_model_name, host=args.host, port=args.port,
        dtype=args.dtype, device=args.device, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens, memory_fraction=args.memory_fraction,
        num_gpu_blocks_override=args.num_gpu_blocks_override, block_size=args.block_size,
        enforce_eager=args.enforce_eager, api_key=args.api_key, max_queue_len=args.max_queue_len,
        max_body_bytes=args.max_body_bytes, shutdown_timeout=args.shutdown_timeout, seed=args.seed,
        log_level=args.log_level)
    return serve(config)
