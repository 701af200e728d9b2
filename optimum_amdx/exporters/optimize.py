"""ONNX Runtime graph optimization saved to file, restricted to ops MIGraphX can run.

ONNX Runtime's offline optimization (`SessionOptions.optimized_model_filepath`) applies constant
folding and, at the "extended" level, fusions into `com.microsoft` contrib ops (simplified layer
norm, skip layer norm, GELU, fused MatMul, attention). Not every contrib op exists in MIGraphX, so
fusions that produce ops outside `MIGRAPHX_CONTRIB_OPS` are switched off, and the result is
checked op by op. The "all" level (layout transforms specific to the optimizing machine) is never
saved, as ONNX Runtime's documentation advises.

Fusions are assigned per execution provider: on a CPU-only machine fp16 graphs get the basic
level only, since the CPU provider has no fp16 kernels for the fused ops.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import InvalidArgumentError

OPTIMIZE_LEVELS: tuple[str, ...] = ("basic", "extended")

# com.microsoft contrib ops that the MIGraphX execution provider / MIGraphX parser accepts
# (its ONNX parser has parse_* files for each: attention, GELU and layer-norm families, FusedMatMul,
# MatMulNBits, GroupQueryAttention). Ops not known to be parsed there are kept out.
MIGRAPHX_CONTRIB_OPS: frozenset[str] = frozenset({
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "BiasGelu", "FastGelu", "Gelu",
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "MatMulNBits", "FusedMatMul",
})

# ONNX Runtime graph transformers whose outputs MIGraphX cannot run.
_DISABLED_FOR_MIGRAPHX: tuple[str, ...] = (
    "QuickGeluFusion",          # -> com.microsoft.QuickGelu (SiLU in Llama MLPs)
    "GemmActivationFusion",     # -> com.microsoft.FusedGemm
    "ConvActivationFusion",     # -> com.microsoft.FusedConv
    "BiasSoftmaxFusion",        # -> com.microsoft.BiasSoftmax
    "BiasDropoutFusion",        # -> com.microsoft.BiasDropout
    "EmbedLayerNormFusion",     # -> com.microsoft.EmbedLayerNormalization
    "MatMulIntegerToFloatFusion",
    "DynamicQuantizeMatMulFusion",
    "QDQFinalCleanupTransformer",
)


def contrib_ops(path: str | Path) -> list[str]:
    """Sorted `domain.op_type` names of every non-ONNX-domain op in the graph at `path`."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = {f"{n.domain}.{n.op_type}" for n in model.graph.node if n.domain not in ("", "ai.onnx")}
    return sorted(ops)


def migraphx_unsupported(ops: list[str]) -> list[str]:
    """The subset of `contrib_ops(...)` names that MIGraphX cannot run."""
    return [op for op in ops if op.split(".")[-1] not in MIGRAPHX_CONTRIB_OPS]


def optimize_graph(src: Path, dst: Path, level: str = "extended", external_data: bool = False) -> dict:
    """Write an ONNX Runtime-optimized copy of `src` to `dst`; return a summary dict.

    The summary names the level, the contrib ops the graph now uses and whether all of them are
    MIGraphX-runnable.
    """
    import onnxruntime as ort

    if level not in OPTIMIZE_LEVELS:
        raise InvalidArgumentError(f"Unknown optimization level {level!r}; expected one of {', '.join(OPTIMIZE_LEVELS)}.")
    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic" else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    )
    options.optimized_model_filepath = str(dst)
    if external_data:
        options.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", dst.name + ".data"
        )
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(
        str(src), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(_DISABLED_FOR_MIGRAPHX)
    )
    ops = contrib_ops(dst)
    unsupported = migraphx_unsupported(ops)
    return {"level": level, "contrib_ops": ops, "migraphx_compatible": not unsupported,
            "migraphx_unsupported_ops": unsupported}
