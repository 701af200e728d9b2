"""Load tokenizers and causal LMs from anything `resolve_model` accepts, on the right device."""

from __future__ import annotations

import os
from typing import Any

from .resolve import resolve_model


def default_device() -> str:
    """"cuda" when a GPU is visible (ROCm PyTorch also calls it cuda), else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_dtype(dtype: Any, device: str):
    """A torch dtype from "auto" / "fp16" / "bf16" / "fp32" / a torch.dtype.

    "auto" is fp16 on a GPU and fp32 on the CPU (CPU half-precision matmuls are slow and less exact).
    """
    import torch

    from ..errors import InvalidArgumentError

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
    if dtype in (None, "auto"):
        return torch.float16 if device.startswith("cuda") else torch.float32
    if str(dtype).lower() in names:
        return names[str(dtype).lower()]
    raise InvalidArgumentError(f"Unknown dtype {dtype!r}; use one of auto, fp16, bf16, fp32.")


def load_tokenizer(name_or_path: str | os.PathLike, trust_remote_code: bool = False):
    """The tokenizer of a model; pads on the left (decoder generation) and has a pad token."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path), trust_remote_code=trust_remote_code)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    name_or_path: str | os.PathLike,
    dtype: Any = "auto",
    device: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    **kwargs: Any,
):
    """A transformers causal LM in eval mode on `device` (default: the GPU if any)."""
    from transformers import AutoModelForCausalLM

    device = device or default_device()
    path = resolve_model(name_or_path, allow_pickle=allow_pickle)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=parse_dtype(dtype, device),
        use_safetensors=not allow_pickle,
        trust_remote_code=trust_remote_code,
        **kwargs,
    )
    return model.to(device).eval()
