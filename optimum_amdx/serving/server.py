"""Load a model into the paged engine and serve it with uvicorn; graceful shutdown on SIGTERM.

On SIGTERM (or Ctrl-C) the server stops admitting (new requests get 503, /health says draining),
stops listening, lets in-flight requests finish for up to `shutdown_timeout` seconds, aborts what
is left, stops the engine loop and returns normally, so the process exits 0.
"""

from __future__ import annotations

import logging
import signal
import socket
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidArgumentError

logger = logging.getLogger(__name__)


@dataclass
class ServeConfig:
    """Server settings; the names follow vLLM's flags where one exists."""

    model: str = "default"
    allow_pickle: bool = False
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    dtype: str = "auto"
    device: str | None = None
    max_num_seqs: int = 64
    max_model_len: int | None = None
    max_num_batched_tokens: int = 4096
    memory_fraction: float = 0.9
    num_gpu_blocks_override: int | None = None
    block_size: int = 16
    enforce_eager: bool = False
    api_key: str | None = None
    max_queue_len: int = 128
    max_body_bytes: int = 1 << 20
    shutdown_timeout: float = 30.0
    seed: int = 0
    log_level: str = "info"

    def check(self) -> None:
        """Refuse values that cannot work, naming the flag."""
        positive = {"--port": self.port, "--max-num-seqs": self.max_num_seqs, "--block-size": self.block_size,
                    "--max-num-batched-tokens": self.max_num_batched_tokens, "--max-body-bytes": self.max_body_bytes}
        for flag, value in positive.items():
            if value < (0 if flag == "--port" else 1):
                raise InvalidArgumentError(f"{flag}={value}: expected a positive number.")
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(f"--port={self.port}: expected 0..65535.")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise InvalidArgumentError(f"--max-model-len={self.max_model_len}: expected at least 2 tokens.")
        if not 0.0 < self.memory_fraction <= 1.0:
            raise InvalidArgumentError(f"--memory-fraction={self.memory_fraction}: expected a value in (0, 1].")
        if self.max_queue_len < 0:
            raise InvalidArgumentError(f"--max-queue-len={self.max_queue_len}: expected 0 or more.")
        if self.num_gpu_blocks_override is not None and self.num_gpu_blocks_override < 1:
            raise InvalidArgumentError(f"--num-gpu-blocks-override={self.num_gpu_blocks_override}: expected >= 1.")
        if self.api_key is not None and not self.api_key:
            raise InvalidArgumentError("--api-key is empty; give a key or leave the flag out.")


def stop_token_ids(model: Any, tokenizer: Any) -> tuple[int, ...]:
    """End-of-sequence ids from the generation config and the tokenizer."""
    ids: list[int] = []
    gc = getattr(model, "generation_config", None)
    eos = getattr(gc, "eos_token_id", None) if gc is not None else None
    for value in ([eos] if isinstance(eos, int) else list(eos or [])) + [getattr(tokenizer, "eos_token_id", None)]:
        if isinstance(value, int) and value not in ids:
            ids.append(value)
    return tuple(ids)


def build_state(model: Any, tokenizer: Any, config: ServeConfig):
    """The handlers' shared state for an AMDModelForCausalLM (builds its engine: KV pool, graphs)."""
    from .app import ServerState
    from .engine_loop import EngineLoop

    engine = model.engine
    return ServerState(loop=EngineLoop(engine), tokenizer=tokenizer,
                       model_name=config.served_model_name or config.model, max_model_len=model.max_model_len,
                       stop_token_ids=stop_token_ids(model, tokenizer), api_key=config.api_key,
                       max_body_bytes=config.max_body_bytes, max_queue_len=config.max_queue_len)


def load(config: ServeConfig):
    """Model and tokenizer for `config` (a GPTQ checkpoint loads on our W4A16 kernels)."""
    import torch

    from ..modeling import AMDModelForCausalLM
    from ..models import default_device, load_tokenizer, open_model

    device = config.device or default_device()
    torch.manual_seed(config.seed)
    folder = open_model(config.model, allow_pickle=config.allow_pickle)  # resolved once: the tokenizer and the weights come from the same folder
    tokenizer = load_tokenizer(folder)
    model = AMDModelForCausalLM.from_pretrained(
        folder, dtype=config.dtype, device=device, block_size=config.block_size,
        num_blocks=config.num_gpu_blocks_override, memory_fraction=config.memory_fraction,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=max(config.max_num_batched_tokens, config.max_num_seqs),
        max_model_len=config.max_model_len, use_cuda_graph=not config.enforce_eager)
    return model, tokenizer


def make_server(app: Any, config: ServeConfig, state: Any):
    """A uvicorn server whose exit handler first stops admissions."""
    import uvicorn

    class _Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            state.draining = True
            super().handle_exit(sig, frame)

    uv_config = uvicorn.Config(app, host=config.host, port=config.port, log_level=config.log_level,
                               timeout_graceful_shutdown=config.shutdown_timeout, lifespan="on",
                               timeout_keep_alive=5, access_log=config.log_level == "debug")
    return _Server(uv_config)


def serve(config: ServeConfig) -> int:
    """Load, serve until SIGTERM/SIGINT, shut down gracefully; returns 0."""
    from .app import build_app

    config.check()
    _check_port_free(config.host, config.port)
    model, tokenizer = load(config)
    state = build_state(model, tokenizer, config)
    app = build_app(state)
    server = make_server(app, config, state)
    engine = state.loop.engine
    print(f"Serving {state.model_name!r} on http://{config.host}:{config.port}/v1 (device {model.device}, "
          f"{model.dtype}, {engine.num_blocks} KV blocks of {engine.cache.block_size} tokens, max_model_len "
          f"{model.max_model_len}, max_num_seqs {config.max_num_seqs}, decode graphs {engine.uses_graphs})", flush=True)
    # uvicorn re-raises the signal it handled once it is done; with these no-op handlers in place
    # that re-raise is harmless and a SIGTERM ends the process with exit status 0.
    previous = {sig: signal.signal(sig, _ignore) for sig in (signal.SIGTERM,)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise InvalidArgumentError(f"The server could not start on {config.host}:{config.port} (see the log above).")
    print("Server stopped.", flush=True)
    return 0


def _ignore(sig: int, frame: Any) -> None:
    return None


def _check_port_free(host: str, port: int) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            raise InvalidArgumentError(f"Cannot listen on {host}:{port} ({err.strerror}); pick another --port or "
                                       "stop the process using it.") from None
