"""Packing integer GPTQ codes into the standard int32 tensors (qweight, qzeros).

Layout (the one AutoGPTQ defined and transformers, GPT-QModel, vLLM and our W4A16 kernel read):
values are laid out as one little-endian bit stream along the packed dimension, `bits` bits each,
32 bits per int32 word. For 2/4/8 bits every word holds 32/bits whole values; for 3 bits a value
may straddle two words (32 values fill 3 words). qweight packs along the input dimension K
(shape [K*bits/32, N]); qzeros packs along the output dimension N (shape [n_groups, N*bits/32]).
Unpacking and dequantization live in `optimum_amdx.kernels.w4a16` (one implementation each).
"""

from __future__ import annotations

import torch

from ..errors import InvalidArgumentError


def _pack_dim0(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack non-negative ints [R, C] (< 2**bits) along dim 0 into int32 [ceil(R*bits/32), C]."""
    rows, cols = values.shape
    n_words = (rows * bits + 31) // 32
    padded_rows = ((rows + 31) // 32) * 32
    v = torch.zeros(padded_rows, cols, dtype=torch.int64, device=values.device)
    v[:rows] = values.to(torch.int64)
    v = v.view(padded_rows // 32, 32, cols)
    words = torch.zeros(padded_rows // 32, bits, cols, dtype=torch.int64, device=values.device)
    mask32 = (1 << 32) - 1
    for j in range(32):
        word, offset = divmod(j * bits, 32)
        words[:, word] |= (v[:, j] << offset) & mask32
        if offset + bits > 32:
            words[:, word + 1] |= v[:, j] >> (32 - offset)
    words = words.reshape(-1, cols)[:n_words]
    words = torch.where(words >= (1 << 31), words - (1 << 32), words)
    return words.to(torch.int32).contiguous()


def pack_qweight(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Integer codes of a weight, [N (out), K (in)], to the GPTQ qweight [K*bits/32, N]."""
    n_out, k_in = q.shape
    if (k_in * bits) % 32 != 0:
        raise InvalidArgumentError(f"Cannot pack {k_in} input features at {bits} bits into whole int32 words.")
    _check_range(q, bits, "weight codes")
    return _pack_dim0(q.t().contiguous(), bits)


def pack_qzeros(zeros: torch.Tensor, bits: int, checkpoint_format: str = "gptq") -> torch.Tensor:
    """Integer zero points [n_groups, N] to the GPTQ qzeros [n_groups, N*bits/32].

    In the "gptq" (v1) format the stored value is the real zero minus one (kept in `bits` bits), which
    is what AutoGPTQ wrote and what every loader expects; "gptq_v2" stores the real zero.
    """
    _check_range(zeros, bits, "zero points")
    z = zeros.to(torch.int64)
    if checkpoint_format == "gptq":
        z = (z - 1) & ((1 << bits) - 1)
    n_groups, n_out = z.shape
    if (n_out * bits) % 32 != 0:
        raise InvalidArgumentError(f"Cannot pack {n_out} output features at {bits} bits into whole int32 words.")
    return _pack_dim0(z.t().contiguous(), bits).t().contiguous()


def _check_range(values: torch.Tensor, bits: int, what: str) -> None:
    if values.numel() and (int(values.min()) < 0 or int(values.max()) >= (1 << bits)):
        raise InvalidArgumentError(f"{what} must lie in [0, {(1 << bits) - 1}] for {bits}-bit packing.")


def pack_gptq(
    q: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor,
    g_idx: torch.Tensor,
    bits: int,
    checkpoint_format: str = "gptq",
) -> dict[str, torch.Tensor]:
    """All four GPTQ tensors of one linear from codes [N, K], scales/zeros [n_groups, N], g_idx [K]."""
    return {
        "qweight": pack_qweight(q, bits),
        "qzeros": pack_qzeros(zeros, bits, checkpoint_format),
        "scales": scales.to(torch.float16).clone(),
        "g_idx": g_idx.to(torch.int32).clone(),
    }
