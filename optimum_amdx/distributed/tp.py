"""Tensor-parallel greedy generation under torchrun: transformers TP or DeepSpeed AutoTP.

Run one process per GPU (`optimum-amdx launch --gpus N -- examples/tp_generate.py ...`).
Each rank loads the model sharded across the ranks and runs the same greedy generation; rank 0
reports the tokens. With one process (or backend "none") the model runs whole on one device,
which is the reference the TP output must equal.

- backend "transformers": `from_pretrained(..., distributed_config=DistributedConfig(tp_plan="auto"))`,
  the model's own TP plan (column/row-parallel linears, one all-reduce after attention and MLP).
- backend "deepspeed": `deepspeed.init_inference(model, tensor_parallel={"tp_size": N},
  replace_with_kernel_inject=False)`, DeepSpeed's AutoTP that shards the same linears; no fused
  CUDA kernels are injected, so it runs on ROCm as on CUDA.

On CPU (OPTIMUM_AMDX_DEVICE=cpu, as `launch --cpu` sets) the processes talk over gloo.
"""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError

BACKENDS = ("transformers", "deepspeed", "none")


def world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the torchrun environment, (0, 0, 1) without it."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def tp_device():
    """This rank's device: cuda:LOCAL_RANK when a GPU is visible and CPU was not asked for, else cpu."""
    import torch

    if os.environ.get("OPTIMUM_AMDX_DEVICE") == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    _, local_rank, _ = world()
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load_model(model_dir: str | Path, backend: str, dtype: str):
    """Load `model_dir` on this rank: sharded by `backend` when WORLD_SIZE > 1, whole otherwise.

    The name is resolved and checked by the package's loader (`optimum_amdx.models`: bundled name,
    folder or Hub id; config.json and safetensors framing checked; pickle weights refused); a whole
    model is loaded by it, a sharded one by transformers / DeepSpeed from the same folder, safetensors only.
    """
    from transformers import AutoModelForCausalLM

    from ..models import load_causal_lm, open_model, parse_dtype

    if backend not in BACKENDS:
        raise InvalidArgumentError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}.")
    _, _, size = world()
    device = tp_device()
    torch_dtype = parse_dtype(dtype, device.type)
    folder = open_model(model_dir)
    if size == 1 or backend == "none":
        return load_causal_lm(folder, dtype=torch_dtype, device=str(device)), device
    folder.check_weights()
    if backend == "transformers":
        from transformers.distributed import DistributedConfig

        model = AutoModelForCausalLM.from_pretrained(
            folder.path, dtype=torch_dtype, use_safetensors=True, distributed_config=DistributedConfig(tp_plan="auto")
        )
        return model.eval(), device
    import deepspeed
    import torch.distributed as dist

    if not dist.is_initialized():
        deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl")
    model = AutoModelForCausalLM.from_pretrained(folder.path, dtype=torch_dtype, use_safetensors=True)
    engine = deepspeed.init_inference(model, tensor_parallel={"tp_size": size}, dtype=torch_dtype,
                                      replace_with_kernel_inject=False)
    return engine.module.eval(), device


def greedy_generate(model, input_ids, max_new_tokens: int):
    """Greedy tokens (no sampling, no early stop) for `input_ids` [batch, seq]."""
    import torch

    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new_tokens,
                             min_new_tokens=max_new_tokens, do_sample=False, num_beams=1, pad_token_id=0)
    return out[:, input_ids.shape[1]:]


def prompt_ids(vocab_size: int, batch: int, length: int, seed: int):
    """Seeded random prompt token ids, identical on every rank."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return torch.randint(1, vocab_size, (batch, length), generator=gen)


def run(model_dir: str | Path, backend: str = "transformers", dtype: str = "bfloat16", batch: int | list[int] = 1,
        prompt_len: int = 32, max_new_tokens: int = 32, repeats: int = 3, seed: int = 0) -> dict[str, Any]:
    """Load once; for each batch size generate greedily (warm-up, then `repeats` timed runs).

    Returns tokens and timings; with a list of batch sizes, "runs" holds one entry per size and the
    top-level fields describe the first.
    """
    import torch

    rank, _, size = world()
    model, device = load_model(model_dir, backend, dtype)
    runs = []
    for b in ([batch] if isinstance(batch, int) else list(batch)):
        ids = prompt_ids(model.config.vocab_size, b, prompt_len, seed).to(device)
        tokens = greedy_generate(model, ids, max_new_tokens)  # warm-up, and the tokens we report
        times = []
        for _ in range(repeats):
            if torch.distributed.is_initialized():
                torch.distributed.barrier()
            _sync(device)
            start = time.perf_counter()
            again = greedy_generate(model, ids, max_new_tokens)
            _sync(device)
            times.append(time.perf_counter() - start)
            if not torch.equal(again, tokens):
                raise RuntimeError("Greedy generation is not repeatable on this rank; timings would be meaningless.")
        median = statistics.median(times) if times else None
        runs.append({"batch": b, "tokens": tokens.cpu().tolist(), "seconds_median": median, "seconds_all": times,
                     "tokens_per_s": b * max_new_tokens / median if median else None})
    return {
        "backend": backend if size > 1 else "none",
        "world_size": size,
        "rank": rank,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": dtype,
        "prompt_len": prompt_len,
        "max_new_tokens": max_new_tokens,
        "runs": runs,
        **runs[0],
    }
