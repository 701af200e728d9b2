"""optimum-amdx: the AMD GPU backend for the Hugging Face stack.

The public names below load on first use, so `import optimum_amdx` pulls in neither torch
nor onnxruntime and stays fast.
"""

from __future__ import annotations

from optimum_amdx._lazy import lazy_exports

__version__ = "0.1.0"

_LAZY: dict[str, str] = {
    "pipeline": "optimum_amdx.pipelines",
    "resolve_model": "optimum_amdx.models",
    "load_causal_lm": "optimum_amdx.models",
    "hardware_report": "optimum_amdx.hardware",
    "ORTModelForCausalLM": "optimum_amdx.onnxruntime",
    "ORTModelForFeatureExtraction": "optimum_amdx.onnxruntime",
    "ORTModelForSequenceClassification": "optimum_amdx.onnxruntime",
    "export_model": "optimum_amdx.exporters",
    "AMDModelForCausalLM": "optimum_amdx.modeling",
    "LLMEngine": "optimum_amdx.modeling",
    "patch": "optimum_amdx.modeling",
    "unpatch": "optimum_amdx.modeling",
    "GPTQConfig": "optimum_amdx.quantization",
    "GPTQQuantizer": "optimum_amdx.quantization",
    "deepspeed_config": "optimum_amdx.distributed",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY, eager=("__version__",))
