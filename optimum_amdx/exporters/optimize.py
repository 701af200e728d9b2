"""Graph optimization saved to file, restricted to ops MIGraphX can run.

Two stages, checked op by op afterwards against `MIGRAPHX_CONTRIB_OPS` and `MIGRAPHX_PARSED_OPS`:

1. onnxruntime.transformers' Python fusions (provider-independent graph rewriting): RMSNorm +
   residual -> SkipSimplifiedLayerNormalization in decoders; LayerNorm, GELU and attention
   fusions in BERT encoders. EmbedLayerNormalization (no MIGraphX parser) is switched off.
2. fp32 only: ONNX Runtime's own offline optimization (`SessionOptions.optimized_model_filepath`,
   "basic" = constant folding and redundant-node removal, "extended" = + operator fusions), with the
   fusions whose ops MIGraphX cannot run disabled (FusedMatMul among them: MIGraphX's parser for it
   exists only on a feature branch, not in a release). The "all" level (layout transforms specific to
   the optimizing machine) is never saved, as ONNX Runtime advises.

Stage 2 is skipped for fp16 graphs: ONNX Runtime can only optimize here with the CPU provider,
which lacks fp16 kernels for several ops and would bake fp32 Cast nodes into the saved graph,
which is wrong for a GPU provider. "basic" runs stage 2 only; "extended" runs both.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidArgumentError

OPTIMIZE_LEVELS: tuple[str, ...] = ("basic", "extended")

# com.microsoft contrib ops that MIGraphX's ONNX parser accepts (it has a parse_* source for each:
# attention, GELU and layer-norm families, MatMulNBits, GroupQueryAttention).
# Ops not known to be parsed there are kept out.
MIGRAPHX_CONTRIB_OPS: frozenset[str] = frozenset({
    "Attention", "MultiHeadAttention", "GroupQueryAttention", "BiasGelu", "FastGelu", "Gelu",
    "LayerNormalization", "SimplifiedLayerNormalization", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "MatMulNBits",
})

# Every op type MIGraphX's ONNX parser registers (the `operators()` lists of its src/onnx/parse_*.cpp,
# read from ROCm/AMDMIGraphX at commit f729a52, 2026-05). A graph with an op outside this set cannot be
# compiled by MIGraphX: ONNX Runtime would run that part on the CPU.
MIGRAPHX_PARSED_OPS: frozenset[str] = frozenset({
    "ATen", "Abs", "Acos", "Acosh", "Add", "And", "ArgMax", "ArgMin", "Asin", "Asinh", "Atan", "Atanh",
    "Attention", "AveragePool", "BatchNormalization", "BiasAdd", "BiasGelu", "BiasSplitGelu", "BitwiseAnd", "Cast",
    "CastLike", "Ceil", "Celu", "Clip", "Concat", "Constant", "ConstantFill", "ConstantOfShape", "Conv",
    "ConvInteger", "ConvTranspose", "Cos", "Cosh", "CumSum", "DepthToSpace", "DequantizeLinear", "Div", "Dropout",
    "DynamicQuantizeLinear", "DynamicScale", "Einsum", "Elu", "Equal", "Erf", "Exp", "Expand", "EyeLike",
    "FastGelu", "Flatten", "Floor", "GRU", "Gather", "GatherElements", "GatherND", "Gelu", "Gemm",
    "GlobalAveragePool", "GlobalLpPool", "GlobalMaxPool", "Greater", "GreaterOrEqual", "GridSample", "GroupNorm",
    "GroupNormalization", "GroupQueryAttention", "HardSigmoid", "HardSwish", "Hardmax", "Identity", "If",
    "ImageScaler", "InstanceNormalization", "IsInf", "IsNaN", "LRN", "LSTM", "LayerNormalization", "LeakyRelu",
    "Less", "LessOrEqual", "Log", "LogSoftmax", "Loop", "LpNormalization", "LpPool", "MXFixNeuron",
    "MXQuantizeDequantize", "MatMul", "MatMulBnb4", "MatMulInteger", "MatMulIntegerToFloat", "MatMulNBits", "Max",
    "MaxPool", "Mean", "MeanVarianceNormalization", "Min", "Mod", "Mul", "MultiHeadAttention", "Multinomial",
    "Neg", "NegativeLogLikelihoodLoss", "NhwcConv", "NonMaxSuppression", "NonZero", "Not", "OneHot", "Or", "PRelu",
    "Pad", "Pow", "QLinearAdd", "QLinearAveragePool", "QLinearConcat", "QLinearConv", "QLinearGlobalAveragePool",
    "QLinearLeakyRelu", "QLinearMatMul", "QLinearMul", "QLinearSigmoid", "QuantizeLinear", "QuickGelu", "RNN",
    "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Range", "Reciprocal", "ReduceL1",
    "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean", "ReduceMin", "ReduceProd",
    "ReduceSum", "ReduceSumSquare", "Relu", "Reshape", "Resize", "ReverseSequence", "RoiAlign", "RotaryEmbedding",
    "Round", "Scan", "Scatter", "ScatterElements", "ScatterND", "Selu", "Shape", "Shrink", "Sigmoid", "Sign",
    "SimplifiedLayerNormalization", "Sin", "Sinh", "Size", "SkipLayerNormalization",
    "SkipSimplifiedLayerNormalization", "Slice", "Softmax", "SoftmaxCrossEntropyLoss", "Softplus", "Softsign",
    "SpaceToDepth", "Split", "Sqrt", "Squeeze", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Tile", "TopK",
    "Transpose", "Trilu", "Unique", "Unsqueeze", "Upsample", "Where", "Xor",

})

# ONNX Runtime graph transformers whose outputs MIGraphX cannot run.
_DISABLED_FOR_MIGRAPHX: tuple[str, ...] = (
    "QuickGeluFusion",          # -> com.microsoft.QuickGelu (SiLU in Llama MLPs)
    "GemmActivationFusion",     # -> com.microsoft.FusedGemm
    "MatMulScaleFusion",        # -> com.microsoft.FusedMatMul
    "MatmulTransposeFusion",    # -> com.microsoft.FusedMatMul
    "ConvActivationFusion",     # -> com.microsoft.FusedConv
    "BiasSoftmaxFusion",        # -> com.microsoft.BiasSoftmax
    "BiasDropoutFusion",        # -> com.microsoft.BiasDropout
    "EmbedLayerNormFusion",     # -> com.microsoft.EmbedLayerNormalization
    "MatMulIntegerToFloatFusion",
    "DynamicQuantizeMatMulFusion",
    "QDQFinalCleanupTransformer",
)


@dataclass(frozen=True)
class FusionTarget:
    """What the Python fusions need to know about the model: family, heads, hidden size."""

    family: str  # "decoder" or "encoder"
    num_heads: int
    hidden_size: int


def contrib_ops(path: str | Path) -> list[str]:
    """Sorted `domain.op_type` names of every op in the graph at `path` that standard ONNX lacks.

    ONNX Runtime registers a few contrib ops (SimplifiedLayerNormalization) in the default
    domain, so the check is against the ONNX schema registry, not only the domain name.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = set()
    for node in model.graph.node:
        domain = node.domain or "ai.onnx"
        if domain != "ai.onnx" or not onnx.defs.has(node.op_type):
            ops.add(f"{domain}.{node.op_type}")
    return sorted(ops)


def migraphx_op_check(path: str | Path) -> dict:
    """Every op type of the graph at `path` against what MIGraphX parses: `{"ops": [...], "unsupported": [...]}`.

    Standard ops are checked against `MIGRAPHX_PARSED_OPS`; contrib ops against both that set and
    `MIGRAPHX_CONTRIB_OPS` (the contrib ops we allow our optimizer to emit).
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    ops = sorted({node.op_type for node in model.graph.node})
    contrib = {op.split(".")[-1] for op in contrib_ops(path)}
    unsupported = [op for op in ops if op not in MIGRAPHX_PARSED_OPS
                   or (op in contrib and op not in MIGRAPHX_CONTRIB_OPS)]
    return {"ops": ops, "unsupported": unsupported}


def migraphx_unsupported(ops: list[str]) -> list[str]:
    """The subset of `contrib_ops(...)` names that MIGraphX cannot run."""
    return [op for op in ops if op.split(".")[-1] not in MIGRAPHX_CONTRIB_OPS]


def _python_fusions(src: Path, dst: Path, target: FusionTarget, external_data: bool) -> None:
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    model_type = "gpt2" if target.family == "decoder" else "bert"
    options = FusionOptions(model_type)
    options.enable_embed_layer_norm = False
    options.enable_qordered_matmul = False
    options.enable_gelu_approximation = False
    fused = optimize_model(str(src), model_type=model_type, num_heads=target.num_heads,
                           hidden_size=target.hidden_size, optimization_options=options, opt_level=0)
    fused.save_model_to_file(str(dst), use_external_data_format=external_data)


def _ort_optimize(src: Path, dst: Path, level: str, external_data: bool) -> None:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = (
        ort.GraphOptimizationLevel.ORT_ENABLE_BASIC if level == "basic" else ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    )
    options.optimized_model_filepath = str(dst)
    if external_data:
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", dst.name + ".data")
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    ort.InferenceSession(
        str(src), options, providers=["CPUExecutionProvider"], disabled_optimizers=list(_DISABLED_FOR_MIGRAPHX)
    )


def optimize_graph(src: Path, dst: Path, level: str = "extended", external_data: bool = False, fp16: bool = False,
                   target: FusionTarget | None = None) -> dict:
    """Write an optimized copy of `src` to `dst` (another folder); return a summary dict.

    The summary names the level, the stages that ran, the contrib ops the graph now uses and
    whether all of them are MIGraphX-runnable.
    """
    if level not in OPTIMIZE_LEVELS:
        raise InvalidArgumentError(f"Unknown optimization level {level!r}; expected one of {', '.join(OPTIMIZE_LEVELS)}.")
    stages: list[str] = []
    with tempfile.TemporaryDirectory(prefix=".fuse-", dir=dst.parent) as scratch:
        current = src
        if level == "extended" and target is not None:
            fused = Path(scratch) / src.name
            _python_fusions(current, fused, target, external_data)
            current = fused
            stages.append("onnxruntime.transformers fusions")
        if not fp16:
            _ort_optimize(current, dst, level, external_data)
            stages.append(f"onnxruntime {level} graph optimization")
        else:
            for item in Path(current).parent.iterdir():
                if item.name.startswith(src.name):
                    shutil.copy2(item, dst.parent / item.name)
    ops = contrib_ops(dst)
    unsupported = migraphx_unsupported(ops)
    return {"level": level, "stages": stages, "contrib_ops": ops, "migraphx_compatible": not unsupported,
            "migraphx_unsupported_ops": unsupported}
