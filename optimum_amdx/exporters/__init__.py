"""PyTorch -> ONNX export for AMD execution providers (MIGraphX, ROCm) and the CPU.

`export_model` traces decoders (with past key/values in and out; dynamic, or a fixed-capacity
KV cache with static-shape graphs for MIGraphX) and BERT-family encoders with torch.onnx
(dynamo), checks, optionally optimizes, and validates the graph against PyTorch.

Importing this package is cheap: `contract` (file/tensor names, metadata) and `tasks` are
torch-free, and the exporter itself (torch.onnx, onnxscript) loads on first use of
`export_model`.
"""

from optimum_amdx._lazy import lazy_exports

_LAZY = {
    "export_model": ".convert",
    "ExportResult": ".convert",
    "StaticShapes": ".static",
    "read_metadata": ".contract",
    "write_metadata": ".contract",
    "TASKS": ".tasks",
    "ONNX_FILE": ".contract",
    "METADATA_FILE": ".contract",
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _LAZY)
