"""Ahead-of-time AMD compile check: every kernel spec, compiled for gfx90a, gfx942, gfx950, gfx1100.

Runs on a CPU-only machine: `triton.compile(ASTSource(...), target=GPUTarget("hip", arch, wave))`
lowers each kernel to AMDGCN assembly with Triton's bundled LLVM. From the assembly and the
kernel metadata we record, per kernel x arch:

- VGPRs (``.vgpr_count``: architectural + accumulation registers, the unified file on CDNA),
  AGPRs, SGPRs, scratch bytes per lane (``.private_segment_fixed_size``; non-zero means spills),
  LDS bytes (Triton's shared-memory allocation),
- waves per SIMD (occupancy), worked out from the arch's register file and LDS (see `occupancy`),
  beside the figure LLVM itself prints (``; Occupancy:``),
- the count of matrix instructions: ``v_mfma`` (CDNA) and ``v_wmma`` (RDNA3).

`python -m optimum_amdx.kernels.amd_compile` prints the table; ``--write`` regenerates the
committed `AMD_COMPILE_TABLE.md`. Kernel modules are discovered by importing every module of
`optimum_amdx.kernels` and reading its `AMD_COMPILE_SPECS` list.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import pkgutil
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from .compile_spec import AMD_ARCHS, WAVE_SIZE, CompileSpec

TABLE_PATH = Path(__file__).with_name("AMD_COMPILE_TABLE.md")
_SKIP_MODULES = {"amd_compile", "compile_spec", "runtime"}

# Per-SIMD register files and limits (AMD ISA guides / LLVM AMDGPU backend):
# CDNA2/3/4: 512 VGPRs per lane per SIMD shared by VGPRs and AGPRs, allocated in granules of 8,
#            at most 8 waves per SIMD, 800 SGPRs per SIMD (granule 16), 4 SIMDs per CU.
# RDNA3 (gfx1100, wave32): 1536 VGPRs per lane per SIMD, granule 24, at most 16 waves per SIMD,
#            SGPRs do not limit occupancy; a WGP (the LDS pool in the default WGP mode) has 4 SIMDs.
ARCH_LIMITS: dict[str, dict[str, int]] = {
    "gfx90a": {"vgprs": 512, "vgpr_granule": 8, "max_waves": 8, "sgprs": 800, "sgpr_granule": 16,
               "lds": 64 * 1024, "simds_per_lds": 4},
    "gfx942": {"vgprs": 512, "vgpr_granule": 8, "max_waves": 8, "sgprs": 800, "sgpr_granule": 16,
               "lds": 64 * 1024, "simds_per_lds": 4},
    "gfx950": {"vgprs": 512, "vgpr_granule": 8, "max_waves": 8, "sgprs": 800, "sgpr_granule": 16,
               "lds": 160 * 1024, "simds_per_lds": 4},
    "gfx1100": {"vgprs": 1536, "vgpr_granule": 24, "max_waves": 16, "sgprs": 0, "sgpr_granule": 1,
                "lds": 128 * 1024, "simds_per_lds": 4},
}
CDNA_ARCHS = ("gfx90a", "gfx942", "gfx950")
SPILL_CHECK_ARCHS = ("gfx90a", "gfx942")


@dataclass
class CompileResult:
    """One row of the compile table."""

    kernel: str
    arch: str
    key: str
    vgprs: int
    agprs: int
    sgprs: int
    scratch: int
    lds: int
    waves_per_simd: int
    limiter: str
    llvm_occupancy: int
    mfma: int
    wmma: int
    hot: bool
    uses_dot: bool
    error: str = ""

    @property
    def spills(self) -> bool:
        return self.scratch > 0

    @property
    def has_matrix_instr(self) -> bool:
        return (self.wmma if self.arch.startswith("gfx11") else self.mfma) > 0


def _round_up(v: int, g: int) -> int:
    return -(-v // g) * g


def occupancy(arch: str, vgprs: int, sgprs: int, lds: int, num_warps: int) -> tuple[int, str]:
    """Waves per SIMD and what limits it ("vgpr", "lds", "sgpr" or "max").

    waves_vgpr = VGPR file / round_up(vgprs, granule); waves_sgpr likewise for CDNA;
    waves_lds = (workgroups fitting in the LDS pool) * waves per workgroup / SIMDs sharing the pool.
    """
    lim = ARCH_LIMITS[arch]
    cands = {"max": lim["max_waves"]}
    cands["vgpr"] = lim["vgprs"] // max(_round_up(max(vgprs, 1), lim["vgpr_granule"]), 1)
    if lim["sgprs"]:
        cands["sgpr"] = lim["sgprs"] // max(_round_up(max(sgprs, 1), lim["sgpr_granule"]), 1)
    if lds > 0:
        cands["lds"] = (lim["lds"] // lds) * num_warps // lim["simds_per_lds"]
    limiter = min(cands, key=lambda k: (cands[k], k != "max"))
    return max(cands[limiter], 0), limiter


def discover_specs() -> list[tuple[str, int, CompileSpec]]:
    """(module name, index, spec) for every `AMD_COMPILE_SPECS` entry in `optimum_amdx.kernels`."""
    from optimum_amdx import kernels

    found = []
    for info in sorted(pkgutil.iter_modules(kernels.__path__), key=lambda m: m.name):
        if info.name in _SKIP_MODULES:
            continue
        mod_name = f"optimum_amdx.kernels.{info.name}"
        mod = importlib.import_module(mod_name)
        for i, spec in enumerate(getattr(mod, "AMD_COMPILE_SPECS", []) or []):
            found.append((mod_name, i, spec))
    return found


def _attrs(spec: CompileSpec) -> dict[tuple[int, ...], list[list[Any]]]:
    """Pointers are 16-byte aligned, as torch allocations are and as Triton specializes at launch;
    so are the integer arguments the spec lists in `divisible_by_16`."""
    divisible = set(getattr(spec, "divisible_by_16", ()))
    return {(i,): [["tt.divisibility", 16]] for i, (name, ty) in enumerate(spec.signature.items())
            if ty.startswith("*") or name in divisible}


def spec_key(spec: CompileSpec, arch: str) -> str:
    """Hash of everything a compile depends on: kernel source (with callees), signature, constexprs,
    options, arch and the Triton version."""
    import triton

    payload = json.dumps([spec.kernel.cache_key, spec.signature, {k: repr(v) for k, v in spec.constexprs.items()},
                          spec.options(arch), arch, triton.__version__, sorted(_attrs(spec))],
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _field(asm: str, name: str) -> int:
    m = re.search(rf"^\s*\.{name}:\s+(\d+)", asm, re.M)
    return int(m.group(1)) if m else 0


def _comment(asm: str, name: str) -> int:
    m = re.search(rf";\s*{name}:\s+(\d+)", asm)
    return int(m.group(1)) if m else 0


def compile_one(mod_name: str, index: int, arch: str) -> CompileResult:
    """Compile one spec of one module for one arch and read its resources from the assembly."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.import_module(mod_name).AMD_COMPILE_SPECS[index]
    opts = spec.options(arch)
    key = spec_key(spec, arch)
    try:
        src = ASTSource(spec.kernel, dict(spec.signature), dict(spec.constexprs), _attrs(spec))
        compiled = triton.compile(src, target=GPUTarget("hip", arch, WAVE_SIZE[arch]), options=dict(opts))
    except Exception as exc:  # a compile failure is a table row, reported and failed by the test
        msg = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
        return CompileResult(spec.name, arch, key, 0, 0, 0, 0, 0, 0, "error", 0, 0, 0, spec.hot, spec.uses_dot, msg)
    asm = compiled.asm["amdgcn"]
    vgprs = _field(asm, "vgpr_count")
    agprs = _comment(asm, "NumAgprs")
    sgprs = _field(asm, "sgpr_count")
    scratch = _field(asm, "private_segment_fixed_size")
    lds = int(compiled.metadata.shared) + _field(asm, "group_segment_fixed_size")
    waves, limiter = occupancy(arch, vgprs, sgprs, lds, int(opts.get("num_warps", 4)))
    return CompileResult(
        kernel=spec.name, arch=arch, key=key, vgprs=vgprs, agprs=agprs, sgprs=sgprs, scratch=scratch, lds=lds,
        waves_per_simd=waves, limiter=limiter, llvm_occupancy=_comment(asm, "Occupancy"),
        mfma=len(re.findall(r"\bv_mfma", asm)), wmma=len(re.findall(r"\bv_wmma", asm)),
        hot=spec.hot, uses_dot=spec.uses_dot,
    )


def _compile_star(args: tuple[str, int, str]) -> CompileResult:
    return compile_one(*args)


def _key_star(args: tuple[str, int, str]) -> tuple[str, str, str]:
    mod_name, index, arch = args
    spec = importlib.import_module(mod_name).AMD_COMPILE_SPECS[index]
    return spec.name, arch, spec_key(spec, arch)


def _worker_init() -> None:
    # Under TRITON_INTERPRET=1 `@triton.jit` yields interpreter functions that cannot be compiled,
    # so the workers (fresh spawned processes) import the kernels with the interpreter off.
    os.environ["TRITON_INTERPRET"] = "0"


def _tasks(archs: Iterable[str], only: Optional[str]) -> list[tuple[str, int, str]]:
    archs = tuple(archs)
    return [(mod_name, idx, arch) for mod_name, idx, spec in discover_specs()
            if not only or only in spec.name
            for arch in archs if arch in spec.archs]


def _pool_map(fn: Any, tasks: list[Any], jobs: int) -> list[Any]:
    import multiprocessing

    with ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=multiprocessing.get_context("spawn"),
                             initializer=_worker_init) as pool:
        return list(pool.map(fn, tasks))


def compile_all(archs: Iterable[str] = AMD_ARCHS, jobs: int = 2, only: Optional[str] = None) -> list[CompileResult]:
    """Compile every discovered spec for `archs` in a pool of `jobs` fresh processes."""
    return _pool_map(_compile_star, _tasks(archs, only), jobs)


def current_keys(archs: Iterable[str] = AMD_ARCHS) -> dict[tuple[str, str], str]:
    """(kernel, arch) -> key for every spec, without compiling (computed in one fresh process)."""
    return {(name, arch): key for name, arch, key in _pool_map(_key_star, _tasks(archs, None), 1)}


def violations(results: Iterable[CompileResult]) -> list[str]:
    """What the CI check refuses: compile errors, spills in hot kernels on gfx942/gfx90a, and dot
    kernels without MFMA (CDNA) or WMMA (gfx1100) instructions."""
    bad = []
    for r in results:
        if r.error:
            bad.append(f"{r.kernel} on {r.arch}: does not compile ({r.error})")
            continue
        if r.hot and r.arch in SPILL_CHECK_ARCHS and r.spills:
            bad.append(f"{r.kernel} on {r.arch}: spills {r.scratch} bytes of scratch per lane (hot kernel)")
        if r.uses_dot and not r.has_matrix_instr:
            kind = "v_wmma" if r.arch.startswith("gfx11") else "v_mfma"
            bad.append(f"{r.kernel} on {r.arch}: has tl.dot but no {kind} instructions")
    return bad


COLUMNS = ["kernel", "arch", "VGPRs", "AGPRs", "SGPRs", "scratch B", "LDS B", "waves/SIMD", "limiter",
           "LLVM occ.", "MFMA", "WMMA", "hot", "dot", "key"]


def _row(r: CompileResult) -> list[str]:
    if r.error:
        return [r.kernel, r.arch, "ERROR", r.error.replace("|", "/")] + [""] * (len(COLUMNS) - 5) + [r.key]
    return [r.kernel, r.arch, str(r.vgprs), str(r.agprs), str(r.sgprs), str(r.scratch), str(r.lds),
            str(r.waves_per_simd), r.limiter, str(r.llvm_occupancy), str(r.mfma), str(r.wmma),
            "yes" if r.hot else "no", "yes" if r.uses_dot else "no", r.key]


def render_markdown(results: list[CompileResult]) -> str:
    """The committed table, with how its numbers were obtained."""
    import triton

    lines = [
        "# AMD compile table",
        "",
        "Generated by `python -m optimum_amdx.kernels.amd_compile --write` (do not edit by hand); "
        f"Triton {triton.__version__}, compiled ahead of time on a CPU-only machine for "
        + ", ".join(AMD_ARCHS) + ". `tests/kernels/test_amd_compile.py` checks it is current.",
        "",
        "- VGPRs: `.vgpr_count` (architectural + AGPRs on CDNA, one 512-entry file per lane per SIMD); "
        "scratch: bytes per lane of private memory (non-zero = register spills); LDS: Triton's shared "
        "memory per workgroup.",
        "- waves/SIMD = min(max waves, VGPR file / VGPRs rounded to the allocation granule, SGPR file / "
        "SGPRs (CDNA), workgroups fitting in LDS x waves per workgroup / SIMDs sharing that LDS). "
        "CDNA2/3/4: 512 VGPRs (granule 8), 800 SGPRs (granule 16), 8 waves max, 4 SIMDs per CU sharing "
        "64 KiB LDS (160 KiB on gfx950). gfx1100 (wave32): 1536 VGPRs (granule 24), 16 waves max, "
        "128 KiB LDS per WGP of 4 SIMDs. `limiter` names the binding limit; `LLVM occ.` is the figure "
        "LLVM prints (it also honours `waves_per_eu`).",
        "- MFMA / WMMA: count of `v_mfma*` / `v_wmma*` instructions in the assembly. "
        "`key`: hash of kernel source, signature, constexprs, options, arch and Triton version.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for r in sorted(results, key=lambda r: (r.kernel, AMD_ARCHS.index(r.arch))):
        lines.append("| " + " | ".join(_row(r)) + " |")
    return "\n".join(lines) + "\n"


def parse_table(text: str) -> dict[tuple[str, str], dict[str, str]]:
    """Rows of a committed table keyed by (kernel, arch)."""
    rows = {}
    for line in text.splitlines():
        if not line.startswith("| ") or line.startswith("| kernel |"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != len(COLUMNS):
            continue
        row = dict(zip(COLUMNS, cells))
        rows[(row["kernel"], row["arch"])] = row
    return rows


def result_cells(r: CompileResult) -> dict[str, str]:
    """A result as the committed table would show it."""
    return dict(zip(COLUMNS, _row(r)))


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimum_amdx.kernels.amd_compile",
                                     description="Compile every Triton kernel for AMD GPUs ahead of time.")
    parser.add_argument("--arch", action="append", choices=AMD_ARCHS, help="limit to these archs (repeatable)")
    parser.add_argument("--only", help="only kernels whose name contains this text")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--write", nargs="?", const=str(TABLE_PATH), default=None,
                        help=f"write the markdown table (default {TABLE_PATH.name} beside this module)")
    parser.add_argument("--json", dest="json_out", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    results = compile_all(args.arch or AMD_ARCHS, jobs=args.jobs, only=args.only)
    text = render_markdown(results)
    print(text)
    if args.write:
        Path(args.write).write_text(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(r) for r in results], indent=1))
    bad = violations(results)
    for b in bad:
        print(f"VIOLATION: {b}", file=sys.stderr)
    print(f"{len(results)} compiles, {len(bad)} violations", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
