"""`QuantLinear`: a GPTQ linear layer for the `accelerator="rocm"` path.

It holds the four standard GPTQ tensors as buffers (so `state_dict()` and safetensors files use the
standard names qweight/qzeros/scales/g_idx/bias) and runs `x @ W` through the W4A16 kernel module:
the Triton kernel on a GPU for 4-bit weights, the PyTorch dequantize-then-matmul reference on the
CPU and for 2/3/8-bit weights.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..errors import InvalidArgumentError
from .config import group_rows
from ..kernels.runtime import use_triton
from ..kernels.w4a16 import W4A16Weight, dequantize_gptq, prepare_gptq_weight, w4a16_matmul


class QuantLinear(nn.Module):
    """Drop-in replacement for `nn.Linear` holding a GPTQ-quantized weight.

    The repacked kernel weight (`W4A16Weight`) is built on the first forward on a device and cached.
    float32 activations (CPU evaluation) use a cached dense dequantized copy, which costs the memory
    of an unquantized layer. `load_state_dict`, `.to()` and `_apply` invalidate both caches.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool,
        bits: int = 4,
        group_size: int = 128,
        checkpoint_format: str = "gptq",
        dtype: torch.dtype = torch.float16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if (in_features * bits) % 32 or (out_features * bits) % 32:
            raise InvalidArgumentError(
                f"A {bits}-bit GPTQ linear needs in/out features whose bit width fills int32 words; "
                f"got in={in_features}, out={out_features}."
            )
        self.in_features = in_features
        self.out_features = out_features
        self.bits = bits
        self.group_size = group_size
        self.checkpoint_format = checkpoint_format
        gs = group_rows(group_size, in_features)
        n_groups = -(-in_features // gs)
        self.register_buffer("qweight", torch.zeros(in_features * bits // 32, out_features, dtype=torch.int32, device=device))
        self.register_buffer("qzeros", torch.zeros(n_groups, out_features * bits // 32, dtype=torch.int32, device=device))
        self.register_buffer("scales", torch.zeros(n_groups, out_features, dtype=torch.float16, device=device))
        self.register_buffer(
            "g_idx", (torch.arange(in_features, dtype=torch.int32, device=device) // gs).to(torch.int32)
        )
        if bias:
            self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device))
        else:
            self.bias = None
        self._prepared: W4A16Weight | None = None
        self._dense: torch.Tensor | None = None
        self._warned_slow = False
        self.register_load_state_dict_post_hook(lambda module, keys: module.invalidate())

    @classmethod
    def from_packed(
        cls,
        tensors: dict[str, torch.Tensor],
        in_features: int,
        out_features: int,
        bits: int,
        group_size: int,
        checkpoint_format: str = "gptq",
        bias: torch.Tensor | None = None,
    ) -> "QuantLinear":
        """Build a layer from packed tensors (as returned by `packing.pack_gptq`)."""
        dev = tensors["qweight"].device
        dtype = bias.dtype if bias is not None else torch.float16
        layer = cls(in_features, out_features, bias is not None, bits, group_size, checkpoint_format, dtype, "meta")
        for name in ("qweight", "qzeros", "scales", "g_idx"):
            setattr(layer, name, tensors[name].to(dev))
        if bias is not None:
            layer.bias = bias.detach().clone()
        return layer

    def invalidate(self) -> None:
        """Drop the cached kernel weight and dense copy (after the buffers changed or moved)."""
        self._prepared = None
        self._dense = None

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - torch's signature
        self.invalidate()
        return super()._apply(fn, recurse)

    def kernel_weight(self) -> W4A16Weight:
        """The weight repacked for the W4A16 kernel (built once per device)."""
        if self._prepared is None or self._prepared.device != self.qweight.device:
            self._prepared = prepare_gptq_weight(
                self.qweight, self.qzeros, self.scales, self.g_idx, self.bits, self.group_size, self.checkpoint_format
            )
        return self._prepared

    def dequantize(self) -> torch.Tensor:
        """The float32 weight in `nn.Linear` layout [out_features, in_features]."""
        w = dequantize_gptq(self.qweight, self.qzeros, self.scales, self.g_idx, self.bits, self.checkpoint_format)
        return w.t().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float16, torch.bfloat16):
            w = self.kernel_weight()
            if not w.kernel_ready and not self._warned_slow and use_triton(x):  # where 4-bit ones get a kernel
                self._warned_slow = True
                warnings.warn(
                    f"A {self.bits}-bit GPTQ linear ({self.in_features} -> {self.out_features}, group size "
                    f"{self.group_size}) has no fast kernel: each call dequantizes its whole weight. The W4A16 "
                    "kernels run 4-bit weights whose groups are multiples of 16 rows; re-quantize with --bits 4 "
                    "(GPT-QModel's lm_head=True writes an 8-bit head by default).", stacklevel=2)
            return w4a16_matmul(x, w, self.bias)
        # float32 activations (the CPU default): dequantize once, keep the dense [K, N] copy, plain matmul
        if self._dense is None or self._dense.dtype != x.dtype or self._dense.device != x.device:
            self._dense = self.kernel_weight().dequantize().to(device=x.device, dtype=x.dtype)
        out = x @ self._dense
        if self.bias is not None:
            out = out + self.bias.to(x.dtype)
        return out

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bits={self.bits}, "
            f"group_size={self.group_size}, bias={self.bias is not None}, format={self.checkpoint_format}"
        )
