"""Per-GPU memory of training and inference under DeepSpeed ZeRO, from shapes alone.

The model states follow the ZeRO paper (Rajbhandari et al., 2020) for mixed-precision Adam:
16-bit parameters (2 bytes/param), 16-bit gradients (2 bytes/param) and optimizer states of
12 bytes/param (fp32 master weights 4 + Adam momentum 4 + variance 4). ZeRO stage 1 splits the
optimizer states over the data-parallel ranks, stage 2 also the gradients, stage 3 also the
parameters. CPU (or NVMe) offload moves the optimizer states, and at stage 3 optionally the
parameters, off the GPU.

Activations follow Korthikanti et al. (2022), "Reducing Activation Recomputation in Large
Transformer Models": one layer stores about s*b*h*(34 + 5*a*s/h) bytes in 16-bit without
recomputation (the 5*a*s/h term is the attention score matrix; a fused FlashAttention-class
kernel does not store it, and we count it anyway to stay on the safe side). With full
activation checkpointing a layer keeps only its 16-bit input (2*s*b*h bytes) and one layer at a
time is recomputed in full. The fp32 logits and their gradient (8*b*s*vocab bytes) come on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

GB = 1e9

PARAM_BYTES = 2  # 16-bit weights
GRAD_BYTES = 2  # 16-bit gradients
OPTIM_BYTES = 12  # fp32 master copy + Adam m + Adam v


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on: parameter count and the transformer dimensions."""

    num_params: int
    hidden_size: int
    num_layers: int
    num_heads: int
    vocab_size: int
    largest_layer_params: int

    @classmethod
    def from_config(cls, config, num_params: int) -> "ModelShape":
        """Read the dimensions from a transformers config (decoder-style attribute names)."""
        h = int(config.hidden_size)
        layers = int(config.num_hidden_layers)
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        per_layer = max(1, (num_params - 2 * vocab * h) // max(1, layers))
        largest = max(per_layer, vocab * h)
        return cls(num_params, h, layers, int(config.num_attention_heads), vocab, largest)


@dataclass(frozen=True)
class Placement:
    """One candidate DeepSpeed setup whose memory we estimate."""

    zero_stage: int
    offload_optimizer: str = "none"  # none | cpu | nvme
    offload_param: str = "none"  # none | cpu | nvme (stage 3 only)
    activation_checkpointing: bool = False

    def describe(self) -> str:
        parts = [f"ZeRO-{self.zero_stage}"]
        if self.offload_optimizer != "none":
            parts.append(f"optimizer on {self.offload_optimizer}")
        if self.offload_param != "none":
            parts.append(f"parameters on {self.offload_param}")
        if self.activation_checkpointing:
            parts.append("activation checkpointing")
        return ", ".join(parts)


@dataclass
class MemoryEstimate:
    """Bytes per GPU (and per node in host memory / NVMe) of one placement."""

    placement: Placement
    world_size: int
    gpus_per_node: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    working_set_bytes: float
    cpu_bytes_per_node: float
    nvme_bytes_per_node: float
    notes: list[str] = field(default_factory=list)

    @property
    def gpu_total_bytes(self) -> float:
        return (self.params_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes
                + self.working_set_bytes)

    def rows(self) -> list[tuple[str, float]]:
        """(item, GB) rows for a table, per GPU unless the label says otherwise."""
        return [
            ("parameters (per GPU)", self.params_bytes / GB),
            ("gradients (per GPU)", self.grads_bytes / GB),
            ("optimizer states (per GPU)", self.optimizer_bytes / GB),
            ("activations (per GPU)", self.activations_bytes / GB),
            ("gathered-parameter working set (per GPU)", self.working_set_bytes / GB),
            ("total (per GPU)", self.gpu_total_bytes / GB),
            ("CPU memory (per node)", self.cpu_bytes_per_node / GB),
            ("NVMe (per node)", self.nvme_bytes_per_node / GB),
        ]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["gpu_total_bytes"] = self.gpu_total_bytes
        d["placement_text"] = self.placement.describe()
        return d


def activation_bytes(shape: ModelShape, micro_batch: int, seq_len: int, checkpointing: bool) -> float:
    """Activation memory of one training step per GPU (see the module docstring for the formula)."""
    s, b, h, a = seq_len, micro_batch, shape.hidden_size, shape.num_heads
    per_layer = s * b * h * (34 + 5 * a * s / h)
    if checkpointing:
        layers = shape.num_layers * 2 * s * b * h + per_layer
    else:
        layers = shape.num_layers * per_layer
    logits = 8 * b * s * shape.vocab_size
    return layers + logits


def inference_activation_bytes(shape: ModelShape, micro_batch: int, seq_len: int) -> float:
    """Peak activations of a forward pass without gradients: one layer live at a time plus logits."""
    s, b, h, a = seq_len, micro_batch, shape.hidden_size, shape.num_heads
    return s * b * h * (34 + 5 * a * s / h) + 4 * b * s * shape.vocab_size


def estimate(
    shape: ModelShape,
    placement: Placement,
    world_size: int,
    gpus_per_node: int,
    micro_batch: int,
    seq_len: int,
    task: str,
) -> MemoryEstimate:
    """Memory per GPU of `placement` for `task` ("train", "finetune" or "inference")."""
    n = world_size
    psi = shape.num_params
    stage = placement.zero_stage
    notes: list[str] = []
    host = {"cpu": 0.0, "nvme": 0.0}

    if task == "inference":
        params = PARAM_BYTES * psi / (n if stage == 3 else 1)
        grads = optim = 0.0
        acts = inference_activation_bytes(shape, micro_batch, seq_len)
    else:
        params = PARAM_BYTES * psi / (n if stage >= 3 else 1)
        grads = GRAD_BYTES * psi / (n if stage >= 2 else 1)
        optim = OPTIM_BYTES * psi / (n if stage >= 1 else 1)
        acts = activation_bytes(shape, micro_batch, seq_len, placement.activation_checkpointing)
        if placement.offload_optimizer != "none":
            # ZeRO-Offload keeps the fp32 master weights, Adam states and the gradient partitions
            # on the host and runs the optimizer step there.
            host[placement.offload_optimizer] += (optim + (grads if stage >= 2 else 0.0)) * gpus_per_node
            optim = 0.0
            if stage >= 2:
                grads = 0.0
    if placement.offload_param != "none":
        host[placement.offload_param] += params * gpus_per_node
        params = 0.0

    working = 0.0
    if stage == 3:
        # Stage 3 gathers each layer's full parameters before use and prefetches the next one.
        working = 2 * PARAM_BYTES * shape.largest_layer_params
        notes.append("stage 3 gathers one layer and prefetches the next: 2 layers of 16-bit weights")
    return MemoryEstimate(placement, n, gpus_per_node, params, grads, optim, acts, working,
                          host["cpu"], host["nvme"], notes)
