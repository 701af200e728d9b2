"""ONNX Runtime models for AMD execution providers (MIGraphX, ROCm), CUDA and CPU.

`ORTModelForCausalLM` (with transformers' `generate()`), `ORTModelForFeatureExtraction` and
`ORTModelForSequenceClassification` load folders written by `optimum-cli export rocm`, choose and
verify the execution provider, and use IO binding on GPUs. Importing this package loads torch.
"""

from .modeling_decoder import ORTModelForCausalLM
from .modeling_encoder import ORTModelForFeatureExtraction, ORTModelForSequenceClassification, mean_pooling
from .providers import PROVIDER_PRIORITY, choose_provider, provider_options, verify_session

__all__ = [
    "ORTModelForCausalLM",
    "ORTModelForFeatureExtraction",
    "ORTModelForSequenceClassification",
    "mean_pooling",
    "PROVIDER_PRIORITY",
    "choose_provider",
    "provider_options",
    "verify_session",
]
