"""Finding what to quantize in a transformers causal LM: its decoder blocks and their linears."""

from __future__ import annotations

from typing import Any

from torch import nn

from ..errors import UnsupportedModelError


def check_causal_lm(model: Any) -> None:
    """Raise `UnsupportedModelError` unless `model` is a decoder-only causal LM not quantized yet (no QuantLinear)."""
    config = getattr(model, "config", None)
    name = type(model).__name__
    if config is None or getattr(config, "is_encoder_decoder", False) or not name.endswith("ForCausalLM"):
        raise UnsupportedModelError(
            f"GPTQ here quantizes decoder-only causal language models (XxxForCausalLM); got {name}. "
            "Load the model with AutoModelForCausalLM (encoders and encoder-decoders are not supported)."
        )
    from .quant_linear import QuantLinear

    if any(isinstance(m, QuantLinear) for m in model.modules()):
        raise UnsupportedModelError(
            f"{getattr(config, '_name_or_path', '') or name} is already a GPTQ checkpoint; quantize the original "
            "full-precision model instead."
        )


def decoder_layers(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The ModuleList of decoder blocks (the one holding the most parameters) and its dotted name."""
    best: tuple[str, nn.ModuleList] | None = None
    best_params = 0
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            if not any(isinstance(m, nn.Linear) for m in module[0].modules()):
                continue
            n_params = sum(p.numel() for p in module.parameters())
            if n_params > best_params:
                best, best_params = (name, module), n_params
    if best is None:
        raise UnsupportedModelError(
            f"Could not find the decoder blocks of {type(model).__name__} (a ModuleList of layers holding nn.Linear)."
        )
    return best


def is_excluded(full_name: str, modules_to_not_convert: list[str]) -> bool:
    """True for modules left in full precision: lm_head, and any name ending in a listed suffix."""
    leaf = full_name.split(".")[-1]
    if leaf == "lm_head":
        return True
    return any(full_name == m or full_name.endswith("." + m) or leaf == m for m in modules_to_not_convert)


def block_linears(block: nn.Module, prefix: str, modules_to_not_convert: list[str]) -> dict[str, nn.Linear]:
    """The quantizable nn.Linear modules of one block, keyed by their name inside the block."""
    return {
        name: m
        for name, m in block.named_modules()
        if isinstance(m, nn.Linear) and not is_excluded(f"{prefix}.{name}", modules_to_not_convert)
    }


def set_submodule(root: nn.Module, name: str, module: nn.Module) -> None:
    """Replace the submodule at dotted `name` under `root`."""
    parent_name, _, leaf = name.rpartition(".")
    parent = root.get_submodule(parent_name) if parent_name else root
    setattr(parent, leaf, module)
