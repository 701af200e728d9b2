"""Datasheet facts of the GPUs we design for, and honest "unknown" for the rest.

Bandwidth and FLOP rates are peak datasheet figures; rooflines should prefer a measured copy
bandwidth where one is available (`measured_bandwidth_tbs`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..errors import InvalidArgumentError


@dataclass(frozen=True)
class GPUProfile:
    """One GPU model (per device as torch sees it: one MI250 GCD is one device)."""

    key: str
    name: str
    arch: str
    memory_gb: float
    bandwidth_tbs: float
    fp16_tflops: float
    wave_size: int
    lds_kib: int
    measured_bandwidth_tbs: float | None = None
    vendor: str = "amd"

    @property
    def effective_bandwidth_tbs(self) -> float:
        """Measured copy bandwidth when known, else the datasheet peak."""
        return self.measured_bandwidth_tbs or self.bandwidth_tbs

    def to_dict(self) -> dict:
        """Plain-JSON form, with the effective bandwidth included."""
        d = asdict(self)
        d["effective_bandwidth_tbs"] = self.effective_bandwidth_tbs
        return d


PROFILES: dict[str, GPUProfile] = {
    p.key: p
    for p in (
        GPUProfile("mi210", "AMD Instinct MI210", "gfx90a", 64, 1.6, 181, 64, 64),
        GPUProfile("mi250", "AMD Instinct MI250 (one GCD)", "gfx90a", 64, 1.6, 181, 64, 64),
        GPUProfile("mi300x", "AMD Instinct MI300X", "gfx942", 192, 5.3, 1307, 64, 64, measured_bandwidth_tbs=4.1),
        GPUProfile("mi325x", "AMD Instinct MI325X", "gfx942", 256, 6.0, 1307, 64, 64),
        GPUProfile("mi355x", "AMD Instinct MI355X", "gfx950", 288, 8.0, 2517, 64, 160),
        GPUProfile("rx7900xtx", "AMD Radeon RX 7900 XTX", "gfx1100", 24, 0.96, 123, 32, 64),
        GPUProfile("h100", "NVIDIA H100 SXM", "sm_90", 80, 3.35, 989, 32, 228, measured_bandwidth_tbs=3.0, vendor="nvidia"),
        GPUProfile("h200", "NVIDIA H200", "sm_90", 141, 4.8, 989, 32, 228, measured_bandwidth_tbs=4.2, vendor="nvidia"),
    )
}

_ALIASES = {
    "mi250x": "mi250",
    "mi300": "mi300x",
    "7900xtx": "rx7900xtx",
    "rx-7900-xtx": "rx7900xtx",
    "h100-sxm": "h100",
}

# Substrings of torch's device name -> profile key, most specific first.
_NAME_HINTS = (
    ("MI355", "mi355x"),
    ("MI325", "mi325x"),
    ("MI300X", "mi300x"),
    ("MI250", "mi250"),
    ("MI210", "mi210"),
    ("7900 XTX", "rx7900xtx"),
    ("H200", "h200"),
    ("H100", "h100"),
)


def lookup_profile(name: str) -> GPUProfile:
    """The profile for a user-given GPU name such as "mi300x"; a clear error for unknown names."""
    key = name.strip().lower().replace(" ", "")
    key = _ALIASES.get(key, key)
    if key in PROFILES:
        return PROFILES[key]
    raise InvalidArgumentError(
        f"Unknown GPU {name!r}. Known GPUs: {', '.join(sorted(PROFILES))}. "
        "Pick the closest one, or pass memory and bandwidth explicitly."
    )


def profile_for_device(device_name: str, arch: str | None = None) -> GPUProfile | None:
    """Match a device as torch names it ("AMD Instinct MI300X", "NVIDIA H200") to a profile, or None."""
    upper = device_name.upper()
    for hint, key in _NAME_HINTS:
        if hint.upper() in upper:
            return PROFILES[key]
    return None
