"""GPTQ for AMD GPUs: calibration data, the GPTQ and RTN algorithms, packing, the standard
checkpoint format, `QuantLinear` (runs on the W4A16 kernel) and perplexity evaluation.

Names load lazily so importing this package does not import torch. `load_gptq_model` and
`is_gptq_checkpoint` are the model loader's GPTQ route (`optimum_amdx.models`), listed here too
because this is where GPTQ users look; nothing in this package imports `models`.
"""

from __future__ import annotations

from optimum_amdx._lazy import lazy_exports

_LAZY: dict[str, str] = {
    "GPTQConfig": "optimum_amdx.quantization.config",
    "GPTQQuantizer": "optimum_amdx.quantization.quantizer",
    "QuantLinear": "optimum_amdx.quantization.quant_linear",
    "load_gptq_model": "optimum_amdx.models.loading",
    "save_quantized": "optimum_amdx.quantization.checkpoint",
    "is_gptq_checkpoint": "optimum_amdx.models.loading",
    "get_calibration_data": "optimum_amdx.quantization.calibration",
    "load_text_dataset": "optimum_amdx.quantization.calibration",
    "perplexity": "optimum_amdx.quantization.perplexity",
    "gptq_quantize": "optimum_amdx.quantization.gptq",
    "rtn_quantize": "optimum_amdx.quantization.gptq",
    "pack_gptq": "optimum_amdx.quantization.packing",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
