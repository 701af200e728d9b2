"""W4A16 matmul for GPTQ checkpoints: 4-bit weights, fp16/bf16 activations, fp32 accumulation.

(Over 400 lines: the GPTQ bit packing, the reference dequantization, the repacked layout and the
dispatcher with its thresholds are this op's one front module, which imports no Triton.)

Standard GPTQ tensors (as AutoGPTQ / GPT-QModel / transformers write them):

- ``qweight`` int32 ``[K * bits / 32, N]``: the quantized values of column ``n`` packed along K,
  least significant bits first (for 4 bit: word ``r`` holds rows ``8r .. 8r+7``, row ``8r+j`` in
  bits ``4j .. 4j+3``). 3-bit values form one continuous bit stream over consecutive words.
- ``qzeros`` int32 ``[n_groups, N * bits / 32]``: zero points packed the same way, along N.
- ``scales`` fp16 ``[n_groups, N]``.
- ``g_idx`` int32 ``[K]``: the group of each input row (act-order permutes it).

``W[k, n] = (q[k, n] - zero[g_idx[k], n]) * scale[g_idx[k], n]``, where the real zero is the
stored zero + 1 for checkpoint_format "gptq" (v1, the on-disk default) and the stored zero itself
for "gptq_v2".

The Triton kernels run 4-bit weights only; 2/3/8-bit weights take the reference path (dequantize
then matmul) and say so through `W4A16Weight.kernel_ready`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from ..errors import InvalidArgumentError
from .runtime import use_triton

if TYPE_CHECKING:
    import torch

__all__ = [
    "W4A16Weight",
    "unpack_gptq_int32",
    "pack_gptq_int32",
    "dequantize_gptq",
    "prepare_gptq_weight",
    "concat_weights",
    "gptq_qweight",
    "select_columns",
    "columns_in_place",
    "tile_pack",
    "tile_pack_gptq_words",
    "unpack_codes_u8",
    "untile_gptq_words",
    "activation_order",
    "w4a16_matmul",
    "w4a16_matmul_reference",
    "accumulating_route",
    "accumulator",
    "ACCUMULATE_MAX_ROWS",
    "w4a16_accumulate",
    "pair_order",
    "to_pair_order",
    "takes_pairs",
    "choose_route",
    "dispatch_route",
    "STREAM_MAX_M",
    "ROUTE_LIMITS",
    "RouteLimits",
    "PIPELINED_MIN_WEIGHT",
    "SMALL_WEIGHT",
    "WIDE_N",
    "LONG_K",
]

SUPPORTED_BITS = (2, 3, 4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
TILE_N = 128
"""Columns per tile of the repacked layout (see `W4A16Weight`)."""
TILE_K = 128
"""Input rows per tile of the repacked layout: 16 int32 words per column, 8 nibble planes of 16 rows."""


def _check_bits(bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise InvalidArgumentError(
            f"bits={bits} is not a GPTQ width this package reads; expected one of {SUPPORTED_BITS}."
        )


def _check_format(checkpoint_format: str) -> None:
    if checkpoint_format not in CHECKPOINT_FORMATS:
        raise InvalidArgumentError(
            f"checkpoint_format={checkpoint_format!r} is unknown; expected one of {CHECKPOINT_FORMATS} "
            "('gptq' is the AutoGPTQ/GPT-QModel on-disk default, whose zero points are stored minus one)."
        )


def unpack_gptq_int32(packed: "torch.Tensor", bits: int, dim: int) -> "torch.Tensor":
    """Unpack int32 words holding `bits`-bit unsigned values along `dim` into an int32 tensor.

    Values are read as one least-significant-bit-first stream per line along `dim`, which is how
    GPTQ packs 2/4/8 bits (32 / bits values per word) and 3 bits (32 values per 3 words).
    The result has `packed.shape[dim] * 32 // bits` entries along `dim`.
    """
    import torch

    _check_bits(bits)
    if packed.dtype != torch.int32:
        raise InvalidArgumentError(f"packed tensor has dtype {packed.dtype}; expected torch.int32 GPTQ words.")
    moved = packed.movedim(dim, -1)
    words = moved.to(torch.int64) & 0xFFFFFFFF
    n_words = words.shape[-1]
    n_vals = n_words * 32 // bits
    if 32 % bits == 0:
        per = 32 // bits
        shifts = torch.arange(0, 32, bits, device=packed.device, dtype=torch.int64)
        vals = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
        vals = vals.reshape(*words.shape[:-1], n_words * per)
    else:
        offs = torch.arange(n_vals, device=packed.device, dtype=torch.int64) * bits
        word_i = offs // 32
        shift = offs % 32
        lo = words[..., word_i] >> shift
        nxt = torch.clamp(word_i + 1, max=n_words - 1)
        hi = words[..., nxt] << (32 - shift)
        spill = (shift + bits) > 32
        vals = torch.where(spill, lo | hi, lo) & ((1 << bits) - 1)
    return vals.to(torch.int32).movedim(-1, dim)


def pack_gptq_int32(values: "torch.Tensor", bits: int, dim: int) -> "torch.Tensor":
    """Pack unsigned `bits`-bit integers along `dim` into int32 words (inverse of `unpack_gptq_int32`).

    The length along `dim` must be a multiple of 32 / gcd(32, bits) values (8 for 4 bit, 32 for 3 bit).
    """
    import torch

    _check_bits(bits)
    moved = values.movedim(dim, -1).to(torch.int64)
    n_vals = moved.shape[-1]
    if (n_vals * bits) % 32 != 0:
        raise InvalidArgumentError(
            f"cannot pack {n_vals} values of {bits} bits into whole int32 words along dim {dim}; "
            "pad that dimension to a multiple of 32 bits."
        )
    if int(moved.min()) < 0 or int(moved.max()) >= (1 << bits):
        raise InvalidArgumentError(f"values to pack must lie in [0, {(1 << bits) - 1}] for {bits} bits.")
    n_words = n_vals * bits // 32
    offs = torch.arange(n_vals, device=values.device, dtype=torch.int64) * bits
    word_i = offs // 32
    shift = offs % 32
    words = torch.zeros(*moved.shape[:-1], n_words + 1, dtype=torch.int64, device=values.device)
    words.index_add_(-1, word_i, moved << shift)
    spill = (shift + bits) > 32
    if bool(spill.any()):
        words.index_add_(-1, word_i[spill] + 1, moved[..., spill] >> (32 - shift[spill]))
    words = words[..., :n_words] & 0xFFFFFFFF
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim)


def _real_zeros(qzeros: "torch.Tensor", bits: int, n: int, checkpoint_format: str) -> "torch.Tensor":
    zeros = unpack_gptq_int32(qzeros, bits, dim=1)[:, :n]
    if checkpoint_format == "gptq":
        zeros = zeros + 1
    return zeros


def dequantize_gptq(
    qweight: "torch.Tensor",
    qzeros: "torch.Tensor",
    scales: "torch.Tensor",
    g_idx: Optional["torch.Tensor"],
    bits: int = 4,
    checkpoint_format: str = "gptq",
) -> "torch.Tensor":
    """Dequantize standard GPTQ tensors into a float32 ``[K, N]`` weight (the reference semantics).

    `g_idx=None` means groups in order: ``K / n_groups`` consecutive rows per group.
    """
    import torch

    _check_bits(bits)
    _check_format(checkpoint_format)
    n = scales.shape[1]
    q = unpack_gptq_int32(qweight, bits, dim=0)
    k = q.shape[0]
    if g_idx is None:
        g_idx = torch.arange(k, device=q.device) // -(-k // scales.shape[0])
    else:
        k = g_idx.shape[0]
        q = q[:k]
    g = g_idx.long()
    if q.shape[1] != n:
        raise InvalidArgumentError(f"qweight has {q.shape[1]} columns but scales has {n}; they must match.")
    zeros = _real_zeros(qzeros, bits, n, checkpoint_format).float()
    return (q.float() - zeros[g]) * scales.float()[g]


@dataclass
class W4A16Weight:
    """A GPTQ linear weight repacked once for the W4A16 kernels.

    Repacked layout (4 bit, ``kernel_ready=True``), "tile-major": the weight is cut into tiles of
    ``TILE_N`` columns x ``TILE_K`` input rows; tile ``(nb, kt)`` (column block ``nb``, K tile
    ``kt``) is one contiguous run of ``TILE_N * 16`` int32 words at word offset
    ``(nb * KT + kt) * TILE_N * 16``, tiles of one column block back to back along K. Inside a
    tile, column ``c`` owns 16 consecutive words (64 bytes), and nibble ``j`` (bits ``4j..4j+3``)
    of word ``r`` is input row ``kt * 128 + j * 16 + r`` ("plane" j holds 16 consecutive rows).
    So a program that walks the K tiles of a column block streams one contiguous run, a warp's
    16-byte loads cover 512 contiguous bytes, and the activations a nibble plane meets are 16
    consecutive values (one vector load) instead of a stride-8 gather. N is padded to a multiple
    of ``TILE_N`` and K to a multiple of ``TILE_K`` with zero words.

    - ``qweight`` int32 ``[NB * KT * TILE_N, 16]`` in that order.
    - For act-order checkpoints the rows are first sorted by group (stable sort of ``g_idx``), so
      every group is a contiguous run of ``group_size`` rows; ``perm`` (int32 ``[K]``) records the
      sort: sorted row ``k`` is original row ``perm[k]``, and the kernels read activation ``perm[k]``.
    - ``scales`` ``[n_groups, N]`` fp16, row ``g`` for sorted rows ``g*group_size ..``.
    - ``zeros`` ``[n_groups, N]`` fp16 holding the real zero point (v1's +1 applied), or None
      when every zero is ``2**(bits-1)`` (symmetric), so the kernel uses a constant.
    - ``group_size``: rows per group after sorting (``K`` for a single group).

    For 2/3/8 bit, a group size that is not a multiple of 16, or an act-order ``g_idx`` whose
    groups are not equal runs once sorted, ``kernel_ready`` is False and ``raw`` keeps the original
    tensors for the reference path.
    """

    qweight: Optional["torch.Tensor"]
    scales: "torch.Tensor"
    zeros: Optional["torch.Tensor"]
    perm: Optional["torch.Tensor"]
    in_features: int
    out_features: int
    group_size: int
    bits: int
    kernel_ready: bool
    raw: Optional[dict[str, Any]] = None
    x_order: Optional[dict[bool, "torch.Tensor"]] = None
    """x's column order per operand order (`activation_order`, both orders), made with the weight wherever the
    kernels gather x (act-order, or K off the 128-row tiles). Made here rather than on first use, so a graph
    captured around the weight's first call neither records the index build nor keeps the index in its pool."""

    def __post_init__(self) -> None:
        if (self.x_order is None and self.kernel_ready and self.qweight is not None
                and (self.perm is not None or self.in_features % TILE_K)):
            self.x_order = {natural: activation_order(self, natural) for natural in (True, False)}

    @property
    def k_tiles(self) -> int:
        """K tiles of ``TILE_K`` rows (the last one zero-padded)."""
        return -(-self.in_features // TILE_K)

    @property
    def n_blocks(self) -> int:
        """Column blocks of ``TILE_N`` columns (the last one zero-padded)."""
        return -(-self.out_features // TILE_N)

    def codes(self, dtype: Optional["torch.dtype"] = None) -> "torch.Tensor":
        """The 4-bit codes ``[K, N]`` in the SORTED row order (undoes the tile packing), int32 or `dtype` (uint8 takes
        a quarter of the memory; the plane temporaries take half a byte a code)."""
        import torch

        nb, kt = self.n_blocks, self.k_tiles
        words = self.qweight.view(nb, kt, TILE_N, 16).permute(1, 3, 0, 2)  # [kt, r, nb, n]
        q = _split_nibbles(words, 1, dtype)  # [kt, j, r, nb, n]: row kt*128 + j*16 + r
        return q.view(kt * TILE_K, nb * TILE_N)[: self.in_features, : self.out_features]

    def dequantize(self) -> "torch.Tensor":
        """The float32 ``[K, N]`` weight in the ORIGINAL row order (reference semantics)."""
        import torch

        if not self.kernel_ready:
            r = self.raw
            return dequantize_gptq(r["qweight"], r["qzeros"], r["scales"], r["g_idx"], self.bits, r["checkpoint_format"])
        k = self.in_features
        q = self.codes().float()
        g = torch.arange(k, device=q.device) // self.group_size
        zeros = self.zeros.float()[g] if self.zeros is not None else 8.0
        w_sorted = (q - zeros) * self.scales.float()[g]
        if self.perm is None:
            return w_sorted
        w = torch.empty_like(w_sorted)
        w[self.perm.long()] = w_sorted
        return w

    @property
    def device(self) -> "torch.device":
        return self.scales.device

    def presorted(self) -> "W4A16Weight":
        """The same tensors read without the act-order permutation: the caller hands in x already in the
        sorted row order (``x[:, perm]``), as the paged engine's producers do (`modeling.paged_model`)."""
        from dataclasses import replace

        return replace(self, perm=None, x_order=None)


def activation_order(w: W4A16Weight, natural: bool) -> "torch.Tensor":
    """int32 ``[k_tiles * TILE_K]``: for position ``p`` of K tile ``kt`` in the kernels' joined order, the column of x
    it meets (`perm` applied for act-order), or ``in_features`` (a zero column) for a padded row. ``natural``: the
    tile's rows in order (the pipelined GEMM); otherwise the fused GEMM's pair order, where position ``p`` holds
    row ``16 * plane + p // 8`` of the plane that nibble slot ``p % 8`` of a word pair yields."""
    import torch

    p = torch.arange(TILE_K, device=w.qweight.device)
    t = p % 8
    rows_p = p if natural else ((t & 1) * 4 + (t & 2) + (t >> 2)) * 16 + p // 8
    rows = (torch.arange(w.k_tiles, device=p.device)[:, None] * TILE_K + rows_p[None, :]).reshape(-1)
    valid = rows < w.in_features
    src = rows.clamp(max=w.in_features - 1)
    if w.perm is not None:
        src = w.perm.long()[src]
    return torch.where(valid, src, torch.full_like(src, w.in_features)).to(torch.int32)


def tile_pack(q: "torch.Tensor") -> "torch.Tensor":
    """Pack 4-bit codes ``[K, N]`` (sorted row order; int32, or uint8 at a quarter of the memory) into the tile-major
    `W4A16Weight` layout."""
    import torch

    k, n = q.shape
    kt, nb = -(-k // TILE_K), -(-n // TILE_N)
    padded = torch.zeros(kt * TILE_K, nb * TILE_N, dtype=q.dtype, device=q.device)
    padded[:k, :n] = q
    words = _join_nibbles(padded.view(kt, 8, 16, nb, TILE_N), 1)  # [kt, j, r, nb, n]: row kt*128 + j*16 + r
    return words.permute(2, 0, 3, 1).contiguous().reshape(nb * kt * TILE_N, 16)


def _split_nibbles(words: "torch.Tensor", dim: int, dtype: Optional["torch.dtype"] = None) -> "torch.Tensor":
    """int32 `words` with a new axis of 8 at `dim`: entry i is nibble i (bits 4i .. 4i+3) of each word, in `dtype`
    (int32 by default). The 4-bit form of `unpack_gptq_int32`, at one `dtype` element a code and temporaries of half
    a byte a code, where the general form takes 8 bytes or more."""
    import torch

    shape = list(words.shape)
    shape.insert(dim, 8)
    out = torch.empty(shape, dtype=dtype or torch.int32, device=words.device)
    for i in range(8):
        out.select(dim, i).copy_((words >> (4 * i)) & 0xF)
    return out


def _join_nibbles(codes: "torch.Tensor", dim: int) -> "torch.Tensor":
    """int32 words from the axis of 8 4-bit codes at `dim` (entry i into bits 4i .. 4i+3): the inverse of
    `_split_nibbles`, the 4-bit form of `pack_gptq_int32`."""
    import torch

    shape = list(codes.shape)
    del shape[dim]
    words = torch.zeros(shape, dtype=torch.int32, device=codes.device)
    for i in range(8):
        words |= codes.select(dim, i).to(torch.int32) << (4 * i)
    return words


def unpack_codes_u8(qweight: "torch.Tensor") -> "torch.Tensor":
    """The 4-bit codes of standard GPTQ words (int32 ``[K / 8, N]``) as uint8 ``[K, N]``: one byte a code, where
    `unpack_gptq_int32` takes 8 or more at its peak; for the repacking of act-order weights, whose rows are sorted one
    by one."""
    import torch

    rows, n = qweight.shape
    return _split_nibbles(qweight, 1, torch.uint8).view(rows * 8, n)  # word r, nibble i: row 8r + i


def _transpose_nibbles(words: "torch.Tensor", dim: int) -> "torch.Tensor":
    """Each 8 x 8 nibble block along `dim` (size 8) transposed: nibble ``a`` of word ``b`` of the result is nibble
    ``b`` of word ``a`` of `words`. Works on int32 words, with temporaries of 1/8 of their size."""
    import torch

    out = torch.zeros(words.shape, dtype=torch.int32, device=words.device)
    for a in range(8):
        src = words.select(dim, a)
        for b in range(8):
            out.select(dim, b).bitwise_or_(((src >> (4 * b)) & 0xF) << (4 * a))
    return out


def tile_pack_gptq_words(qweight: "torch.Tensor") -> "torch.Tensor":
    """`tile_pack` of the 4-bit codes in standard GPTQ words (int32 ``[K / 8, N]``, rows in order) without unpacking
    them: inside a 128-row tile, nibble ``j`` of the repacked word ``r = 8h + i`` (row ``16j + r``) is nibble ``i`` of
    the standard word ``2j + h``, so the repacking is a nibble transpose of each column's 16 words. It takes about
    1.5 bytes a weight at its peak, where unpacking to one int per code takes 8 or more."""
    import torch

    rows, n = qweight.shape
    kt, nb = -(-rows * 8 // TILE_K), -(-n // TILE_N)
    padded = torch.zeros(kt * 16, nb * TILE_N, dtype=torch.int32, device=qweight.device)
    padded[:rows, :n] = qweight
    out = _transpose_nibbles(padded.view(kt, 8, 2, nb, TILE_N), 1)  # [kt, j, h, nb, n] -> word i of [kt, i, h, nb, n]
    return out.permute(3, 0, 4, 2, 1).contiguous().view(nb * kt * TILE_N, 16)  # [nb, kt, n, h, i]: word 8h + i


def untile_gptq_words(w: "W4A16Weight") -> "torch.Tensor":
    """The standard GPTQ words (int32 ``[K / 8, N]``) of a kernel-ready weight without a permutation whose K is a
    multiple of 8: the inverse nibble transpose of `tile_pack_gptq_words`, with no unpacking."""
    kt, nb = w.k_tiles, w.n_blocks
    tiles = w.qweight.view(nb, kt, TILE_N, 2, 8)  # [nb, kt, n, h, i]: repacked word 8h + i
    words = _transpose_nibbles(tiles, 4)  # word j of [nb, kt, n, h, j]: standard word 2j + h
    return words.permute(1, 4, 3, 0, 2).reshape(kt * 16, nb * TILE_N)[: w.in_features // 8, : w.out_features]


def prepare_gptq_weight(
    qweight: "torch.Tensor",
    qzeros: "torch.Tensor",
    scales: "torch.Tensor",
    g_idx: Optional["torch.Tensor"],
    bits: int = 4,
    group_size: int = 128,
    checkpoint_format: str = "gptq",
) -> W4A16Weight:
    """Repack standard GPTQ tensors once into the `W4A16Weight` layout (sym and asym, act-order)."""
    import torch

    _check_bits(bits)
    _check_format(checkpoint_format)
    if qweight.dtype != torch.int32 or qzeros.dtype != torch.int32:
        raise InvalidArgumentError("qweight and qzeros must be int32 GPTQ words; got "
                                   f"{qweight.dtype} and {qzeros.dtype}.")
    n = scales.shape[1]
    if qweight.shape[1] != n:
        raise InvalidArgumentError(f"qweight has {qweight.shape[1]} columns but scales has {n}; they must match.")
    k = g_idx.shape[0] if g_idx is not None else qweight.shape[0] * 32 // bits
    n_groups = scales.shape[0]
    gs = k if group_size in (-1, 0) else group_size
    raw = {"qweight": qweight, "qzeros": qzeros, "scales": scales, "g_idx": g_idx, "checkpoint_format": checkpoint_format}
    if bits != 4 or (gs < k and gs % 16 != 0):
        return W4A16Weight(None, scales, None, None, k, n, gs, bits, kernel_ready=False, raw=raw)
    if g_idx is None:
        g_idx = torch.arange(k, device=qweight.device, dtype=torch.int32) // gs
    g = g_idx.long()
    expected = torch.arange(k, device=g.device) // gs
    perm = None
    in_order = torch.equal(g, expected)
    if in_order and k % 8 == 0 and qweight.shape[0] * 8 >= k:
        words = tile_pack_gptq_words(qweight[: k // 8])  # rows in order: a nibble transpose of the words
    else:
        q = unpack_codes_u8(qweight)[:k]
        if not in_order:
            order = torch.sort(g, stable=True).indices
            if not torch.equal(g[order], expected):
                return W4A16Weight(None, scales, None, None, k, n, gs, bits, kernel_ready=False, raw=raw)
            q = q[order]
            perm = order.to(torch.int32).contiguous()
        words = tile_pack(q)
    if -(-k // gs) != n_groups:
        raise InvalidArgumentError(
            f"scales has {n_groups} groups but K={k} with group_size={group_size} needs {-(-k // gs)}; "
            "pass the group_size the checkpoint was quantized with (-1 for one group)."
        )
    zeros = _real_zeros(qzeros, 4, n, checkpoint_format)
    zeros_t: Optional[torch.Tensor] = zeros.to(torch.float16).contiguous()
    if bool((zeros == 8).all()):
        zeros_t = None
    return W4A16Weight(
        qweight=words,
        scales=scales.to(torch.float16).contiguous(),
        zeros=zeros_t,
        perm=perm,
        in_features=k,
        out_features=n,
        group_size=gs,
        bits=4,
        kernel_ready=True,
    )


def concat_weights(parts: list[W4A16Weight], column_order: Optional["torch.Tensor"] = None) -> Optional[W4A16Weight]:
    """One weight whose columns are `parts`' columns side by side (q/k/v or gate/up of one layer),
    so the layer runs one matmul instead of several; None when they cannot share one launch
    (different K, group size, act-order permutation, zero handling, or a part not kernel-ready).

    `column_order` (int64 ``[N_total]``, a permutation of the joined columns) reorders the result's
    columns: output column ``j`` is joined column ``column_order[j]``. The paged engine uses it to emit
    gate/up in the sorted input order of an act-order down projection (`modeling.paged_model`)."""
    import torch

    first = parts[0]
    for p in parts:
        if not p.kernel_ready or p.in_features != first.in_features or p.group_size != first.group_size:
            return None
        if (p.perm is None) != (first.perm is None) or (p.perm is not None and not torch.equal(p.perm, first.perm)):
            return None
    scales = torch.cat([p.scales for p in parts], dim=1)
    any_zeros = any(p.zeros is not None for p in parts)
    zeros = None
    if any_zeros:
        zeros = torch.cat([p.zeros if p.zeros is not None else torch.full_like(p.scales, 8.0) for p in parts], dim=1)
    if column_order is None and all(p.out_features % TILE_N == 0 for p in parts[:-1]):
        # the layout is column block after column block: parts of whole blocks join by their words one after another,
        # with no unpacking (which would take 8 bytes a weight at its peak)
        return W4A16Weight(
            qweight=torch.cat([p.qweight for p in parts]), scales=scales.contiguous(),
            zeros=zeros.contiguous() if zeros is not None else None, perm=first.perm,
            in_features=first.in_features, out_features=sum(p.out_features for p in parts),
            group_size=first.group_size, bits=4, kernel_ready=True,
        )
    codes = torch.cat([p.codes(torch.uint8) for p in parts], dim=1)
    if column_order is not None:
        order = column_order.to(device=codes.device, dtype=torch.long)
        if order.shape != (codes.shape[1],) or not torch.equal(torch.sort(order).values,
                                                              torch.arange(codes.shape[1], device=order.device)):
            raise InvalidArgumentError(f"column_order must be a permutation of the {codes.shape[1]} joined columns.")
        codes, scales = codes[:, order], scales[:, order]
        zeros = zeros[:, order] if zeros is not None else None
    return W4A16Weight(
        qweight=tile_pack(codes),
        scales=scales.contiguous(),
        zeros=zeros.contiguous() if zeros is not None else None,
        perm=first.perm,
        in_features=first.in_features,
        out_features=sum(p.out_features for p in parts),
        group_size=first.group_size,
        bits=4,
        kernel_ready=True,
    )


def gptq_qweight(w: W4A16Weight, columns: "slice | torch.Tensor | None" = None) -> "torch.Tensor":
    """The standard GPTQ ``qweight`` (int32 ``[K / 8, N]``, the checkpoint's row order) of a kernel-ready weight's
    output `columns` (a slice or an index tensor; all of them by default): the inverse of `prepare_gptq_weight`'s
    repacking, bit for bit, so a layer that keeps only its repacked copy still saves what it was loaded from."""
    import torch

    if not w.kernel_ready:
        raise InvalidArgumentError("gptq_qweight needs a kernel-ready weight; others keep their GPTQ tensors in `raw`.")
    if w.perm is None and w.in_features % 8 == 0 and (columns is None or columns_in_place(w, columns)):
        return untile_gptq_words(w if columns is None else select_columns(w, columns)).contiguous()
    codes = w.codes(torch.uint8)
    if columns is not None:
        codes = codes[:, columns]
    if w.perm is not None:  # codes() is in the sorted row order: sorted row k is original row perm[k]
        original = torch.empty_like(codes)
        original[w.perm.long()] = codes
        codes = original
    if codes.shape[0] % 8:
        return pack_gptq_int32(codes.to(torch.int32), 4, dim=0)
    return _join_nibbles(codes.reshape(-1, 8, codes.shape[1]), 1)  # word r, nibble i: row 8r + i


def columns_in_place(w: W4A16Weight, columns: "slice | torch.Tensor") -> bool:
    """Whether `select_columns(w, columns)` reads `w`'s words in place: a step-1 slice from a `TILE_N` column block's
    start to one's end (or to ``w.out_features``)."""
    if not isinstance(columns, slice):
        return False
    start, stop, step = columns.indices(w.out_features)
    return step == 1 and stop > start and start % TILE_N == 0 and (stop % TILE_N == 0 or stop == w.out_features)


def select_columns(w: W4A16Weight, columns: "slice | torch.Tensor") -> W4A16Weight:
    """The kernel-ready weight of `w`'s output `columns` (a step-1 slice or an index tensor). A slice that starts on
    a `TILE_N` column block and ends on one (or at ``w.out_features``) reads `w`'s words in place: its column blocks
    are one contiguous run of the tile-major layout, so a layer whose columns a fused weight holds costs no copy of
    its codes. Any other selection is a repacked copy."""
    import torch

    if not w.kernel_ready:
        raise InvalidArgumentError("select_columns needs a kernel-ready weight.")
    if isinstance(columns, slice):
        start, stop, step = columns.indices(w.out_features)
        if step != 1 or stop <= start:
            raise InvalidArgumentError(f"select_columns takes a non-empty step-1 slice; got {columns}.")
        if columns_in_place(w, columns):
            run = w.k_tiles * TILE_N  # word rows of one column block
            return W4A16Weight(
                qweight=w.qweight[start // TILE_N * run: -(-stop // TILE_N) * run],
                scales=w.scales[:, start:stop].contiguous(),
                zeros=w.zeros[:, start:stop].contiguous() if w.zeros is not None else None,
                perm=w.perm, in_features=w.in_features, out_features=stop - start, group_size=w.group_size,
                bits=4, kernel_ready=True, x_order=w.x_order,
            )
        columns = torch.arange(start, stop, device=w.qweight.device)
    index = columns.to(device=w.qweight.device, dtype=torch.long)
    return W4A16Weight(
        qweight=tile_pack(w.codes(torch.uint8)[:, index]),
        scales=w.scales[:, index].contiguous(),
        zeros=w.zeros[:, index].contiguous() if w.zeros is not None else None,
        perm=w.perm, in_features=w.in_features, out_features=int(index.numel()), group_size=w.group_size,
        bits=4, kernel_ready=True, x_order=w.x_order,
    )


def w4a16_matmul_reference(x: "torch.Tensor", w: W4A16Weight, bias: Optional["torch.Tensor"] = None) -> "torch.Tensor":
    """``x @ W (+ bias)`` with W dequantized in float32; the result in x's dtype."""
    out = x.float() @ w.dequantize().to(x.device)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype)


def _check_x(x: "torch.Tensor", w: W4A16Weight) -> None:
    import torch

    if x.shape[-1] != w.in_features:
        raise InvalidArgumentError(
            f"activation has {x.shape[-1]} features but the GPTQ weight expects {w.in_features} inputs."
        )
    if x.dtype not in (torch.float16, torch.bfloat16):
        raise InvalidArgumentError(f"W4A16 activations must be float16 or bfloat16, got {x.dtype}.")


SMALL_WEIGHT = 1 << 25
"""Weights with fewer elements (K x N) than this (4096 x 4096 and smaller; about 33.5M) take the
fused GEMM's SMALL configs (`_w4a16_gemm_triton.GEMM_CONFIGS`): few column blocks to spread over the GPU."""
WIDE_N = 8192
"""Output widths from this on keep the fused GEMM to more rows: the GEMM's parallelism is its column
blocks, so a narrow weight (N = 4096) runs out of it, and loses to dequant + BLAS, earlier."""
PIPELINED_MIN_WEIGHT = 1 << 24
"""Weights under this many elements (K x N; 4096 x 4096) never take the pipelined GEMM, and weights of
exactly this many take it only up to ``pipelined_max_small`` rows (``pipelined_max_small_one_group`` with one scale
group per tile): too few column tiles to hide its per-tile cost at more rows (H100, 4096x4096, RESULTS.md round17:
1.15-1.30x faster than the fused GEMM at 17-64 rows with the staged classes; g128 in fp16 and in bf16 planes won up
to 256 rows, round23; g32 1.16x dequant + BLAS at 128 rows and 0.99x at 192, act-order g32 1.06x at 256 and 0.91x at
320, round24, where round 17's losses of act-order g32 at 96-128 rows proved a benchmark fault)."""


LONG_K = 8192
"""Inputs wider than this (14336, 11008: the down projections) make a long-input weight: few column tiles and
many K tiles to share out, which decides its pipelined tile at 65-128 rows (`_w4a16_pipelined_triton.
pipelined_config`) and keeps a narrow output on the pipelined GEMM for prefill rows (`ROUTE_LIMITS`)."""


class RouteLimits(NamedTuple):
    """The dispatcher's row thresholds for one arch family (see `ROUTE_LIMITS`)."""

    stream_max: int
    gemm_max_wide: int
    gemm_max_narrow: int
    pipelined_min: int
    pipelined_max_wide: int
    pipelined_max_narrow: int
    pipelined_max_small: int
    pipelined_max_small_one_group: int
    pipelined_max_narrow_bf16: int
    pipelined_max_prefill: int
    pipelined_max_act_order: int
    pipelined_max_act_order_long: int


ROUTE_LIMITS: dict[str, RouteLimits] = {
    "hopper": RouteLimits(1, 128, 64, 2, 256, 256, 128, 256, 128, 512, 256, 512),
    "cdna": RouteLimits(1, 128, 64, 2, 128, 128, 32, 128, 0, 256, 32, 32),
    "rdna3": RouteLimits(1, 128, 64, 2, 16, 16, 16, 16, 0, 0, 16, 16),
    "default": RouteLimits(1, 128, 64, 2, 256, 256, 128, 256, 128, 512, 256, 512),
    "cpu": RouteLimits(16, 1 << 62, 1 << 62, 0, 0, 0, 0, 0, 0, 0, 0, 0),
}
"""The dispatcher's thresholds, all of them, per arch family (`RouteLimits`). Up to ``stream_max`` rows
the persistent stream-K kernel runs (the one-row FMA loop); from
``pipelined_min`` to ``pipelined_max_wide`` rows for an output at least `WIDE_N` wide
(``pipelined_max_narrow`` otherwise, ``pipelined_max_narrow_bf16`` for bf16 activations on a weight of several
scale groups per 128-row tile, bf16's float32 form; ``pipelined_max_small`` for a weight of exactly
`PIPELINED_MIN_WEIGHT` elements, ``pipelined_max_small_one_group`` where it has one scale group per tile) the
pipelined fused GEMM (`_w4a16_pipelined_triton`: a weight of at least `PIPELINED_MIN_WEIGHT` elements; on AMD fp16,
and bf16 with one scale group per tile); a weight with one scale group per 128-row tile (group 128 or coarser) keeps it
to ``pipelined_max_prefill`` rows in fp16 when its output is wide or its input longer than `LONG_K`, unless it is an
act-order weight, which takes it to ``pipelined_max_act_order`` rows at most (``pipelined_max_act_order_long`` where
its input is longer than `LONG_K`); up to
``gemm_max_wide`` / ``gemm_max_narrow`` rows the fused GEMM (`_w4a16_gemm_triton`: dequantized in
registers, fed to ``tl.dot``, split-K when its tiles do not fill the GPU); above, dequantize once into
a dense weight and call the BLAS matmul, which amortizes the dense write over many rows.

From the H100 runs (benchmarks/RESULTS.md): the fused GEMM / stream / dequant+BLAS crossover (section
w4gemm; us): 2 rows 34/44/109 on 4096x14336 and 16/18/29 on 4096x4096 (so the stream kernel keeps one
row only); 128 rows 62/-/107 on 4096x14336 but 136/-/113 on 14336x4096; 64 rows 63/-/110 on 14336x4096
and 28/-/27 on 4096x4096. The pipelined GEMM (section w4pipe) beats
the fused GEMM and dequant + BLAS up to 256 rows on wide outputs (1.2-1.6x at 192-256 rows on
4096x28672 / 4096x12288); with the staged 64-row classes of fp16 (round17) also to 256 on narrow ones
(1.20-1.64x dequant + BLAS at 160-256 rows on 4096x6144, 14336x4096 and 11008x4096; bf16's float32 form, in
registers, lost up to 0.76x there and stays at 128), and on 4096x4096 to 128 in g32 (1.15-1.30x the fused GEMM at
17-64 rows, round17; 1.16x dequant + BLAS at 128 rows, 0.99x at 192, round24). Round 23
(bf16 planes of q - z, one scale group per tile, g128): bf16 is 1.10-1.65x dequant + BLAS at 96-256 rows on
4096x6144 and 4096x4096 and 1.16-2.47x on the other Llama projections, fp16 on 4096x4096 1.11-1.24x, so such layouts
take narrow outputs to 256 rows in bf16 and 4096x4096 to 256 in both (``pipelined_max_small_one_group``); with the fp16
dequantization and two K tiles per step (section w4half) it also beats the fused GEMM from 4 rows
(1.4-1.7x at 4-8 rows). Prefill chunks of 257-512 rows (round18): 1.02-1.35x dequant + BLAS on wide and
long-input outputs in g128 at 320 rows, 1.03-1.09x at 512 (4096x6144 lost from 384 rows and act-order g32 at
320-512, 0.80-0.92x: they stay on dequant + BLAS); bf16 on narrow long-input outputs at 160-256 rows with the
256 x 128 tile 1.23-1.34x. Since round 17 it takes 2-3 rows too, where its staged 16-row class beat the
few-row kernel (since removed) by 1.02-1.31x at 2 rows and 1.31-1.62x at 3 without act-order, and since round 24 with
it (1.08-1.57x, g32 and g128: round 17's 0.47-0.73x timed each weight copy's activation-order build inside the
replayed graph, a benchmark fault). Act-order weights (x gathered in a launch of its own) keep it to
``pipelined_max_act_order`` rows: on the H100 g128 won to 320-384 rows on wide outputs but lost from 256 on
14336x4096 (0.93x) and at 320-512 on narrow long-input ones (0.92-0.98x), g32 won to 256 (round24). With x gathered
by whole rows (round25: 20.5 -> 7.0 us at 256 rows of 14336) g128 takes 0.76-0.87x the time of the next route at 384-512
rows on 14336x4096 and 11008x4096, hence ``pipelined_max_act_order_long``, but 0.90-1.14x at 384 and 1.01-1.09x at
512 on the wide outputs and 0.87-0.96x on 4096x4096 (which stops at 256 without act-order too). The AMD
families use the measured NVIDIA values for the portable kernels until measured there. Since round 18 they run
the pipelined GEMM in its portable form (plain word loads, the fp16 dequantization in Triton's own operations,
2 stages; fp16 activations only): on an H100 that form of CDNA's classes (up to 64-row tiles) ran 1.06-1.99x as
fast as AMD's previous route (the fused GEMM, or dequant + BLAS) at 2-128 rows on the Llama projections (act-order
g32 at 128 rows 0.95x), and 1.00-1.18x as fast as dequant + BLAS at 256 rows in g128 (act-order g32 0.75-0.87x);
on 4096x4096 it was 0.99-1.06x at 32-64 rows. gfx1100 keeps the 16-row tile (the only one without scratch there in every
layout), which won 1.29-1.99x up to 16 rows. Hence CDNA to 128 rows (one group per tile, wide or long-input:
256), 4096x4096 to 32, gfx1100 to 16 (RESULTS.md round18). Round 24, the CDNA form re-timed on an H100 with every
weight copy warmed: 4096x4096 g128 1.10-1.15x at 32-128 rows in fp16 and 1.11-1.15x in bf16 (0.81x at 256), so one
group per tile takes it to 128 there; act-order 1.27x at 32 rows, 1.00-1.13x at 64 in fp16 and 0.92x in bf16, 0.84x at
256, so act-order stops at 32. The interpreter ("cpu") never takes the dequant route
on its own (that would test the BLAS, not our kernels)."""
STREAM_MAX_M: dict[str, int] = {fam: lim.stream_max for fam, lim in ROUTE_LIMITS.items()}
"""Rows the stream kernel serves per family (derived from `ROUTE_LIMITS`)."""
_FAMILY_ALIAS = {"cdna2": "cdna", "cdna3": "cdna", "cdna4": "cdna"}


def choose_route(m: int, family: str, n: Optional[int] = None, pipelined: bool = False,
                 weight_elems: Optional[int] = None, bf16: bool = False, k: Optional[int] = None,
                 one_group: bool = False, act_order: bool = False) -> str:
    """"stream" (persistent GEMV-like kernel), "pipelined" (pipelined fused GEMM, only where `pipelined` says it
    applies, for a weight of at least `PIPELINED_MIN_WEIGHT` elements; unknown counts as more), "gemm" (fused tiled
    GEMM) or "dequant" (dense weight + BLAS) for `m` rows and an output `n` wide on an arch family (the one place
    the thresholds are read; an unknown width counts as wide); `bf16`: bf16 activations; `k`: the input
    width (unknown: not long); `one_group`: the weight has one scale group per 128-row tile; `act_order`: its rows
    are permuted (x gathered into their order first)."""
    lim = ROUTE_LIMITS.get(_FAMILY_ALIAS.get(family, family), ROUTE_LIMITS["default"])
    if m <= lim.stream_max:
        return "stream"
    narrow = n is not None and n < WIDE_N
    long_k = k is not None and k > LONG_K
    if not narrow:
        top = lim.pipelined_max_wide
    else:  # bf16's float32 form (several groups per tile) lost to dequant + BLAS earlier; its planes did not
        top = lim.pipelined_max_narrow_bf16 if bf16 and not one_group else lim.pipelined_max_narrow
    if one_group and not bf16 and (long_k or not narrow):
        top = max(top, lim.pipelined_max_prefill)
    if weight_elems is not None and weight_elems <= PIPELINED_MIN_WEIGHT:
        small = lim.pipelined_max_small_one_group if one_group else lim.pipelined_max_small
        top = min(top, small) if weight_elems == PIPELINED_MIN_WEIGHT else 0
    if act_order:
        top = min(top, lim.pipelined_max_act_order_long if long_k else lim.pipelined_max_act_order)
    if pipelined and lim.pipelined_min <= m <= top:
        return "pipelined"
    return "gemm" if m <= (lim.gemm_max_narrow if narrow else lim.gemm_max_wide) else "dequant"


def dispatch_route(m: int, w: W4A16Weight, dtype: "torch.dtype", arch: str) -> str:
    """The route `w4a16_matmul` takes for `m` rows of `dtype` activations times `w` on `arch` (a
    `runtime.device_arch` string; "cpu" for the interpreter): `choose_route` with the weight's shape
    and which kernels can serve it (AMD sends bf16 past the pipelined one unless the weight has one scale group per
    tile: `_w4a16_pipelined_triton.pipelined_eligible`)."""
    import torch

    from . import _w4a16_pipelined_triton as kp
    from ._w4a16_triton import _chunks, _group_arg
    from .runtime import arch_family

    return choose_route(m, arch_family(arch), w.out_features, pipelined=kp.pipelined_eligible(arch, w, dtype),
                        weight_elems=w.in_features * w.out_features, bf16=dtype == torch.bfloat16, k=w.in_features,
                        one_group=_chunks(_group_arg(w)) == 1, act_order=w.perm is not None)


ACCUMULATING_ROUTES = ("stream", "pipelined")
"""The routes whose kernels can leave their float32 sums in a caller's accumulator (`w4a16_accumulate`)."""
ACCUMULATE_MAX_ROWS = 16
"""Most rows `accumulating_route` takes. The reader of an accumulator moves 4 bytes per value and writes the zeros
back, against 2 bytes read from a half-precision output: at 64 rows that traffic cost more than the flush
it saves (H100 decode step, GPTQ batch 64: Llama-3-8B 6.417 -> 6.452 ms, Llama-2-7B 10.457 -> 10.485; at
16 rows 3.630 -> 3.524 and 4.482 -> 4.372; RESULTS.md round 13)."""


def accumulating_route(x: "torch.Tensor", w: W4A16Weight) -> Optional[str]:
    """The route of `ACCUMULATING_ROUTES` that `w4a16_accumulate` would take for `x` (``[M, K]``, fp16/bf16, at
    most `ACCUMULATE_MAX_ROWS` rows) times `w`, or None: the Triton kernels run here and the dispatcher
    sends M rows to an accumulating route (1-16 rows, but on AMD not 2-16 rows of bf16 on a weight of several scale
    groups per tile, which take the fused GEMM)."""
    import torch

    from .runtime import kernel_arch

    if x.dim() != 2 or x.dtype not in (torch.float16, torch.bfloat16) or not (w.kernel_ready and use_triton(x, w.qweight)):
        return None
    if x.shape[0] > ACCUMULATE_MAX_ROWS:
        return None
    route = dispatch_route(x.shape[0], w, x.dtype, kernel_arch(x))
    return route if route in ACCUMULATING_ROUTES else None


_ACCUMULATORS: dict[tuple[Any, int], "torch.Tensor"] = {}


def accumulator(device: "torch.device", n: int, rows: int) -> "torch.Tensor":
    """A zeroed float32 ``[rows, n]`` accumulator for `w4a16_accumulate`, one per device and N (at most
    `ACCUMULATE_MAX_ROWS` rows, allocated once at full size so graph captures see a fixed address).

    The contract that makes sharing safe: every accumulated result is read by the very next kernel that
    touches the buffer, and that kernel leaves it zeroed (`rms_norm(..., accumulated=True)`,
    `silu_and_mul(..., accumulated_dtype=)`, `rope_cache.rotary_and_cache_accumulated`); no other W4A16 call of
    the same N runs in between."""
    import torch

    if rows > ACCUMULATE_MAX_ROWS:
        raise InvalidArgumentError(f"an accumulator holds at most {ACCUMULATE_MAX_ROWS} rows; got {rows}")
    key = (device, n)
    buf = _ACCUMULATORS.get(key)
    if buf is None:
        with torch.inference_mode(False):  # a normal tensor even when first asked for under inference mode
            buf = _ACCUMULATORS[key] = torch.zeros(ACCUMULATE_MAX_ROWS, n, dtype=torch.float32, device=device)
    return buf[:rows]


_PAIR_ORDERS: dict[tuple[Any, int], "torch.Tensor"] = {}


def pair_order(k: int, device: "torch.device") -> "torch.Tensor":
    """The pair order of a one-row W4A16 input of `k` values (a multiple of `TILE_K`) as int64 ``[k]``: position p
    holds plain column ``pair_order(k)[p]`` (in each 128-value block, its two halves interleaved; see
    `_pairs`). ``x[..., pair_order(k)]``, viewed as int32 words, is what the one-row kernel's packed loop
    multiplies: word i holds rows ``r`` and ``r + 64`` of K tile ``i // 64`` (``r = i % 64``). Kept per device
    and k (built once, before any graph capture reads it)."""
    import torch

    if k % TILE_K:
        raise InvalidArgumentError(f"the pair order needs a length that is a multiple of {TILE_K}; got {k}")
    key = (torch.device(device), k)
    order = _PAIR_ORDERS.get(key)
    if order is None:
        pos = torch.arange(k)
        local = pos % TILE_K
        order = pos - local + local // 2 + (local % 2) * (TILE_K // 2)
        with torch.inference_mode(False):
            order = _PAIR_ORDERS[key] = order.to(device)
    return order


def to_pair_order(x: "torch.Tensor") -> "torch.Tensor":
    """`x` with its last dim put in `pair_order` (what a producer's ``paired=True`` writes; the references use it)."""
    return x.index_select(-1, pair_order(x.shape[-1], x.device))


def takes_pairs(rows: int, dtype: "torch.dtype", w: W4A16Weight) -> bool:
    """Whether `w4a16_accumulate(x, w, acc, paired=True)` serves an `x` of `rows` rows of `dtype`: one fp16 row on
    the stream kernel's packed loop (NVIDIA), no permutation in the weight (an act-order layer's producer gathers
    its input already, `perm=` of `rms_norm`) and K a multiple of `TILE_K`. A producer then writes x in
    `pair_order` (`rms_norm(..., paired=True)`, `silu_and_mul(..., paired=True)`), and the matmul loads its
    activation pairs as plain words: on an H100 0.1-0.8 us less per call on the Llama decode shapes, the same on
    4096x4096 (RESULTS.md round 19)."""
    import torch

    from .runtime import kernel_arch

    if (rows != 1 or dtype != torch.float16 or w.perm is not None or w.in_features % TILE_K or not w.kernel_ready
            or not use_triton(w.qweight)):
        return False
    arch = kernel_arch(w.qweight)
    if arch == "cpu":  # the interpreter runs the float32 loop (and the kernel module is imported only to run one)
        return False
    from . import _w4a16_triton as kt

    return dispatch_route(1, w, dtype, arch) == "stream" and kt.one_row_packed(arch, w)


def w4a16_accumulate(x: "torch.Tensor", w: W4A16Weight, acc: "torch.Tensor",
                     route: Optional[str] = None, paired: bool = False) -> "torch.Tensor":
    """``acc += x @ W`` in float32, for a zeroed `acc` (`accumulator`) and an `x` that `accumulating_route` takes;
    returns `acc`. The kernel then ends without its split-K flush: no ticket, no read-back by the last
    sharer of a tile, no output store (RESULTS.md round 13). No bias (the decoder only asks without one).
    `route`: what `accumulating_route` already returned for these operands (skips the second lookup).
    `paired`: x is in `pair_order` (only where `takes_pairs` holds)."""
    from . import _w4a16_triton as kt
    from .runtime import kernel_arch

    _check_x(x, w)
    route = route or accumulating_route(x, w)
    if route not in ACCUMULATING_ROUTES:
        raise InvalidArgumentError("w4a16_accumulate needs an accumulating route (check `accumulating_route` first)")
    if tuple(acc.shape) != (x.shape[0], w.out_features) or not acc.is_contiguous():
        raise InvalidArgumentError(f"accumulator shape {tuple(acc.shape)}; expected {(x.shape[0], w.out_features)}")
    if paired and not takes_pairs(x.shape[0], x.dtype, w):
        raise InvalidArgumentError("paired=True: this call does not take paired input (check `takes_pairs` first)")
    x2 = x if x.stride(-1) == 1 else x.contiguous()
    arch = kernel_arch(x)
    if route == "stream":
        kt.stream_matmul(x2, w, None, acc, arch, accumulate=True, paired=paired)
    else:
        from . import _w4a16_pipelined_triton as kp

        kp.pipelined_matmul(x2, w, None, arch, accumulate_into=acc)
    return acc


def w4a16_matmul(x: "torch.Tensor", w: W4A16Weight, bias: Optional["torch.Tensor"] = None,
                 route: Optional[str] = None, config: Optional[dict[str, Any]] = None) -> "torch.Tensor":
    """``x [..., K] @ W [K, N] (+ bias)`` for a prepared GPTQ weight, output ``[..., N]`` in x's dtype.

    Runs the Triton kernels (see `choose_route`) when `use_triton(x)` holds and the weight is
    4 bit; otherwise the float32 reference. `route` / `config` override the choice (benchmarks, tests).
    """
    import torch

    _check_x(x, w)
    if not (w.kernel_ready and use_triton(x, w.qweight)):
        return w4a16_matmul_reference(x, w, bias)
    from . import _w4a16_triton as kt
    from .runtime import kernel_arch

    k, n = w.in_features, w.out_features
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    arch = kernel_arch(x)
    route = route or dispatch_route(m, w, x2.dtype, arch)
    if route == "dequant":
        out = kt.dequant_matmul(x2, w, bias, arch)
    elif route == "gemm":
        from . import _w4a16_gemm_triton as kg

        out = kg.gemm_matmul(x2, w, bias, arch, config)
    elif route == "stream":
        out = torch.empty(m, n, dtype=x.dtype, device=x.device)
        for m0 in range(0, m, kt.WS_ROWS):  # more rows than the workspace holds: only when forced
            rows = slice(m0, min(m, m0 + kt.WS_ROWS))
            kt.stream_matmul(x2[rows], w, bias, out[rows], arch, config)
    elif route == "pipelined":
        from . import _w4a16_pipelined_triton as kp

        out = kp.pipelined_matmul(x2, w, bias, arch, config)
    else:
        raise InvalidArgumentError(
            f"route={route!r} is unknown; expected 'stream', 'gemm', 'pipelined' or 'dequant'."
        )
    return out.reshape(*x.shape[:-1], n)
