"""Check an exported graph against the PyTorch model on seeded random inputs.

Decoders are checked at two points, a left-padded prefill with an empty cache and one decode step
over a random cache, so both uses of the single graph are covered. Outputs at padded positions
(logits, and keys/values from the second layer on) are skipped: those queries attend to nothing,
so their values are arbitrary in both runtimes.

fp16 exports are measured against the model in fp32 (the ground truth), not against PyTorch's
own fp16 run: on the CPU both runtimes round differently (ONNX Runtime computes several fp16 ops
in fp32), and on SmolLM2-135M PyTorch's fp16 logits are further from fp32 (0.12-0.19) than the
exported graph's (0.04-0.12), so "ONNX fp16 == PyTorch fp16 within 0.05" fails for a correct
graph. An fp16 graph passes when its error against fp32 is at most `atol` or at most
`FP16_SLACK` times PyTorch fp16's own error against fp32 on the same inputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from ..errors import ExportValidationError
from .tasks import TEXT_GENERATION
from .wrappers import decoder_shape, example_inputs, past_names, present_names, uses_token_type_ids

DEFAULT_ATOL: dict[str, float] = {"fp32": 1e-3, "fp16": 5e-2}
FP16_SLACK = 1.5


@dataclass
class ValidationReport:
    """Max abs diff per output and case (against fp32 for fp16 exports), and the bound each had to meet."""

    atol: float
    max_abs_diff: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    torch_fp16_diff: dict[str, float] = field(default_factory=dict)

    @property
    def worst(self) -> float:
        return max(self.max_abs_diff.values()) if self.max_abs_diff else 0.0

    def failures(self) -> dict[str, float]:
        return {k: v for k, v in self.max_abs_diff.items() if not v <= self.bound.get(k, self.atol)}

    def to_dict(self) -> dict:
        data = {"atol": self.atol, "max_abs_diff": self.worst, "per_output": self.max_abs_diff}
        if self.torch_fp16_diff:
            data.update(reference="fp32", fp16_slack=FP16_SLACK, torch_fp16_vs_fp32=self.torch_fp16_diff,
                        bound=self.bound)
        return data


def diff(a: np.ndarray | torch.Tensor, b: np.ndarray | torch.Tensor, rows: np.ndarray | None = None) -> float:
    """Max abs difference in fp32, optionally over the rows/positions selected by a boolean mask."""
    got = a.detach().float().numpy() if isinstance(a, torch.Tensor) else a.astype(np.float32)
    ref = b.detach().float().numpy() if isinstance(b, torch.Tensor) else b.astype(np.float32)
    if rows is not None:
        ref, got = ref[rows], got[rows]
    return float(np.abs(ref - got).max()) if ref.size else 0.0


def record(report: ValidationReport, name: str, got, ref_same, ref_fp32=None, rows=None) -> None:
    """Add one output's comparison to `report`: against `ref_same`, or against `ref_fp32` for fp16 graphs."""
    if ref_fp32 is None:
        report.max_abs_diff[name] = diff(got, ref_same, rows)
        report.bound[name] = report.atol
        return
    torch_err = diff(ref_same, ref_fp32, rows)
    report.max_abs_diff[name] = diff(got, ref_fp32, rows)
    report.torch_fp16_diff[name] = torch_err
    report.bound[name] = max(report.atol, FP16_SLACK * torch_err)


def check(report: ValidationReport, graph: str, optimized: bool) -> ValidationReport:
    """Raise `ExportValidationError` naming the outputs over their bound, with the fix that applies."""
    bad = report.failures()
    if not bad:
        return report
    def why(key: str) -> str:
        bound = report.bound.get(key, report.atol)
        if key in report.torch_fp16_diff and bound > report.atol:
            return f"bound {bound:.3g} = {FP16_SLACK:g}x PyTorch fp16's own {report.torch_fp16_diff[key]:.3g} vs fp32"
        return f"atol {report.atol:g}" + (" (vs the fp32 model)" if key in report.torch_fp16_diff else "")

    details = ", ".join(f"{k}: max abs diff {v:.3g} > {why(k)}" for k, v in bad.items())
    fixes = (["re-export without --optimize"] if optimized else []) + ["export in fp32",
                                                                      "raise --atol if the difference is expected"]
    raise ExportValidationError(f"Exported graph {graph} differs from PyTorch: {details}. Fix: {'; or '.join(fixes)}.")


def _session(path: Path):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def validate_export(onnx_path: Path, model: torch.nn.Module, task: str, dtype: torch.dtype, atol: float,
                    reference: torch.nn.Module | None = None, optimized: bool = False) -> ValidationReport:
    """Run graph and model on the same random inputs; raise `ExportValidationError` past the bound.

    `reference` is the fp32 twin of an fp16 `model` (see the module docstring); None compares
    against `model` itself.
    """
    from .wrappers import DecoderWithPast, EncoderOutputs

    session = _session(onnx_path)
    report = ValidationReport(atol=atol)
    config = model.config
    with torch.inference_mode():
        if task == TEXT_GENERATION:
            wrap: Callable = DecoderWithPast
            shape = decoder_shape(config)
            names = ["input_ids", "attention_mask", "position_ids"] + past_names(shape.num_layers)
            cases = {
                "prefill": example_inputs(config, task, dtype, batch=2, seq=6, past=0, seed=1),
                "decode": example_inputs(config, task, dtype, batch=2, seq=1, past=9, seed=2),
            }
            present = present_names(1)[0].split(".")[0]
            for case, ex in cases.items():
                args = [ex["input_ids"], ex["attention_mask"], ex["position_ids"], *ex["past"]]
                got = session.run(None, {n: t.numpy() for n, t in zip(names, args)})
                ref = wrap(model)(ex["input_ids"], ex["attention_mask"], ex["position_ids"], ex["past"])
                ref32 = None
                if reference is not None:
                    ref32 = wrap(reference)(ex["input_ids"], ex["attention_mask"], ex["position_ids"],
                                            [p.float() for p in ex["past"]])
                seq = ex["input_ids"].shape[1]
                live = ex["attention_mask"][:, -seq:].numpy().astype(bool)
                record(report, f"{case}.logits", got[0], ref[0], None if ref32 is None else ref32[0], live)
                mask = ex["attention_mask"].numpy().astype(bool)
                sub = ValidationReport(atol=atol)
                for i, (g, r) in enumerate(zip(got[1:], ref[1:])):
                    r32 = None if ref32 is None else ref32[1 + i].transpose(1, 2)
                    record(sub, str(i), g.transpose(0, 2, 1, 3), r.transpose(1, 2), r32, mask)
                worst = max(sub.max_abs_diff, key=lambda k: sub.max_abs_diff[k] - sub.bound[k])
                report.max_abs_diff[f"{case}.{present}"] = sub.max_abs_diff[worst]
                report.bound[f"{case}.{present}"] = sub.bound[worst]
                if worst in sub.torch_fp16_diff:
                    report.torch_fp16_diff[f"{case}.{present}"] = sub.torch_fp16_diff[worst]
        else:
            output = "last_hidden_state" if task == "feature-extraction" else "logits"
            tt = uses_token_type_ids(config)
            ex = example_inputs(config, task, dtype, batch=3, seq=11, seed=3)
            got = session.run(None, {k: v.numpy() for k, v in ex.items()})
            ref = EncoderOutputs(model, output, tt)(**ex)
            ref32 = EncoderOutputs(reference, output, tt)(**ex) if reference is not None else None
            rows = ex["attention_mask"].numpy().astype(bool) if output == "last_hidden_state" else None
            record(report, output, got[0], ref, ref32, rows)
    return check(report, onnx_path.name, optimized)
