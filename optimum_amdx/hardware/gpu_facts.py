"""The one table of GPU facts: per architecture (ISA limits) and per product (memory, bandwidth, FLOP/s).

Torch-free and import-free (plain data), so every layer can read it: `hardware` (device report,
profiles), `kernels` (config families, wave size, the AMD compile check's occupancy limits),
`benchmark` (roofline ceilings) and `distributed` (memory per GPU for DeepSpeed plans).

Two tables, no fact stated twice: `ARCHS` holds what the instruction set fixes (same for every
product of a gfx/sm target); `PROFILES` holds what a product adds (memory, clocks -> bandwidth and FLOP/s,
compute units) and names its arch. Sources: AMD CDNA2/CDNA3/CDNA4/RDNA3 ISA guides and the LLVM
AMDGPU backend (register files, LDS), AMD and NVIDIA datasheets (memory, bandwidth, dense fp16).

LDS, named precisely (the figures disagreed before because two meanings shared one name):
- `lds_workgroup_kib`: the most LDS one workgroup may allocate (Triton's shared-memory limit per
  kernel launch). CDNA2/CDNA3: 64 KiB; CDNA4 (gfx950): 160 KiB; RDNA3: 64 KiB.
- `lds_pool_kib`: the LDS that resident workgroups share, which bounds occupancy. CDNA: one CU's
  LDS (64 / 64 / 160 KiB). RDNA3 in its default WGP mode: one workgroup processor (two CUs, four
  SIMD32s) shares 128 KiB, which is why RDNA3 is quoted as "64 KiB" (per workgroup, per CU) and
  "128 KiB" (per WGP) in different places. `simds_per_lds_pool` SIMDs share the pool.
NVIDIA: shared memory per SM (228 KiB on Hopper, 227 KiB of it per block).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional


@dataclass(frozen=True)
class ArchFacts:
    """What a compile target fixes, whatever the product.

    family: marketing family ("CDNA3", "RDNA3", "Hopper").
    tuning_family: the key kernel launch configs are chosen by ("cdna3", "rdna3", "hopper", "nvidia").
    wave_size: threads per wavefront / warp.
    vgprs_per_simd / vgpr_granule / max_waves_per_simd / sgprs_per_simd / sgpr_granule: the register
        file per lane per SIMD and its allocation granules (AMD; 0 = not modelled, e.g. SGPRs on RDNA3
        do not limit occupancy, NVIDIA is not modelled).
    """

    arch: str
    vendor: str
    family: str
    tuning_family: str
    wave_size: int
    lds_workgroup_kib: int
    lds_pool_kib: int
    simds_per_lds_pool: int = 4
    vgprs_per_simd: int = 0
    vgpr_granule: int = 1
    max_waves_per_simd: int = 0
    sgprs_per_simd: int = 0
    sgpr_granule: int = 1


def _cdna(arch: str, family: str, lds_kib: int) -> ArchFacts:
    # CDNA2/3/4: 512 VGPRs per lane per SIMD shared by VGPRs and AGPRs (granule 8), at most 8 waves
    # per SIMD, 800 SGPRs per SIMD (granule 16), 4 SIMDs per CU sharing the CU's LDS.
    return ArchFacts(arch, "amd", family, family.lower(), 64, lds_kib, lds_kib, 4, 512, 8, 8, 800, 16)


def _rdna3(arch: str, family: str = "RDNA3") -> ArchFacts:
    # RDNA3 (wave32): 1536 VGPRs per lane per SIMD (granule 24), at most 16 waves per SIMD; SGPRs do
    # not limit occupancy; a WGP (4 SIMDs) shares 128 KiB LDS, 64 KiB at most per workgroup.
    return ArchFacts(arch, "amd", family, "rdna3", 32, 64, 128, 4, 1536, 24, 16, 0, 1)


def _nvidia(arch: str, family: str, smem_block_kib: int, smem_sm_kib: int) -> ArchFacts:
    return ArchFacts(arch, "nvidia", family, "hopper" if family == "Hopper" else "nvidia", 32,
                     smem_block_kib, smem_sm_kib, 4)


ARCHS: dict[str, ArchFacts] = {
    a.arch: a
    for a in (
        _cdna("gfx908", "CDNA1", 64),
        _cdna("gfx90a", "CDNA2", 64),
        _cdna("gfx940", "CDNA3", 64),
        _cdna("gfx941", "CDNA3", 64),
        _cdna("gfx942", "CDNA3", 64),
        _cdna("gfx950", "CDNA4", 160),
        ArchFacts("gfx1030", "amd", "RDNA2", "rdna2", 32, 64, 128, 4),
        _rdna3("gfx1100"),
        _rdna3("gfx1101"),
        _rdna3("gfx1102"),
        _rdna3("gfx1103"),
        _rdna3("gfx1150", "RDNA3.5"),
        _rdna3("gfx1151", "RDNA3.5"),
        ArchFacts("gfx1200", "amd", "RDNA4", "rdna4", 32, 64, 128, 4),
        ArchFacts("gfx1201", "amd", "RDNA4", "rdna4", 32, 64, 128, 4),
        _nvidia("sm_80", "Ampere", 163, 164),
        _nvidia("sm_86", "Ampere", 99, 100),
        _nvidia("sm_89", "Ada", 99, 100),
        _nvidia("sm_90", "Hopper", 227, 228),
        _nvidia("sm_100", "Blackwell", 227, 228),
    )
}
"""gfx / sm target -> its ISA facts."""


@dataclass(frozen=True)
class GPUProfile:
    """One GPU product, per device as torch sees it (one MI250 GCD is one device).

    compute_units: CUs (AMD) or SMs (NVIDIA) of that device. bandwidth_tbs and fp16_tflops are
    datasheet peaks (dense fp16); measured_bandwidth_tbs is a recorded device copy (read + write).
    """

    key: str
    name: str
    arch: str
    memory_gb: float
    bandwidth_tbs: float
    fp16_tflops: float
    compute_units: int
    measured_bandwidth_tbs: Optional[float] = None

    @property
    def isa(self) -> ArchFacts:
        """The facts of this product's compile target."""
        return ARCHS[self.arch]

    @property
    def vendor(self) -> str:
        return self.isa.vendor

    @property
    def wave_size(self) -> int:
        return self.isa.wave_size

    @property
    def lds_workgroup_kib(self) -> int:
        """Most LDS (shared memory) one workgroup may allocate; see the module docstring."""
        return self.isa.lds_workgroup_kib

    @property
    def lds_pool_kib(self) -> int:
        """LDS shared by the resident workgroups of one CU (CDNA), WGP (RDNA3) or SM (NVIDIA)."""
        return self.isa.lds_pool_kib

    @property
    def effective_bandwidth_tbs(self) -> float:
        """Measured copy bandwidth when known, else the datasheet peak."""
        return self.measured_bandwidth_tbs or self.bandwidth_tbs

    def to_dict(self) -> dict:
        """Plain-JSON form, with the arch-derived facts and the effective bandwidth included."""
        d = asdict(self)
        d.update(vendor=self.vendor, wave_size=self.wave_size, lds_workgroup_kib=self.lds_workgroup_kib,
                 lds_pool_kib=self.lds_pool_kib, effective_bandwidth_tbs=self.effective_bandwidth_tbs)
        return d


PROFILES: dict[str, GPUProfile] = {
    g.key: g
    for g in (
        GPUProfile("mi210", "AMD Instinct MI210", "gfx90a", 64, 1.6, 181, 104),
        GPUProfile("mi250", "AMD Instinct MI250 (one GCD)", "gfx90a", 64, 1.6, 181, 104),
        GPUProfile("mi300x", "AMD Instinct MI300X", "gfx942", 192, 5.3, 1307, 304, measured_bandwidth_tbs=4.1),
        GPUProfile("mi325x", "AMD Instinct MI325X", "gfx942", 256, 6.0, 1307, 304),
        GPUProfile("mi355x", "AMD Instinct MI355X", "gfx950", 288, 8.0, 2517, 256),
        GPUProfile("rx7900xtx", "AMD Radeon RX 7900 XTX", "gfx1100", 24, 0.96, 123, 96),
        GPUProfile("h100", "NVIDIA H100 SXM", "sm_90", 80, 3.35, 989, 132, measured_bandwidth_tbs=3.0),
        GPUProfile("h200", "NVIDIA H200", "sm_90", 141, 4.8, 989, 132, measured_bandwidth_tbs=4.2),
    )
}
"""Product key -> its facts (the profiles `optimum-amdx env`, the roofline and DeepSpeed plans use)."""


def arch_facts(arch: str) -> Optional[ArchFacts]:
    """Facts of a gfx/sm target (feature suffixes like ":sramecc+" ignored), or None if unknown."""
    return ARCHS.get(arch.split(":")[0])
