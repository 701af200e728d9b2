"""The one loader: anything `open_model` accepts -> a model on the right device, plus the folder it came from.

    loaded = load_model("default", dtype="auto", device=None)   # LoadedModel(model, folder)
    tokenizer = load_tokenizer(loaded.folder)                    # from the same folder, same choices

One route for every entry point (CLI generate / eval-ppl / quantize / benchmark, `pipeline()`,
`AMDModelForCausalLM.from_pretrained`) and every device: a GPTQ checkpoint (detected once, from
config.json) is built with our `QuantLinear` on CPU and GPU alike, anything else is loaded by
transformers from safetensors (pickle files only with `allow_pickle=True`). `trust_remote_code` and
`allow_pickle` are carried by the `ModelFolder`, so the tokenizer and the weights honour the same
choice. `load_causal_lm` and `load_tokenizer` keep their README signatures.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Union

from ..errors import InvalidArgumentError, ModelNotFoundError
from .folder import ModelFolder, open_model, repair_hint, translated_load_errors
from .resolve import PICKLE_SUFFIXES

Source = Union[str, os.PathLike, ModelFolder]
"""What every loading function accepts: a name (`default`, alias, folder, Hub id) or a resolved folder."""


@dataclass
class LoadedModel:
    """A loaded model and the `ModelFolder` it came from (for its tokenizer, config and GPTQ flag)."""

    model: Any
    folder: ModelFolder

    @property
    def gptq(self) -> bool:
        return self.folder.gptq


def default_device() -> str:
    """"cuda" when a GPU is visible (ROCm PyTorch also calls it cuda), else "cpu"."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def parse_dtype(dtype: Any, device: str):
    """A torch dtype from "auto" / "fp16" / "bf16" / "fp32" / a torch.dtype.

    "auto" is fp16 on a GPU and fp32 on the CPU (CPU half-precision matmuls are slow and less exact).
    """
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp32": torch.float32, "float32": torch.float32, "float": torch.float32}
    if dtype in (None, "auto"):
        return torch.float16 if str(device).startswith("cuda") else torch.float32
    if str(dtype).lower() in names:
        return names[str(dtype).lower()]
    raise InvalidArgumentError(f"Unknown dtype {dtype!r}; use one of auto, fp16, bf16, fp32.")


def load_tokenizer(name_or_path: Source, trust_remote_code: bool = False, allow_pickle: bool = False):
    """The tokenizer of a model (from its resolved folder); given a pad token (the EOS) when it has none."""
    from transformers import AutoTokenizer

    folder = open_model(name_or_path, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder.path, trust_remote_code=folder.trust_remote_code)
    except (OSError, ValueError) as err:  # missing or unreadable tokenizer files (JSONDecodeError is a ValueError)
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ModelNotFoundError(
            f"Could not load a tokenizer from {folder.path} ({type(err).__name__}: {first}). Fix: if the folder has "
            f"no tokenizer files, save them there (tokenizer.save_pretrained); if they are damaged, {repair_hint(folder.path)}"
        ) from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    name_or_path: Source,
    dtype: Any = "auto",
    device: str | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    model_class: Any = None,
    **kwargs: Any,
) -> LoadedModel:
    """Resolve once, then load: GPTQ folders through `QuantLinear`, others through transformers.

    `model_class` is the transformers Auto class (default `AutoModelForCausalLM`; GPTQ needs a causal
    LM). Other keyword arguments go to transformers' `from_pretrained` (`attn_implementation="amdx"`
    registers our attention first). The model is in eval mode on `device` (default: the GPU if any).
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = open_model(name_or_path, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    device = device or default_device()
    torch_dtype = parse_dtype(dtype, device)
    model_class = model_class or AutoModelForCausalLM
    files = folder.weight_files()
    folder.check_weights()
    if kwargs.get("attn_implementation") == "amdx":
        from ..modeling.attention import register_attention

        register_attention()
    with translated_load_errors(folder.path):
        if folder.gptq:
            if model_class is not AutoModelForCausalLM or kwargs:
                raise InvalidArgumentError(
                    f"{folder.path} is a GPTQ checkpoint, which loads as a causal LM with our W4A16 linears only "
                    f"(got {getattr(model_class, '__name__', model_class)} with {sorted(kwargs) or 'no'} extra arguments)."
                )
            from ..quantization.checkpoint import build_gptq_model

            config = AutoConfig.from_pretrained(folder.path, trust_remote_code=folder.trust_remote_code)
            model = build_gptq_model(folder.path, files, config, device, torch_dtype)
        else:
            _check_has_weights(folder, files)
            model = model_class.from_pretrained(
                folder.path, dtype=torch_dtype, use_safetensors=None if folder.allow_pickle else True,
                trust_remote_code=folder.trust_remote_code, **kwargs,
            ).to(device)
    model.config._name_or_path = str(folder.path)
    return LoadedModel(model.eval(), folder)


def load_causal_lm(name_or_path: Source, dtype: Any = "auto", device: str | None = None, **kwargs: Any):
    """A causal LM in eval mode on `device` (default: the GPU if any); GPTQ folders load via `QuantLinear`.

    `load_model(...).model`: keyword arguments (`allow_pickle`, `trust_remote_code`, transformers'
    own) as there."""
    return load_model(name_or_path, dtype, device, **kwargs).model


def load_gptq_model(path: Source, device: Any = "cpu", dtype: Any = "fp16"):
    """A GPTQ folder (ours, GPT-QModel's or AutoGPTQ's) as a causal LM with `QuantLinear` layers.

    The loader's GPTQ route under the name `optimum_amdx.quantization.load_gptq_model`; a folder
    that is not GPTQ is refused rather than loaded unquantized.
    """
    folder = open_model(path)
    if not folder.gptq:
        raise InvalidArgumentError(
            f"{folder.path} has no GPTQ quantization_config in config.json; load it with load_causal_lm instead."
        )
    return load_model(folder, dtype=dtype, device=str(device)).model


def is_gptq_checkpoint(path: Source) -> bool:
    """True when the folder's config.json declares quant_method "gptq" (False for a folder without one)."""
    if not isinstance(path, ModelFolder) and not (os.path.isdir(path) and os.path.isfile(os.path.join(path, "config.json"))):
        return False
    return open_model(path, allow_pickle=True).gptq


def _check_has_weights(folder: ModelFolder, files: list) -> None:
    if files or (folder.allow_pickle and any(p.suffix in PICKLE_SUFFIXES for p in folder.path.iterdir())):
        return
    raise ModelNotFoundError(
        f"Model folder {folder.path} has config.json but no weights (*.safetensors). Point at the folder "
        "written by save_pretrained(), or pass a Hub id / 'default'."
    )
