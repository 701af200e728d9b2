"""`GPTQConfig`: every knob of a GPTQ (or RTN) run, and the `quantization_config` it writes.

The dictionary written to config.json follows what transformers' `GPTQConfig` and GPT-QModel read
(quant_method "gptq", bits, group_size, desc_act, sym, checkpoint_format / format, meta), so the
checkpoints we save load in those tools and theirs load in ours.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ..errors import InvalidArgumentError

SUPPORTED_BITS = (2, 3, 4, 8)
CHECKPOINT_FORMATS = ("gptq", "gptq_v2")
PER_ROW = -1
"""`group_size` of one group spanning all K inputs, i.e. one scale/zero per output row of the weight.

This is the one encoding inside the package, the one transformers and GPT-QModel write in
`quantization_config`; `group_rows` turns it into rows per group where a layer's K is known."""


def group_rows(group_size: int, in_features: int) -> int:
    """Input rows per group of a layer with `in_features` inputs (`in_features` for `PER_ROW`)."""
    return in_features if group_size == PER_ROW else group_size


def declares_gptq(config: dict[str, Any]) -> bool:
    """True when a config.json dict carries a GPTQ `quantization_config` (the one place that asks)."""
    qc = config.get("quantization_config") or {}
    return isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "gptq"


@dataclass
class GPTQConfig:
    """Settings of a GPTQ quantization run.

    bits: 2, 3, 4 or 8. group_size: columns (input features) sharing one scale/zero; -1 for one
    group per output row. desc_act: quantize columns in order of decreasing Hessian diagonal
    (act-order) and record the group of each column in `g_idx`. sym: symmetric grid (zero fixed at
    the middle). damp_percent: fraction of the mean Hessian diagonal added before the Cholesky
    factorization. true_sequential: quantize the linears of a block in dependency order (q/k/v,
    then o, then gate/up, then down), re-running the block between steps so each sees the
    already-quantized inputs. static_groups: compute group scales from the original weights before
    any update (keeps groups contiguous in storage even with desc_act). act_group_aware: without
    desc_act, solve whole groups in decreasing order of Hessian importance, and columns within a group
    likewise (GPT-QModel's "GAR", on by default there and here: SmolLM2 4-bit g128 perplexity 12.3
    with it, 13.6 without); storage stays in order, with a monotone g_idx. Ignored with desc_act. block_size: columns per lazy
    batch update. checkpoint_format: "gptq" (v1, stored zero = real zero - 1, what most tools read)
    or "gptq_v2". modules_to_not_convert: name suffixes left in full precision. lm_head: quantize the
    output head too (GPT-QModel's `lm_head=True`; its input is the final norm's output; a head tied to the
    input embeddings is untied, the embeddings stay in full precision): the head is the largest single
    weight a decode step reads at batch 1 (Llama-3-8B: 1.05 GB in fp16 of 16 GB).
    dataset / n_samples / seqlen / seed: calibration data (see `calibration.get_calibration_data`).
    """

    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    damp_percent: float = 0.01
    true_sequential: bool = True
    static_groups: bool = False
    act_group_aware: bool = True
    block_size: int = 128
    checkpoint_format: str = "gptq"
    modules_to_not_convert: list[str] = field(default_factory=list)
    lm_head: bool = False
    dataset: Any = "pydoc"
    n_samples: int = 128
    seqlen: int = 2048
    seed: int = 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise `InvalidArgumentError` naming the first setting outside what we support."""
        if self.bits not in SUPPORTED_BITS:
            raise InvalidArgumentError(
                f"bits={self.bits} is not supported; expected one of {SUPPORTED_BITS}. Use --bits 4 for the fast W4A16 kernel."
            )
        if self.group_size != PER_ROW and (not isinstance(self.group_size, int) or self.group_size <= 0):
            raise InvalidArgumentError(
                f"group_size={self.group_size!r} is invalid; expected a positive integer (e.g. 128) or -1 for per-row scales."
            )
        if not 0.0 < float(self.damp_percent) < 1.0:
            raise InvalidArgumentError(f"damp_percent={self.damp_percent} must be in (0, 1), e.g. 0.01.")
        if self.block_size <= 0:
            raise InvalidArgumentError(f"block_size={self.block_size} must be a positive number of columns, e.g. 128.")
        if self.checkpoint_format not in CHECKPOINT_FORMATS:
            raise InvalidArgumentError(
                f"checkpoint_format={self.checkpoint_format!r} is not supported; expected one of {CHECKPOINT_FORMATS}."
            )
        if self.n_samples <= 0 or self.seqlen <= 0:
            raise InvalidArgumentError(
                f"n_samples={self.n_samples} and seqlen={self.seqlen} must both be positive (e.g. 128 samples of 2048 tokens)."
            )

    def check_layer(self, name: str, in_features: int) -> None:
        """Raise when this config cannot quantize a linear with `in_features` inputs."""
        if self.group_size != PER_ROW and in_features % self.group_size != 0 and (in_features % self.group_size) % 32 != 0:
            raise InvalidArgumentError(
                f"group_size={self.group_size} does not divide the {in_features} input features of {name}, and the "
                f"last group would hold {in_features % self.group_size} rows (a shorter last group must be a multiple "
                "of 32 rows); choose a group size that divides every layer's input size (e.g. 32, 64 or 128) or -1."
            )
        multiple = 32 if self.bits == 3 else 32 // self.bits
        if in_features % multiple != 0:
            raise InvalidArgumentError(
                f"{name} has {in_features} input features, which {self.bits}-bit GPTQ packing cannot store "
                f"(needs a multiple of {multiple}); leave it unquantized with modules_to_not_convert."
            )

    def to_quantization_config(self) -> dict[str, Any]:
        """The `quantization_config` entry of config.json (transformers / GPT-QModel compatible)."""
        from .. import __version__

        return {
            "quant_method": "gptq",
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.desc_act,
            "sym": self.sym,
            "damp_percent": self.damp_percent,
            "true_sequential": self.true_sequential,
            "static_groups": self.static_groups,
            "checkpoint_format": self.checkpoint_format,
            "format": self.checkpoint_format,
            "pack_dtype": "int32",
            "lm_head": self.lm_head,
            "modules_to_not_convert": list(self.modules_to_not_convert) or None,
            "meta": {
                "quantizer": [f"optimum-amdx:{__version__}"],
                "damp_percent": self.damp_percent,
                "static_groups": self.static_groups,
                "true_sequential": self.true_sequential,
                # what ran: ignored with desc_act (GPT-QModel refuses a config that sets both)
                "act_group_aware": self.act_group_aware and not self.desc_act,
            },
        }

    @classmethod
    def from_quantization_config(cls, qc: dict[str, Any]) -> "GPTQConfig":
        """Read a `quantization_config` written by us, transformers/optimum or GPT-QModel."""
        method = str(qc.get("quant_method", "gptq")).lower()
        if method != "gptq":
            raise InvalidArgumentError(f"quantization_config.quant_method is {method!r}; expected 'gptq'.")
        fmt = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
        if fmt not in CHECKPOINT_FORMATS:
            raise InvalidArgumentError(
                f"quantization_config checkpoint_format {fmt!r} is not supported; expected one of {CHECKPOINT_FORMATS}."
            )
        meta = qc.get("meta") or {}
        return cls(
            bits=int(qc.get("bits", 4)),
            group_size=int(qc.get("group_size", 128)),
            desc_act=bool(qc.get("desc_act", False)),
            sym=bool(qc.get("sym", True)),
            damp_percent=float(qc.get("damp_percent", meta.get("damp_percent", 0.01))),
            true_sequential=bool(qc.get("true_sequential", meta.get("true_sequential", True))),
            static_groups=bool(qc.get("static_groups", meta.get("static_groups", False))),
            act_group_aware=bool(meta.get("act_group_aware") or False),
            checkpoint_format=fmt,
            modules_to_not_convert=list(qc.get("modules_to_not_convert") or []),
            lm_head=bool(qc.get("lm_head", False)),
        )

    def replace(self, **changes: Any) -> "GPTQConfig":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
