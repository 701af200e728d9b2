"""Model loading: bundled offline models, local folders and hub ids, safetensors only."""

from .loading import default_device, load_causal_lm, load_tokenizer, parse_dtype
from .resolve import check_model_dir, resolve_model

__all__ = ["resolve_model", "check_model_dir", "load_causal_lm", "load_tokenizer", "default_device", "parse_dtype"]
