"""`accelerator="rocm"`: patched transformers models, paged KV cache, graph-captured decode, continuous batching.

Importing this package registers `attn_implementation="amdx"` with transformers (see
`register_attention`). The heavier names load on first use.
"""

from __future__ import annotations

from optimum_amdx._lazy import lazy_exports

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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, eager=('register_attention',))
