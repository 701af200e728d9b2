"""Parse GPU architecture strings as ROCm and CUDA report them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgumentError
from .gpu_facts import arch_facts


@dataclass(frozen=True)
class GPUArch:
    """A compile target: "gfx942" with its feature flags, or "sm_90"."""

    name: str
    vendor: str
    features: dict[str, bool] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """CDNA2/CDNA3/RDNA3/... for AMD, "Hopper"/"Ampere"/... for NVIDIA, "unknown" otherwise."""
        facts = arch_facts(self.name)
        return facts.family if facts else "unknown"

    @property
    def wave_size(self) -> int | None:
        """Threads per wavefront (64 on CDNA, 32 on RDNA and NVIDIA), None if unknown."""
        if self.vendor == "nvidia":
            return 32
        facts = arch_facts(self.name)
        return facts.wave_size if facts else None


def parse_gcn_arch(text: str) -> GPUArch:
    """Parse ROCm's `gcnArchName`, e.g. "gfx942:sramecc+:xnack-" -> gfx942 {sramecc: True, xnack: False}."""
    parts = [p for p in text.strip().split(":") if p]
    if not parts or not parts[0].startswith("gfx"):
        raise InvalidArgumentError(f"{text!r} is not a ROCm GPU architecture name; expected something like 'gfx942:sramecc+:xnack-'.")
    features = {}
    for flag in parts[1:]:
        if flag[-1] in "+-":
            features[flag[:-1]] = flag[-1] == "+"
    return GPUArch(parts[0], "amd", features)


def nvidia_arch(major: int, minor: int) -> GPUArch:
    """The sm_XY name of a CUDA compute capability."""
    return GPUArch(f"sm_{major}{minor}", "nvidia")
