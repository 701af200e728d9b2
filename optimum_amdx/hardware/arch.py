"""Parse GPU architecture strings as ROCm and CUDA report them."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import InvalidArgumentError

# gfx target -> (family, wave size, LDS KiB per CU), from AMD's ISA documentation.
GFX_FACTS: dict[str, tuple[str, int, int]] = {
    "gfx908": ("CDNA1", 64, 64),
    "gfx90a": ("CDNA2", 64, 64),
    "gfx940": ("CDNA3", 64, 64),
    "gfx941": ("CDNA3", 64, 64),
    "gfx942": ("CDNA3", 64, 64),
    "gfx950": ("CDNA4", 64, 160),
    "gfx1030": ("RDNA2", 32, 64),
    "gfx1100": ("RDNA3", 32, 64),
    "gfx1101": ("RDNA3", 32, 64),
    "gfx1102": ("RDNA3", 32, 64),
    "gfx1151": ("RDNA3.5", 32, 64),
    "gfx1200": ("RDNA4", 32, 64),
    "gfx1201": ("RDNA4", 32, 64),
}


@dataclass(frozen=True)
class GPUArch:
    """A compile target: "gfx942" with its feature flags, or "sm_90"."""

    name: str
    vendor: str
    features: dict[str, bool] = field(default_factory=dict)

    @property
    def family(self) -> str:
        """CDNA2/CDNA3/RDNA3/... for AMD, "Hopper"/"Ampere"/... for NVIDIA, "unknown" otherwise."""
        if self.vendor == "amd":
            return GFX_FACTS.get(self.name, ("unknown", 0, 0))[0]
        return {"sm_80": "Ampere", "sm_86": "Ampere", "sm_89": "Ada", "sm_90": "Hopper", "sm_100": "Blackwell"}.get(
            self.name, "unknown")

    @property
    def wave_size(self) -> int | None:
        """Threads per wavefront (64 on CDNA, 32 on RDNA and NVIDIA), None if unknown."""
        if self.vendor == "nvidia":
            return 32
        return GFX_FACTS.get(self.name, (None, None, None))[1]


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
