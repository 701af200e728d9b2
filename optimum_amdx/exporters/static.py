"""Static-shape buckets for MIGraphX, which compiles one program per input shape.

For each (batch, sequence) bucket a small graph file `model_b{B}_s{S}.onnx` is written whose
inputs have fixed dimensions; every bucket file points at the same external weight file, so
buckets cost kilobytes, not another copy of the weights. The ORT classes pad a batch up to the
smallest bucket that fits (padding tokens are masked out) and slice the result back.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ..errors import InvalidArgumentError
from .contract import encoder_bucket_file as bucket_file


@dataclass(frozen=True)
class StaticShapes:
    """Batch sizes and sequence lengths to compile fixed-shape graphs for.

    Encoders: one graph per (batch, sequence). Decoders: one prefill graph per (batch, prompt
    length) and one decode graph per batch, over a KV buffer of `capacity` tokens (prompt +
    generated; default: the longest prompt bucket + 256, at most the model's max positions).
    """

    batch_sizes: tuple[int, ...]
    sequence_lengths: tuple[int, ...]
    capacity: int | None = None

    def __post_init__(self) -> None:
        for name, values in (("batch_sizes", self.batch_sizes), ("sequence_lengths", self.sequence_lengths)):
            if not values or any((not isinstance(v, int)) or v < 1 for v in values):
                raise InvalidArgumentError(f"Static shapes: {name} must be positive integers, got {values!r}.")
        if self.capacity is not None and (not isinstance(self.capacity, int) or self.capacity < 2):
            raise InvalidArgumentError(f"Static shapes: capacity must be an integer >= 2, got {self.capacity!r}.")
        object.__setattr__(self, "batch_sizes", tuple(sorted(set(self.batch_sizes))))
        object.__setattr__(self, "sequence_lengths", tuple(sorted(set(self.sequence_lengths))))

    def to_dict(self) -> dict:
        data = {"batch_sizes": list(self.batch_sizes), "sequence_lengths": list(self.sequence_lengths)}
        if self.capacity is not None:
            data["capacity"] = self.capacity
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "StaticShapes":
        return cls(tuple(data["batch_sizes"]), tuple(data["sequence_lengths"]), data.get("capacity"))

    def bucket_for(self, batch: int, seq: int) -> tuple[int, int]:
        """Smallest (batch, seq) bucket holding the input; a clear error when none does."""
        b = next((x for x in self.batch_sizes if x >= batch), None)
        s = next((x for x in self.sequence_lengths if x >= seq), None)
        if b is None or s is None:
            raise InvalidArgumentError(
                f"Input of batch {batch} and sequence length {seq} exceeds the largest static bucket "
                f"(batch {self.batch_sizes[-1]}, sequence {self.sequence_lengths[-1]}). Truncate the input, split the "
                "batch, or re-export with larger --static-shapes."
            )
        return b, s


def write_static_buckets(folder: Path, onnx_file: str, shapes: StaticShapes) -> list[str]:
    """Write one fixed-shape graph per bucket next to `onnx_file` (weights stay external, shared)."""
    import onnx

    base = onnx.load(str(folder / onnx_file), load_external_data=False)
    written = []
    for b in shapes.batch_sizes:
        for s in shapes.sequence_lengths:
            model = onnx.ModelProto()
            model.CopyFrom(base)
            fixed = {"batch_size": b, "sequence_length": s}
            for value in list(model.graph.input) + list(model.graph.output):
                for dim in value.type.tensor_type.shape.dim:
                    if dim.dim_param in fixed:
                        dim.dim_value = fixed[dim.dim_param]
            del model.graph.value_info[:]
            name = bucket_file(b, s)
            onnx.save(model, str(folder / name))
            written.append(name)
    return written


def parse_buckets(values: Sequence[str] | str) -> list[int]:
    """`"1,4,8"` or `["1", "4"]` -> sorted unique positive ints, with a clear error otherwise."""
    items = values.split(",") if isinstance(values, str) else [v for s in values for v in str(s).split(",")]
    try:
        nums = sorted({int(v) for v in items if v.strip()})
    except ValueError as err:
        raise InvalidArgumentError(f"Bucket sizes must be integers, got {values!r}.") from err
    if not nums or nums[0] < 1:
        raise InvalidArgumentError(f"Bucket sizes must be positive integers, got {values!r}.")
    return nums
