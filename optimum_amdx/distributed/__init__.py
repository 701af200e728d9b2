"""Multi-GPU for AMD: DeepSpeed configs sized for the GPU, topology-aware GPU choice, TP launch.

Importing this package is light (no torch, no deepspeed): those load inside the functions that
need them.
"""

from .ds_config import DeepSpeedPlan, deepspeed_config, fill_auto_values, validate_deepspeed_config

__all__ = ["DeepSpeedPlan", "deepspeed_config", "fill_auto_values", "validate_deepspeed_config"]
