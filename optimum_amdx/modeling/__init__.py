"""`accelerator="rocm"`: patched transformers models, paged KV cache, graph-captured decode, continuous batching.

Importing this package registers `attn_implementation="amdx"` with transformers (see
`register_attention`). The heavier names load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from .attention import register_attention

register_attention()

_LAZY: dict[str, str] = {
    "AMDModelForCausalLM": "optimum_amdx.modeling.causal_lm",
    "LLMEngine": "optimum_amdx.modeling.engine",
    "RequestOutput": "optimum_amdx.modeling.engine",
    "SamplingParams": "optimum_amdx.modeling.sampling",
    "patch": "optimum_amdx.modeling.patching",
    "unpatch": "optimum_amdx.modeling.patching",
    "FusedRMSNorm": "optimum_amdx.modeling.patching",
}

__all__ = sorted(_LAZY) + ["register_attention"]


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'optimum_amdx.modeling' has no attribute {name!r}")
    value = getattr(importlib.import_module(module_name), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
