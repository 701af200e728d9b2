"""IO binding: ONNX Runtime reads inputs from and writes outputs into torch tensors by pointer.

On GPU providers this keeps the KV cache on the device between decode steps (no host round
trips); on the CPU provider the same code path works with host pointers, which is how it is
tested on machines without a GPU. Output shapes are known in advance (the caller computes them
from the input shapes), so outputs are preallocated torch tensors.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from .providers import CPU, MIGRAPHX

_NP_TYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.int64: np.int64, torch.int32: np.int32,
             torch.bool: np.bool_}


def ort_device_type(provider: str, ort_version: str | None = None) -> str:
    """The device name ONNX Runtime's binding API uses for a provider's memory.

    Up to onnxruntime 1.22 (the last with the ROCm EP) GPU memory of every vendor is the "cuda"
    device, the same way torch on ROCm calls AMD GPUs "cuda". From 1.23 the "cuda" alias carries
    NVIDIA's vendor id, so MIGraphX memory is bound as the generic "gpu" device instead. (The GPU
    branches are written against ONNX Runtime's API; only the CPU branch runs in our CI.)
    """
    if provider == CPU:
        return "cpu"
    if provider == MIGRAPHX:
        import onnxruntime

        version = ort_version or onnxruntime.__version__
        major, minor = (int(x) for x in version.split(".")[:2])
        return "gpu" if (major, minor) >= (1, 23) else "cuda"
    return "cuda"


class TensorBinder:
    """Runs a session with inputs/outputs bound to torch tensors on the provider's device."""

    def __init__(self, session, provider: str, device_id: int = 0) -> None:
        self.session = session
        self.device_type = ort_device_type(provider)
        self.device_id = device_id
        self._placeholder: dict[tuple, torch.Tensor] = {}

    def _bindable(self, tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
        tensor = tensor.to(device).contiguous()
        if tensor.numel() == 0:
            # A zero-size tensor may have a null data pointer; bind a valid one-element buffer instead.
            key = (tensor.dtype, device)
            if key not in self._placeholder:
                self._placeholder[key] = torch.zeros(1, dtype=tensor.dtype, device=device)
        return tensor

    def _pointer(self, tensor: torch.Tensor) -> int:
        if tensor.numel() == 0:
            return self._placeholder[(tensor.dtype, tensor.device)].data_ptr()
        return tensor.data_ptr()

    def run(
        self,
        inputs: Mapping[str, torch.Tensor],
        output_shapes: Mapping[str, tuple[int, ...]],
        output_dtypes: Mapping[str, torch.dtype],
        device: torch.device,
        out: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Bind every input and preallocated output, run, and return the output tensors.

        `out` gives tensors to write outputs into (e.g. the spare half of a double-buffered KV
        cache); other outputs are allocated here.
        """
        binding = self.session.io_binding()
        keep = []
        for name, tensor in inputs.items():
            t = self._bindable(tensor, device)
            keep.append(t)
            binding.bind_input(name, self.device_type, self.device_id, _NP_TYPES[t.dtype], tuple(t.shape), self._pointer(t))
        outputs = {}
        for name, shape in output_shapes.items():
            given = (out or {}).get(name)
            if given is not None and (tuple(given.shape) != tuple(shape) or not given.is_contiguous()):
                raise ValueError(f"Output buffer for {name} has shape {tuple(given.shape)}, expected {tuple(shape)}.")
            tensor = given if given is not None else torch.empty(shape, dtype=output_dtypes[name], device=device)
            outputs[name] = tensor
            binding.bind_output(name, self.device_type, self.device_id, _NP_TYPES[tensor.dtype], tuple(shape),
                                tensor.data_ptr())
        if self.device_type != "cpu":
            binding.synchronize_inputs()
        self.session.run_with_iobinding(binding)
        if self.device_type != "cpu":
            binding.synchronize_outputs()
        del keep
        return outputs
