"""Find the profile of a GPU by a user-given name or by the device name torch reports.

The facts themselves live in `gpu_facts` (one table); this module only maps names onto it, and
answers None ("unknown") for GPUs it does not know rather than guessing.
"""

from __future__ import annotations

from ..errors import InvalidArgumentError
from .gpu_facts import PROFILES, GPUProfile

__all__ = ["GPUProfile", "PROFILES", "lookup_profile", "profile_for_device"]

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
