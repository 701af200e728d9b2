"""Check an exported graph against the PyTorch model on seeded random inputs.

Decoders are checked at two points, a left-padded prefill with an empty cache and one decode step
over a random cache, so both uses of the single graph are covered. Outputs at padded positions
(logits, and keys/values from the second layer on) are skipped: those queries attend to nothing,
so their values are arbitrary in both runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..errors import ExportValidationError
from .tasks import TEXT_GENERATION
from .wrappers import decoder_shape, example_inputs, past_names, present_names, uses_token_type_ids

DEFAULT_ATOL: dict[str, float] = {"fp32": 1e-3, "fp16": 5e-2}


@dataclass
class ValidationReport:
    """Max abs diff per output and case, against the tolerance used."""

    atol: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values()) if self.max_abs_diff else 0.0

    def to_dict(self) -> dict:
        return {"atol": self.atol, "max_abs_diff": self.worst, "per_output": self.max_abs_diff}


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _diff(a: np.ndarray, b: torch.Tensor, rows: np.ndarray | None = None) -> float:
    ref = b.detach().float().numpy()
    got = a.astype(np.float32)
    if rows is not None:
        ref, got = ref[rows], got[rows]
    return float(np.abs(ref - got).max()) if ref.size else 0.0


def validate_export(onnx_path: Path, model: torch.nn.Module, task: str, dtype: torch.dtype, atol: float) -> ValidationReport:
    """Run graph and model on the same random inputs; raise `ExportValidationError` past `atol`."""
    from .wrappers import DecoderWithPast, EncoderOutputs

    session = _session(onnx_path)
    report = ValidationReport(atol=atol)
    config = model.config
    with torch.inference_mode():
        if task == TEXT_GENERATION:
            wrapper = DecoderWithPast(model)
            shape = decoder_shape(config)
            names = ["input_ids", "attention_mask", "position_ids"] + past_names(shape.num_layers)
            cases = {
                "prefill": example_inputs(config, task, dtype, batch=2, seq=6, past=0, seed=1),
                "decode": example_inputs(config, task, dtype, batch=2, seq=1, past=9, seed=2),
            }
            for case, ex in cases.items():
                args = [ex["input_ids"], ex["attention_mask"], ex["position_ids"], *ex["past"]]
                feed = {n: t.numpy() for n, t in zip(names, args)}
                got = session.run(None, feed)
                ref = wrapper(ex["input_ids"], ex["attention_mask"], ex["position_ids"], ex["past"])
                seq = ex["input_ids"].shape[1]
                live = ex["attention_mask"][:, -seq:].numpy().astype(bool)
                report.max_abs_diff[f"{case}.logits"] = _diff(got[0], ref[0], live)
                mask = ex["attention_mask"].numpy().astype(bool)
                present = max(_diff(g.transpose(0, 2, 1, 3), r.transpose(1, 2), mask) for g, r in zip(got[1:], ref[1:]))
                report.max_abs_diff[f"{case}.{present_names(1)[0].split('.')[0]}"] = present
        else:
            output = "last_hidden_state" if task == "feature-extraction" else "logits"
            wrapper = EncoderOutputs(model, output, uses_token_type_ids(config))
            ex = example_inputs(config, task, dtype, batch=3, seq=11, seed=3)
            got = session.run(None, {k: v.numpy() for k, v in ex.items()})
            ref = wrapper(**ex)
            rows = ex["attention_mask"].numpy().astype(bool) if output == "last_hidden_state" else None
            report.max_abs_diff[output] = _diff(got[0], ref, rows)
    if not report.worst <= atol:
        details = ", ".join(f"{k}={v:.3g}" for k, v in report.max_abs_diff.items())
        raise ExportValidationError(
            f"Exported graph {onnx_path.name} differs from PyTorch: max abs diff {report.worst:.3g} > atol {atol:g} "
            f"({details}). Re-export without --optimize, in fp32, or raise --atol if the difference is expected."
        )
    return report
