"""The standard GPTQ checkpoint on disk: saving what we quantized, loading any GPTQ folder.

A checkpoint is a transformers model folder whose config.json carries `quantization_config`
(quant_method "gptq", bits, group_size, desc_act, sym, checkpoint_format) and whose safetensors
files hold, for every quantized linear `<name>`, the tensors `<name>.qweight/.qzeros/.scales/.g_idx`
(and `.bias` when it has one), possibly sharded with a `model.safetensors.index.json`.

Loading goes through the one loader (`optimum_amdx.models`), which resolves the name, reads
config.json, detects GPTQ and checks the files, then calls `build_gptq_model` here.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..errors import InvalidArgumentError, ModelNotFoundError
from ..io import atomic_output_dir
from .config import GPTQConfig, declares_gptq, group_rows
from .model_utils import set_submodule
from .moe_experts import has_per_expert_keys, legacy_expert_key, split_stacked_experts
from .quant_linear import QuantLinear

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"


def _deduplicated_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """state_dict without tied duplicates (lm_head tied to the embeddings is stored once)."""
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    state = model.state_dict()
    out: dict[str, torch.Tensor] = {}
    for key, tensor in state.items():
        if key in tied:
            continue
        out[key] = tensor.detach().to("cpu").contiguous()
    return out


def save_quantized(
    model: torch.nn.Module,
    save_dir: str | os.PathLike,
    tokenizer: Any = None,
    max_shard_size: str | int = "5GB",
    overwrite: bool = False,
) -> Path:
    """Write a quantized model as a standard GPTQ folder, atomically; return the folder."""
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    qc = getattr(model.config, "quantization_config", None)
    if not isinstance(qc, dict) or not declares_gptq({"quantization_config": qc}):
        raise InvalidArgumentError(
            "This model has no GPTQ quantization_config; quantize it first with GPTQQuantizer(...).quantize(model, ...)."
        )
    state = _deduplicated_state_dict(model)
    split = split_torch_state_dict_into_shards(state, filename_pattern="model{suffix}.safetensors", max_shard_size=max_shard_size)
    with atomic_output_dir(save_dir, overwrite) as tmp:
        for filename, keys in split.filename_to_tensors.items():
            save_file({k: state[k] for k in keys}, str(tmp / filename), metadata={"format": "pt"})
        if split.is_sharded:
            index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
                     "weight_map": split.tensor_to_filename}
            (tmp / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True))
        model.config.save_pretrained(tmp)
        generation_config = getattr(model, "generation_config", None)
        if generation_config is not None:
            generation_config.save_pretrained(tmp)
        (tmp / "quantize_config.json").write_text(json.dumps(qc, indent=2))
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return Path(save_dir).expanduser().resolve()


def read_gptq_config(config: Any) -> GPTQConfig:
    """The GPTQConfig of a transformers config carrying a GPTQ quantization_config."""
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        raise InvalidArgumentError("config.json has no quantization_config; this is not a GPTQ checkpoint.")
    if not isinstance(qc, dict):
        qc = qc.to_dict()
    return GPTQConfig.from_quantization_config(qc)


def module_settings(quantization_config: dict[str, Any], name: str, base: GPTQConfig) -> tuple[int, int]:
    """(bits, group_size) of the quantized module `name`: GPT-QModel's per-module `dynamic` overrides
    (pattern -> settings; the first positive pattern, with or without its "+:" prefix, that `re.match`es the
    module name wins; "-:" patterns name modules left unquantized, which hold no qweight) over `base`.
    GPT-QModel writes one for `lm_head=True` (an 8-bit head by default)."""
    dynamic = quantization_config.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise InvalidArgumentError(f"quantization_config.dynamic must map module-name patterns to settings, "
                                   f"got {type(dynamic).__name__}.")
    for pattern, settings in dynamic.items():
        if pattern.startswith("-:"):
            continue
        if re.match(pattern[2:] if pattern.startswith("+:") else pattern, name):
            return int(settings.get("bits", base.bits)), int(settings.get("group_size", base.group_size))
    return base.bits, base.group_size


def build_gptq_model(folder: Path, weight_files: list[Path], config: Any, device: str | torch.device,
                     dtype: torch.dtype) -> torch.nn.Module:
    """A transformers causal LM from a checked GPTQ folder (ours, GPT-QModel's or AutoGPTQ's), with
    `QuantLinear` in place of each quantized linear, weights from `weight_files`, in eval mode on `device`.

    Callers go through the loader (`optimum_amdx.models.load_causal_lm`, also reachable as
    `optimum_amdx.quantization.load_gptq_model`), which resolves the name, checks the files and passes
    the transformers `config`. The model skeleton is allocated without running weight initialization,
    then every tensor of the checkpoint is loaded; any model tensor the checkpoint lacks (other than
    tied embeddings) is an error. On a GPU every 4-bit linear is repacked for the kernels here (it then
    holds only its repacked codes, `QuantLinear`), so the first forward does no repacking.
    """
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    gcfg = read_gptq_config(config)
    if not weight_files:
        raise ModelNotFoundError(f"{folder} has no .safetensors weights; a GPTQ folder needs model.safetensors (or shards).")
    keys: dict[str, Path] = {}
    for f in weight_files:
        with safe_open(str(f), framework="pt") as handle:
            for k in handle.keys():
                keys[legacy_expert_key(k)] = f  # Mixtral's w1/w2/w3 expert names read as transformers 5's
    quantized = sorted({k[: -len(".qweight")] for k in keys if k.endswith(".qweight")})
    if not quantized:
        raise InvalidArgumentError(f"{folder} declares GPTQ but its safetensors hold no '*.qweight' tensors.")

    if any(n.split(".")[-1] == "lm_head" for n in quantized):
        # a quantized output head (GPT-QModel's lm_head=True) is never tied to the full-precision embeddings
        for conf in {id(c): c for c in (config, config.get_text_config())}.values():
            conf.tie_word_embeddings = False
    qc_saved = config.quantization_config
    qc_dict = qc_saved if isinstance(qc_saved, dict) else qc_saved.to_dict()
    del config.quantization_config
    with no_init_weights(), torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    config.quantization_config = qc_saved
    model.config.quantization_config = qc_dict
    if has_per_expert_keys(quantized):  # MoE quantized expert by expert: per-expert linears in place of stacked ones
        split_stacked_experts(model)

    for name in quantized:
        try:
            linear = model.get_submodule(name)
        except AttributeError as err:
            raise InvalidArgumentError(f"The checkpoint quantizes {name!r}, which {type(model).__name__} does not have.") from err
        if not isinstance(linear, torch.nn.Linear):
            raise InvalidArgumentError(f"The checkpoint quantizes {name!r}, which is a {type(linear).__name__}, not a Linear.")
        # AutoGPTQ-era checkpoints store a (zero) bias for every quantized linear, even bias-free ones
        has_bias = linear.bias is not None or f"{name}.bias" in keys
        bits, group_size = module_settings(qc_dict, name, gcfg)
        set_submodule(model, name, QuantLinear(
            linear.in_features, linear.out_features, has_bias, bits, group_size, gcfg.checkpoint_format, dtype, "meta",
        ))

    state: dict[str, torch.Tensor] = {}
    for f in weight_files:
        with safe_open(str(f), framework="pt", device="cpu") as handle:
            for k in handle.keys():
                t = handle.get_tensor(k)
                state[legacy_expert_key(k)] = t.to(dtype) if t.is_floating_point() and not k.endswith(".scales") else t
    for name in quantized:
        state.setdefault(f"{name}.g_idx", _default_g_idx(model.get_submodule(name)))
    try:
        missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    except RuntimeError as err:
        raise InvalidArgumentError(
            f"The tensors in {folder} do not match its quantization_config (bits={gcfg.bits}, group_size="
            f"{gcfg.group_size}, with its per-module 'dynamic' overrides). {err}"
        ) from err
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    missing = [k for k in missing if k not in tied]
    if missing:
        raise InvalidArgumentError(f"{folder} is missing tensors the model needs: {missing[:5]}{'...' if len(missing) > 5 else ''}")
    if unexpected:
        raise InvalidArgumentError(f"{folder} holds tensors {type(model).__name__} has no place for: {unexpected[:5]}")
    model.tie_weights()
    _materialize_buffers(model, config)
    model = model.to(device).eval()
    if torch.device(device).type != "cpu":  # repack for the kernels now, not in the first forward
        for module in model.modules():
            if isinstance(module, QuantLinear):
                module.kernel_weight()
    return model


def _default_g_idx(layer: QuantLinear) -> torch.Tensor:
    gs = group_rows(layer.group_size, layer.in_features)
    return (torch.arange(layer.in_features, dtype=torch.int32) // gs).to(torch.int32)


def _materialize_buffers(model: torch.nn.Module, config: Any) -> None:
    """Rebuild non-persistent buffers (rotary inv_freq, Gemma's embedding scale) left on the meta device by the skeleton."""
    for name, module in list(model.named_modules()):
        if any(b is not None and b.is_meta for b in module.buffers(recurse=False)):
            if "rotary" in type(module).__name__.lower():
                cfg = getattr(module, "config", config)
                with torch.device("cpu"):
                    set_submodule(model, name, type(module)(cfg))
            elif hasattr(module, "scalar_embed_scale"):  # transformers' *ScaledWordEmbedding (Gemma): its scale
                module.embed_scale = torch.tensor(float(module.scalar_embed_scale))
            else:
                raise InvalidArgumentError(
                    f"Cannot rebuild buffers of {name} ({type(module).__name__}) when loading a GPTQ model."
                )
