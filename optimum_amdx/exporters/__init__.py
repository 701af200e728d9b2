"""PyTorch -> ONNX export for AMD execution providers (MIGraphX, ROCm) and the CPU.

`export_model` traces decoders (with past key/values in and out, one graph for prefill and
decode) and BERT-family encoders with torch.onnx (dynamo), checks, optionally optimizes, and
validates the graph against PyTorch. Importing this package loads torch.
"""

from .convert import METADATA_FILE, ONNX_FILE, ExportResult, export_model, read_metadata
from .static import StaticShapes
from .tasks import TASKS

__all__ = ["export_model", "ExportResult", "StaticShapes", "read_metadata", "TASKS", "ONNX_FILE", "METADATA_FILE"]
