"""DeepSpeed configs sized for the GPU: the lowest ZeRO stage that fits, with the arithmetic shown.

`deepspeed_config(model, gpu, gpus, nodes, task)` walks a ladder of placements from cheapest in
communication to cheapest in GPU memory (ZeRO-0, 1, 2, 3, then CPU offload, then NVMe offload),
checking activation checkpointing off before on at each rung, and returns the first that fits
in the GPU's memory less a headroom. The config uses "auto" wherever the transformers Trainer
fills the value from its `TrainingArguments`, so one file serves every run.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, ModelNotFoundError
from ..hardware.profiles import GPUProfile, lookup_profile
from .memory import GB, MemoryEstimate, ModelShape, Placement, estimate

TASKS = ("train", "finetune", "inference")
DEFAULT_SEQ_LEN = {"train": 4096, "finetune": 2048, "inference": 2048}
GPU_HEADROOM = 0.90  # fraction of HBM we plan to use: the rest is runtime, allocator slack, comm buffers
HOST_HEADROOM = 0.80  # fraction of host memory offload may take
DEFAULT_HOST_MEMORY_GB = 1024.0  # typical 8-GPU Instinct server; pass cpu_memory_gb for yours


@dataclass
class DeepSpeedPlan:
    """A DeepSpeed config with the estimate that chose it and a plain-text explanation."""

    config: dict[str, Any]
    estimate: MemoryEstimate
    gpu: GPUProfile
    num_params: int
    task: str
    explanation: str
    rejected: list[tuple[str, float]] = field(default_factory=list)

    def table(self) -> str:
        """The memory estimate as an aligned text table (what the CLI prints to stderr)."""
        usable = self.gpu.memory_gb * GPU_HEADROOM
        lines = [f"Memory estimate: {_count(self.num_params)} parameters, {self.task}, "
                 f"{self.estimate.world_size} x {self.gpu.name} ({self.gpu.memory_gb:g} GB, "
                 f"{usable:.0f} GB usable)", f"Chosen: {self.estimate.placement.describe()}"]
        width = max(len(name) for name, _ in self.estimate.rows() + self.rejected)
        for name, gb in self.estimate.rows():
            lines.append(f"  {name:<{width}}  {gb:10.2f} GB")
        if self.rejected:
            lines.append("Rejected (GB per GPU):")
            for text, gb in self.rejected:
                lines.append(f"  {text:<{width}}  {gb:10.2f} GB")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"config": self.config, "estimate": self.estimate.to_dict(), "gpu": self.gpu.key,
                "num_params": self.num_params, "task": self.task, "explanation": self.explanation}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.2f}M"


def load_model_config(model: Any):
    """A transformers config from a config object, a shape name, a config.json, a folder or a Hub id."""
    if hasattr(model, "hidden_size") and hasattr(model, "num_hidden_layers"):
        return model
    from transformers import AutoConfig

    from ..models.shapes import SHAPES, shape_config

    text = str(model)
    if text.strip().lower() in SHAPES:
        return shape_config(text)
    path = Path(text).expanduser()
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidArgumentError(f"{path} is not a readable JSON model config ({err}).") from err
        if "model_type" not in data:
            raise InvalidArgumentError(f"{path} has no 'model_type'; give a transformers config.json.")
        params = dict(data)
        return AutoConfig.for_model(params.pop("model_type"), **params)
    from ..models import bundled, open_model

    if path.is_dir() or bundled.bundled_key(text) is not None:  # config only: no weights are read, pickle or not
        return AutoConfig.from_pretrained(open_model(text, allow_pickle=True).path)
    try:
        return AutoConfig.from_pretrained(text)
    except Exception as err:  # hub errors come in many classes; all mean "not found from here"
        raise ModelNotFoundError(
            f"Could not read a config for {text!r} ({type(err).__name__}). Give a shape name "
            f"({', '.join(sorted(SHAPES))}), a config.json path, a model folder, or a reachable Hub id."
        ) from err


def count_parameters(config) -> int:
    """Parameters from the config's shapes; models that the formula does not cover are built on 'meta'."""
    from ..models.shapes import parameter_count

    model_type = getattr(config, "model_type", "")
    if model_type in ("llama", "mistral", "qwen2") and hasattr(config, "intermediate_size"):
        return parameter_count(config)
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _ladder(task: str, world_size: int, nvme: bool) -> list[Placement]:
    """Placements in the order we prefer them, cheapest in time first.

    ZeRO 0, 1 and 2 move the same bytes per step as plain data parallelism (all-reduce versus
    reduce-scatter plus all-gather), stage 3 about 1.5 times that; activation checkpointing costs
    about a third more compute; offload runs the optimizer step on the host, the slowest of all.
    Hence: stages 0-3 without checkpointing, then with it, then offload (without, then with
    checkpointing), NVMe last. On one GPU ZeRO partitions nothing, so only stage 0 is tried before offload.
    """
    if task == "inference":
        rungs = [Placement(0), Placement(3), Placement(3, offload_param="cpu")]
        if nvme:
            rungs.append(Placement(3, offload_param="nvme"))
        return rungs
    stages = [0] if world_size == 1 else [0, 1, 2, 3]
    rungs = [Placement(s) for s in stages] + [Placement(s, activation_checkpointing=True) for s in stages]
    offload = [Placement(2, offload_optimizer="cpu"), Placement(3, offload_optimizer="cpu"),
               Placement(3, offload_optimizer="cpu", offload_param="cpu")]
    if nvme:
        offload.append(Placement(3, offload_optimizer="nvme", offload_param="nvme"))
    for p in offload:
        rungs.append(p)
        rungs.append(Placement(p.zero_stage, p.offload_optimizer, p.offload_param, activation_checkpointing=True))
    return rungs


def _precision_block(precision: str) -> dict[str, Any]:
    if precision == "auto":
        return {"bf16": {"enabled": "auto"}, "fp16": {"enabled": "auto", "loss_scale": 0,
                                                      "initial_scale_power": 16, "loss_scale_window": 1000,
                                                      "hysteresis": 2, "min_loss_scale": 1}}
    if precision == "bf16":
        return {"bf16": {"enabled": True}, "fp16": {"enabled": False}}
    if precision == "fp16":
        return {"bf16": {"enabled": False}, "fp16": {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                                                     "loss_scale_window": 1000, "hysteresis": 2,
                                                     "min_loss_scale": 1}}
    raise InvalidArgumentError(f"precision={precision!r}: expected 'auto', 'bf16' or 'fp16'.")


def _offload_block(device: str, nvme_path: str | None) -> dict[str, Any]:
    block: dict[str, Any] = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def _build_config(p: Placement, task: str, precision: str, nvme_path: str | None,
                  gradient_accumulation_steps: int | str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": p.zero_stage}
    if p.zero_stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": "auto"})
    if p.zero_stage == 3:
        zero.update({"stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
                     "stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000,
                     "stage3_gather_16bit_weights_on_model_save": True, "sub_group_size": 1_000_000_000})
    if p.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload_block(p.offload_optimizer, nvme_path)
    if p.offload_param != "none":
        zero["offload_param"] = _offload_block(p.offload_param, nvme_path)

    config: dict[str, Any] = _precision_block(precision)
    config["zero_optimization"] = zero
    config["train_micro_batch_size_per_gpu"] = "auto"
    config["steps_per_print"] = 100
    config["wall_clock_breakdown"] = False
    if task != "inference":
        config.update({"train_batch_size": "auto", "gradient_accumulation_steps": gradient_accumulation_steps,
                       "gradient_clipping": "auto"})
        if p.offload_optimizer != "none":
            # Offloaded optimizer states need DeepSpeed's own (CPU) Adam; without offload the
            # Trainer's optimizer is used, which works on every accelerator.
            config["optimizer"] = {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",
                                                                "weight_decay": "auto"}}
        if p.offload_optimizer == "nvme" or p.offload_param == "nvme":
            config["aio"] = {"block_size": 1_048_576, "queue_depth": 8, "single_submit": False,
                             "overlap_events": True, "thread_count": 1}
    return config


def deepspeed_config(
    model: Any,
    gpu: str | GPUProfile = "mi300x",
    gpus: int = 1,
    nodes: int = 1,
    task: str = "finetune",
    precision: str = "auto",
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    gradient_accumulation_steps: int | str = "auto",
    zero_stage: int | None = None,
    cpu_memory_gb: float | None = None,
    nvme_path: str | None = None,
    num_params: int | None = None,
) -> DeepSpeedPlan:
    """Build a DeepSpeed config for `model` on `nodes` x `gpus` GPUs of type `gpu`.

    `model` is a transformers config, a named shape ("llama-2-7b"), a config.json path, a model
    folder or a Hub id; only its config is read. `task` is "train", "finetune" or "inference".
    `zero_stage` forces a stage (the estimate is still computed and offload added if needed).
    Raises InvalidArgumentError for bad arguments, and when the model cannot fit even with
    offload (the message says what would make it fit).
    """
    profile = gpu if isinstance(gpu, GPUProfile) else lookup_profile(gpu)
    if task not in TASKS:
        raise InvalidArgumentError(f"task={task!r}: expected one of {', '.join(TASKS)}.")
    for name, value in (("gpus", gpus), ("nodes", nodes), ("micro_batch_size", micro_batch_size)):
        if not isinstance(value, int) or value < 1:
            raise InvalidArgumentError(f"{name}={value!r}: expected a positive integer.")
    if zero_stage is not None and zero_stage not in (0, 1, 2, 3):
        raise InvalidArgumentError(f"zero_stage={zero_stage!r}: expected 0, 1, 2 or 3.")
    if isinstance(gradient_accumulation_steps, int) and gradient_accumulation_steps < 1:
        raise InvalidArgumentError("gradient_accumulation_steps must be >= 1 or 'auto'.")
    precision_block_check = _precision_block(precision)  # validates `precision` early
    del precision_block_check

    config = load_model_config(model)
    n_params = int(num_params) if num_params else count_parameters(config)
    shape = ModelShape.from_config(config, n_params)
    seq = int(seq_len or min(DEFAULT_SEQ_LEN[task], getattr(config, "max_position_embeddings", None) or 10**9))
    world = gpus * nodes
    usable_gpu = profile.memory_gb * GPU_HEADROOM * GB
    host_gb = DEFAULT_HOST_MEMORY_GB if cpu_memory_gb is None else float(cpu_memory_gb)
    usable_host = host_gb * HOST_HEADROOM * GB

    rungs = _ladder(task, world, nvme_path is not None)
    if zero_stage is not None:
        rungs = [p for p in rungs if p.zero_stage == zero_stage]
        if not rungs:
            rungs = [Placement(zero_stage), Placement(zero_stage, activation_checkpointing=True)]
    rejected: list[tuple[str, float]] = []
    chosen: MemoryEstimate | None = None
    for placement in rungs:
        est = estimate(shape, placement, world, gpus, micro_batch_size, seq, task)
        if est.gpu_total_bytes <= usable_gpu and est.cpu_bytes_per_node <= usable_host:
            chosen = est
            break
        rejected.append((placement.describe(), est.gpu_total_bytes / GB))
    if chosen is None:
        last = estimate(shape, rungs[-1], world, gpus, micro_batch_size, seq, task)
        hints = []
        if nvme_path is None:
            hints.append("give an NVMe path for offload (--nvme-path)")
        hints.append("use more GPUs or nodes")
        hints.append("lower --micro-batch-size or --seq-len")
        raise InvalidArgumentError(
            f"{n_params / 1e9:.1f}B parameters do not fit for {task} on {world} x {profile.name} "
            f"({profile.memory_gb:g} GB, {usable_gpu / GB:.0f} GB usable) even with "
            f"{rungs[-1].describe()}: that needs {last.gpu_total_bytes / GB:.1f} GB per GPU and "
            f"{last.cpu_bytes_per_node / GB:.0f} GB of host memory per node (of {usable_host / GB:.0f} GB usable). "
            f"To fit: {'; '.join(hints)}."
        )

    ds = _build_config(chosen.placement, task, precision, nvme_path, gradient_accumulation_steps)
    explanation = _explain(chosen, rejected, profile, n_params, task, seq, micro_batch_size)
    return DeepSpeedPlan(ds, chosen, profile, n_params, task, explanation, rejected)


def _explain(est: MemoryEstimate, rejected: list[tuple[str, float]], gpu: GPUProfile, n_params: int,
             task: str, seq: int, micro_batch: int) -> str:
    usable = gpu.memory_gb * GPU_HEADROOM
    text = (f"{task} of {_count(n_params)} parameters on {est.world_size} x {gpu.name}, "
            f"micro-batch {micro_batch} x {seq} tokens: {est.placement.describe()} needs "
            f"{est.gpu_total_bytes / GB:.1f} GB per GPU of {usable:.0f} GB usable "
            f"({GPU_HEADROOM:.0%} of {gpu.memory_gb:g} GB).")
    if rejected:
        first = rejected[0]
        text += f" Cheaper setups do not fit (e.g. {first[0]}: {first[1]:.1f} GB per GPU)."
    else:
        text += " It is the cheapest setup in communication, so nothing heavier is needed."
    if est.placement.activation_checkpointing:
        text += (" The estimate assumes activation checkpointing: turn it on in the Trainer with "
                 "TrainingArguments(gradient_checkpointing=True) (or model.gradient_checkpointing_enable()).")
    if est.cpu_bytes_per_node:
        text += f" Offload puts {est.cpu_bytes_per_node / GB:.0f} GB in host memory per node."
    if est.nvme_bytes_per_node:
        text += f" Offload puts {est.nvme_bytes_per_node / GB:.0f} GB on NVMe per node."
    return text


def fill_auto_values(config: dict[str, Any], world_size: int, hidden_size: int = 4096, micro_batch: int = 1,
                     gradient_accumulation_steps: int = 1, precision: str = "bf16") -> dict[str, Any]:
    """Replace "auto" with the values the transformers Trainer would write, for checking or plain DeepSpeed."""
    filled = copy.deepcopy(config)
    ga = filled.get("gradient_accumulation_steps", 1)
    ga = gradient_accumulation_steps if ga == "auto" else ga
    if filled.get("train_micro_batch_size_per_gpu") == "auto":
        filled["train_micro_batch_size_per_gpu"] = micro_batch
    if "gradient_accumulation_steps" in filled:
        filled["gradient_accumulation_steps"] = ga
    if filled.get("train_batch_size") == "auto":
        filled["train_batch_size"] = filled["train_micro_batch_size_per_gpu"] * ga * world_size
    if filled.get("gradient_clipping") == "auto":
        filled["gradient_clipping"] = 1.0
    for key, enabled in (("bf16", precision == "bf16"), ("fp16", precision == "fp16")):
        if key in filled and filled[key].get("enabled") == "auto":
            filled[key]["enabled"] = enabled
    zero = filled.get("zero_optimization", {})
    auto_zero = {"reduce_bucket_size": hidden_size * hidden_size,
                 "stage3_prefetch_bucket_size": int(0.9 * hidden_size * hidden_size),
                 "stage3_param_persistence_threshold": 10 * hidden_size}
    for key, value in auto_zero.items():
        if zero.get(key) == "auto":
            zero[key] = value
    opt = filled.get("optimizer", {}).get("params", {})
    for key, value in {"lr": 5e-5, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}.items():
        if opt.get(key) == "auto":
            opt[key] = value
    return filled


def validate_deepspeed_config(config: dict[str, Any], world_size: int = 1, hidden_size: int = 4096) -> Any:
    """Parse `config` with DeepSpeed's own `DeepSpeedConfig`, as a run on `world_size` ranks would.

    "auto" values are first filled as the Trainer would. DeepSpeed reads the world size from an
    initialized process group, which a config check has none of: we parse with world size 1 and
    then re-run DeepSpeed's own batch-size derivation and assertion with `world_size`.
    Returns the DeepSpeedConfig; raises InvalidArgumentError with DeepSpeed's message if rejected.
    """
    from deepspeed.runtime.config import DeepSpeedConfig

    filled = fill_auto_values(config, world_size, hidden_size)
    single = dict(filled)
    single.pop("train_batch_size", None)
    try:
        parsed = DeepSpeedConfig(single)
        parsed.world_size = world_size
        parsed.train_batch_size = filled.get("train_batch_size")
        parsed._configure_train_batch_size()
    except (AssertionError, ValueError, TypeError, KeyError) as err:
        raise InvalidArgumentError(f"DeepSpeed rejected the config: {err}") from err
    return parsed
