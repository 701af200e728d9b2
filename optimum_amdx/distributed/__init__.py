"""Multi-GPU for AMD: DeepSpeed configs sized for the GPU, topology-aware GPU choice, TP launch.

Importing this package is light (no torch, no deepspeed): those load inside the functions that
need them.
"""

from .ds_config import DeepSpeedPlan, deepspeed_config, fill_auto_values, validate_deepspeed_config
from .launch import LaunchPlan, launch, plan_launch, visible_devices_env
from .memory import MemoryEstimate, Placement
from .topology import Topology, choose_devices, detect_topology, parse_topology

__all__ = [
    "DeepSpeedPlan", "deepspeed_config", "fill_auto_values", "validate_deepspeed_config",
    "LaunchPlan", "launch", "plan_launch", "visible_devices_env", "MemoryEstimate", "Placement",
    "Topology", "choose_devices", "detect_topology", "parse_topology",
]
