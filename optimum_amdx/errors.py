"""The one exception family of optimum-amdx.

Every error a user can cause derives from `AMDXError`, so callers can catch ours without
catching programming errors. Messages name the input, what was expected and the fix.
"""

from __future__ import annotations


class AMDXError(Exception):
    """Base class of every error optimum-amdx raises on purpose."""


class ModelNotFoundError(AMDXError):
    """A model id, folder or file could not be resolved to local weights."""


class UnsafeWeightsError(AMDXError):
    """Only pickle weights (.bin/.pt) were found and the user did not allow them."""


class UnsupportedModelError(AMDXError):
    """The architecture or task is not one this feature supports."""


class OutputExistsError(AMDXError):
    """The output folder exists and is not empty, and overwriting was not asked for."""


class InvalidArgumentError(AMDXError, ValueError):
    """An argument has a value outside what the feature accepts."""


class ProviderError(AMDXError):
    """An ONNX Runtime execution provider is missing, unusable or fell back silently."""


class ExportValidationError(AMDXError):
    """The exported graph does not reproduce the PyTorch model within tolerance."""


class HardwareError(AMDXError):
    """The machine lacks what was asked for (GPUs, memory, a runtime library)."""


class OutOfBlocksError(AMDXError):
    """The paged KV cache has too few free blocks for a request that cannot be preempted."""
