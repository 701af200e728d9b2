"""What this machine is: GPU backend and devices, GPU profiles, host settings, ONNX Runtime and Triton.

Importing this package is cheap; torch and onnxruntime load only when a report is built.
"""

from .arch import GPUArch, nvidia_arch, parse_gcn_arch
from .gpu_facts import ARCHS, ArchFacts, arch_facts
from .profiles import PROFILES, GPUProfile, lookup_profile, profile_for_device
from .report import Problem, find_problems, format_report, hardware_report
from .system import numa_balancing, tunableop_state, visible_device_vars

__all__ = [
    "GPUArch", "ArchFacts", "ARCHS", "arch_facts", "parse_gcn_arch", "nvidia_arch", "GPUProfile", "PROFILES", "lookup_profile", "profile_for_device",
    "hardware_report", "format_report", "find_problems", "Problem", "numa_balancing", "tunableop_state",
    "visible_device_vars",
]
