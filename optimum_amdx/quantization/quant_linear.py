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
from ..kernels.w4a16 import (W4A16Weight, columns_in_place, dequantize_gptq, gptq_qweight, prepare_gptq_weight,
                             select_columns, w4a16_matmul)


class QuantLinear(nn.Module):
    """Drop-in replacement for `nn.Linear` holding a GPTQ-quantized weight.

    The layer holds its 4-bit codes once. Until its first fp16/bf16 forward (or `kernel_weight()`, which the GPTQ
    loader calls on a GPU), that is the standard `qweight` buffer; after it, for a weight the kernels run, the
    repacked kernel weight (`W4A16Weight`), and the standard `qweight` is rebuilt from it bit for bit wherever it is
    asked for: `state_dict()` (so saving), `dequantize()`, and reading `layer.qweight`, which puts the standard
    tensor back and drops the repacked one until the next forward. A layer whose columns a fused weight holds (the
    paged engine's q/k/v and gate/up, `share_kernel_weight`) keeps neither and reads its columns from it.

    float32 activations (CPU evaluation) use a cached dense dequantized copy, which costs the memory
    of an unquantized layer. `load_state_dict`, `.to()`, `_apply` and assigning one of the four GPTQ
    tensors drop the caches (the codes go back into `qweight` first).
    """

    GPTQ_TENSORS = ("qweight", "qzeros", "scales", "g_idx")
    """The standard GPTQ tensors a layer holds as buffers (and a checkpoint as `<name>.<tensor>`)."""
    HELD_BUFFER = "kernel_qweight"
    """The non-persistent buffer naming the repacked codes the layer holds in place of `qweight` (`_hold`)."""

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
        self._shared: tuple[W4A16Weight, slice | torch.Tensor] | None = None
        """A fused weight holding this layer's codes, and its columns that are this layer's (`share_kernel_weight`)."""
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

    def _codes_elsewhere(self) -> bool:
        """Whether the `qweight` buffer is empty because the codes live in the repacked copy or a fused weight."""
        return self._buffers.get("qweight") is None and (self._prepared is not None or self._shared is not None)

    def checkpoint_qweight(self) -> torch.Tensor:
        """The standard GPTQ `qweight`: the buffer, or rebuilt from the copy that holds the codes instead, which
        keeps holding them (reading `layer.qweight` would make the buffer the layer's copy again)."""
        q = self._buffers.get("qweight")
        if q is not None:
            return q
        if self._prepared is not None:
            return gptq_qweight(self._prepared)
        if self._shared is not None:
            fused, columns = self._shared
            return gptq_qweight(fused, columns)
        raise InvalidArgumentError("This QuantLinear holds no qweight; assign one or load a state dict into it.")

    def _hold(self, words: torch.Tensor | None) -> None:
        """Register `words`, the repacked codes this layer holds in place of `qweight` (None: none), as the
        non-persistent buffer `kernel_qweight`: never saved, but `buffers()` and so memory accounting
        (`model.get_memory_footprint()`, the benchmark's weight bytes) count what the layer holds."""
        if words is None:
            self._buffers.pop(self.HELD_BUFFER, None)
            self._non_persistent_buffers_set.discard(self.HELD_BUFFER)
        else:
            self.register_buffer(self.HELD_BUFFER, words, persistent=False)

    def _keep_standard(self) -> None:
        """Put the codes back into the `qweight` buffer and drop the copies that held them."""
        if self._codes_elsewhere():
            self._buffers["qweight"] = self.checkpoint_qweight()
        self._prepared = None
        self._shared = None
        self._hold(None)

    def invalidate(self) -> None:
        """Drop the cached kernel weight and dense copy (after the buffers changed or moved); the codes go back
        into `qweight` first."""
        self._keep_standard()
        self._dense = None

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001 - torch's signature
        self.invalidate()
        return super()._apply(fn, recurse)

    def __setattr__(self, name: str, value) -> None:  # noqa: ANN001 - nn.Module's signature
        if name in self.GPTQ_TENSORS and "_dense" in self.__dict__:  # past __init__: the caches follow the tensors
            if name == "qweight":  # the new codes replace the held ones
                self._prepared = self._shared = None
            else:
                self._keep_standard()
            self._dense = None
        super().__setattr__(name, value)

    def __getattr__(self, name: str):  # noqa: ANN204 - nn.Module's signature
        if name == "qweight" and "_dense" in self.__dict__ and self._codes_elsewhere():
            self._keep_standard()  # a reader may write into it, so it becomes the layer's copy again
        return super().__getattr__(name)

    def _save_to_state_dict(self, destination, prefix, keep_vars):  # noqa: ANN001 - torch's signature
        if not self._codes_elsewhere():
            return super()._save_to_state_dict(destination, prefix, keep_vars)
        self._buffers["qweight"] = self.checkpoint_qweight()  # saved in its place, then dropped again
        try:
            super()._save_to_state_dict(destination, prefix, keep_vars)
        finally:
            self._buffers["qweight"] = None

    def _load_from_state_dict(self, *args, **kwargs):  # noqa: ANN002, ANN003 - torch's signature
        self._keep_standard()  # loading fills the buffers; the post hook then drops the caches
        return super()._load_from_state_dict(*args, **kwargs)

    def kernel_weight(self) -> W4A16Weight:
        """The weight repacked for the W4A16 kernel, built once and kept. For a weight the kernels run, the repacked
        copy then holds the codes and the `qweight` buffer is emptied (see the class docstring)."""
        if self._prepared is not None:
            return self._prepared
        if self._shared is not None:
            fused, columns = self._shared
            self._prepared = select_columns(fused, columns)  # in place when its columns are whole column blocks
            return self._prepared
        w = prepare_gptq_weight(
            self.checkpoint_qweight(), self.qzeros, self.scales, self.g_idx, self.bits, self.group_size,
            self.checkpoint_format,
        )
        self._prepared = w
        if w.kernel_ready:
            self._buffers["qweight"] = None
            self._hold(w.qweight)
        return w

    def share_kernel_weight(self, fused: W4A16Weight, columns: slice | torch.Tensor) -> None:
        """Let `fused` hold this layer's codes: its output `columns` (a slice, or an index tensor when the fused
        weight reorders its columns) are this layer's weight, as `concat_weights` built it from this layer. The layer
        drops its own copies, so a fused projection costs no second copy of its members; the layer reads its columns
        from `fused` when it runs or is saved (`select_columns`, `gptq_qweight`)."""
        if not self.kernel_weight().kernel_ready or not fused.kernel_ready:
            raise InvalidArgumentError("share_kernel_weight needs a 4-bit layer and a fused weight the kernels run.")
        width = len(range(*columns.indices(fused.out_features))) if isinstance(columns, slice) else columns.numel()
        if width != self.out_features or fused.in_features != self.in_features:
            raise InvalidArgumentError(
                f"The shared columns ({width} of {fused.in_features} inputs) are not this layer's "
                f"{self.out_features} outputs of {self.in_features} inputs."
            )
        self._shared = (fused, columns)
        in_place = columns_in_place(fused, columns)
        self._prepared = select_columns(fused, columns) if in_place else None  # a copy waits until the layer runs
        self._buffers["qweight"] = None
        self._hold(self._prepared.qweight if in_place else None)
        self._dense = None

    def dequantize(self) -> torch.Tensor:
        """The float32 weight in `nn.Linear` layout [out_features, in_features]."""
        w = dequantize_gptq(self.checkpoint_qweight(), self.qzeros, self.scales, self.g_idx, self.bits,
                            self.checkpoint_format)
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


def share_columns(linears: list[nn.Module], fused: W4A16Weight, column_order: torch.Tensor | None = None) -> None:
    """Hand each of `linears` its columns of `fused`, which `concat_weights` built from their kernel weights side by
    side (then put in `column_order`), in place of its own codes (`QuantLinear.share_kernel_weight`); a module
    without `share_kernel_weight` only drops its cached repacked copy (`invalidate`). Their `kernel_qweight`
    buffers then name the fused words once (`QuantLinear._hold`)."""
    position = None
    if column_order is not None:  # joined column j sits at output column position[j]
        order = column_order.to(device=fused.device, dtype=torch.long)
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel(), device=order.device)
    start = 0
    for m in linears:
        stop = start + m.out_features
        share = getattr(m, "share_kernel_weight", None)
        if share is None:
            m.invalidate()
        else:
            share(fused, slice(start, stop) if position is None else position[start:stop])
        start = stop
    sharing = [m for m in linears if isinstance(m, QuantLinear)]
    if sharing and any(m.HELD_BUFFER not in m._buffers for m in sharing):
        # not every member reads its columns in place: the first one names the whole fused words, the others none,
        # so memory accounting counts them once
        for m in sharing:
            m._hold(None)
        sharing[0]._hold(fused.qweight)
