"""ONNX Runtime models for AMD execution providers (MIGraphX, ROCm), CUDA and CPU.

`ORTModelForCausalLM` (with transformers' `generate()`), `ORTModelForFeatureExtraction` and
`ORTModelForSequenceClassification` load folders written by `optimum-cli export rocm`, choose and
verify the execution provider, and use IO binding on GPUs. Static-shape decoder exports (fixed-capacity
KV cache, for MIGraphX) run through the same `ORTModelForCausalLM`, carrying a `StaticKVCache`.
Importing this package loads torch but not the exporter (see `optimum_amdx.exporters.contract`).
"""

from .modeling_decoder import ORTModelForCausalLM
from .modeling_encoder import ORTModelForFeatureExtraction, ORTModelForSequenceClassification, mean_pooling
from .providers import PROVIDER_PRIORITY, choose_provider, provider_options, verify_session
from .static_cache import StaticKVCache

__all__ = [
    "ORTModelForCausalLM",
    "ORTModelForFeatureExtraction",
    "ORTModelForSequenceClassification",
    "mean_pooling",
    "StaticKVCache",
    "PROVIDER_PRIORITY",
    "choose_provider",
    "provider_options",
    "verify_session",
]
