"""Model loading: bundled offline models, local folders and hub ids, safetensors only.

`open_model` resolves a name once (`ModelFolder`: folder, config.json, GPTQ or not); `load_model`
loads it (GPTQ through our QuantLinear, anything else through transformers) and returns the folder
with the model; `load_causal_lm` / `load_tokenizer` / `resolve_model` are the short forms.
"""

from .folder import ModelFolder, open_model
from .loading import (LoadedModel, default_device, is_gptq_checkpoint, load_causal_lm, load_gptq_model, load_model,
                      load_tokenizer, parse_dtype)
from .resolve import check_model_dir, resolve_model

__all__ = ["resolve_model", "check_model_dir", "open_model", "ModelFolder", "load_model", "LoadedModel",
           "load_causal_lm", "load_gptq_model", "is_gptq_checkpoint", "load_tokenizer", "default_device", "parse_dtype"]
