"""Ahead-of-time AMD compile check: every kernel spec, compiled for gfx90a, gfx942, gfx950, gfx1100.

(A little over 400 lines: compiling, reading the assembly, occupancy, the per-Triton tables and the
CLI are one developer tool whose parts change together; it is not imported at run time.)

Runs on a CPU-only machine: `triton.compile(ASTSource(...), target=GPUTarget("hip", arch, wave))`
lowers each kernel to AMDGCN assembly with Triton's bundled LLVM. From the assembly and the
kernel metadata we record, per kernel x arch:

- VGPRs (``.vgpr_count``: architectural + accumulation registers, the unified file on CDNA),
  AGPRs, SGPRs, scratch bytes per lane (``.private_segment_fixed_size``; non-zero means spills),
  LDS bytes (Triton's shared-memory allocation),
- waves per SIMD (occupancy), worked out from the arch's register file and LDS (see `occupancy`,
  limits from `hardware.gpu_facts`), beside the figure LLVM itself prints (``; Occupancy:``),
- the count of matrix instructions: ``v_mfma`` (CDNA) and ``v_wmma`` (RDNA3).

Specs are found as `kernels.compile_spec` says (every `_<op>_triton` module's `AMD_COMPILE_SPECS`).
Results depend on the Triton version, so there is one committed table per version,
`compile_tables/triton-<version>.md`; `--write` writes the running Triton's table and regenerates
`compile_tables/VERSIONS.md`, which lists every row whose figures differ between the committed
versions, so a change brought by a Triton release is seen in review instead of overwritten.

    python -m optimum_amdx.devtools.amd_compile            # print the table for the running Triton
    python -m optimum_amdx.devtools.amd_compile --write    # regenerate its table + VERSIONS.md
    python -m optimum_amdx.devtools.amd_compile --write --changed   # the same, compiling only changed specs

For the other versions, put that Triton first on the path (as `scripts/ci_triton_range.sh` does):
`PYTHONPATH=$PWD:<dir with triton==3.9.0> python -m optimum_amdx.devtools.amd_compile --write --changed`.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from optimum_amdx.hardware.gpu_facts import ARCHS
from optimum_amdx.kernels.compile_spec import AMD_ARCHS, WAVE_SIZE, CompileSpec, spec_modules
from optimum_amdx.kernels.triton_compat import PINNED_COMPILE_OPTIONS

TABLES_DIR = Path(__file__).with_name("compile_tables")
VERSIONS_PATH = TABLES_DIR / "VERSIONS.md"
CDNA_ARCHS = ("gfx90a", "gfx942", "gfx950")
SPILL_CHECK_ARCHS = AMD_ARCHS
"""Archs where a spill in a hot kernel fails the check: all four since round 30 (gfx950 and gfx1100 were reported
only until then; the gfx1100 attention configs that spilled were changed, RESULTS.md round30)."""


def triton_version() -> str:
    """The running Triton's version, as used in table file names."""
    import triton

    return re.sub(r"[^0-9A-Za-z.+_-]", "_", triton.__version__)


def table_path(version: Optional[str] = None) -> Path:
    """The committed table of one Triton version (the running one by default)."""
    return TABLES_DIR / f"triton-{version or triton_version()}.md"


def committed_versions() -> list[str]:
    """Triton versions with a committed table, oldest first."""
    def order(v: str) -> tuple:
        return tuple(int(p) if p.isdigit() else 0 for p in re.split(r"[.+_-]", v))

    return sorted((p.name[len("triton-"):-3] for p in TABLES_DIR.glob("triton-*.md")), key=order)


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
    waves_lds = (workgroups fitting in the LDS pool) * waves per workgroup / SIMDs sharing the pool
    (the pool is a CU on CDNA, a WGP of 4 SIMDs on RDNA3: `ArchFacts.lds_pool_kib`).
    """
    f = ARCHS[arch]
    cands = {"max": f.max_waves_per_simd}
    cands["vgpr"] = f.vgprs_per_simd // max(_round_up(max(vgprs, 1), f.vgpr_granule), 1)
    if f.sgprs_per_simd:
        cands["sgpr"] = f.sgprs_per_simd // max(_round_up(max(sgprs, 1), f.sgpr_granule), 1)
    if lds > 0:
        cands["lds"] = (f.lds_pool_kib * 1024 // lds) * num_warps // f.simds_per_lds_pool
    limiter = min(cands, key=lambda k: (cands[k], k != "max"))
    return max(cands[limiter], 0), limiter


def discover_specs() -> list[tuple[str, int, CompileSpec]]:
    """(module name, index, spec) for every `AMD_COMPILE_SPECS` entry of the `_<op>_triton` modules."""
    found = []
    for mod_name in spec_modules():
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


def full_signature(spec: CompileSpec) -> tuple[dict[str, str], dict[str, Any]]:
    """The spec's signature and constexprs, completed with the kernel's defaulted constexpr arguments.

    A launch may leave those out (the kernel's default applies); Triton 3.6's compiler filled them in
    from the function, 3.7 and later fail with "'NoneType' object has no attribute '_unflatten_ir'".
    So the check passes them explicitly, with the default, as a launch that omits them gets."""
    signature, constexprs = dict(spec.signature), dict(spec.constexprs)
    for param in spec.kernel.params:
        if param.name not in signature and param.is_constexpr and param.has_default:
            signature[param.name] = "constexpr"
            constexprs[param.name] = param.default
    return signature, constexprs


def compile_options(spec: CompileSpec, arch: str) -> dict[str, Any]:
    """The spec's options for `arch` on top of the options every launch pins (`triton_compat`)."""
    return {**PINNED_COMPILE_OPTIONS, **spec.options(arch)}


def spec_key(spec: CompileSpec, arch: str) -> str:
    """Hash of everything a compile depends on: kernel source (with callees), signature, constexprs,
    options, arch and the Triton version."""
    import triton

    signature, constexprs = full_signature(spec)
    payload = json.dumps([spec.kernel.cache_key, signature, {k: repr(v) for k, v in constexprs.items()},
                          compile_options(spec, arch), arch, triton.__version__, sorted(_attrs(spec))],
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
    opts = compile_options(spec, arch)
    key = spec_key(spec, arch)
    try:
        signature, constexprs = full_signature(spec)
        src = ASTSource(spec.kernel, signature, constexprs, _attrs(spec))
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


def _result_from_row(row: dict[str, str]) -> CompileResult:
    """A committed table row (not an ERROR row) back as the result it was rendered from."""
    return CompileResult(
        kernel=row["kernel"], arch=row["arch"], key=row["key"], vgprs=int(row["VGPRs"]), agprs=int(row["AGPRs"]),
        sgprs=int(row["SGPRs"]), scratch=int(row["scratch B"]), lds=int(row["LDS B"]),
        waves_per_simd=int(row["waves/SIMD"]), limiter=row["limiter"], llvm_occupancy=int(row["LLVM occ."]),
        mfma=int(row["MFMA"]), wmma=int(row["WMMA"]), hot=row["hot"] == "yes", uses_dot=row["dot"] == "yes",
    )


def compile_changed(jobs: int = 2) -> tuple[list[CompileResult], int]:
    """Every spec on every arch for the running Triton's table: rows of the committed table whose key
    (kernel source, signature, constexprs, options, arch, Triton version) is unchanged are kept as they
    are, the rest are compiled. Returns the results and how many were compiled."""
    path = table_path()
    committed = parse_table(path.read_text()) if path.exists() else {}
    tasks = _tasks(AMD_ARCHS, None)
    keys = _pool_map(_key_star, tasks, 1)
    kept, todo = [], []
    for task, (name, arch, key) in zip(tasks, keys):
        row = committed.get((name, arch))
        if row is not None and row["key"] == key and row["VGPRs"] != "ERROR":
            kept.append(_result_from_row(row))
        else:
            todo.append(task)
    return kept + _pool_map(_compile_star, todo, jobs), len(todo)


def current_keys(archs: Iterable[str] = AMD_ARCHS) -> dict[tuple[str, str], str]:
    """(kernel, arch) -> key for every spec, without compiling (computed in one fresh process)."""
    return {(name, arch): key for name, arch, key in _pool_map(_key_star, _tasks(archs, None), 1)}


def violations(results: Iterable[CompileResult]) -> list[str]:
    """What the CI check refuses: compile errors, spills in hot kernels (on `SPILL_CHECK_ARCHS`), and dot
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


def notices(results: Iterable[CompileResult]) -> list[str]:
    """Reported, not refused: spills of kernels off the hot path (and of hot ones on an arch outside
    `SPILL_CHECK_ARCHS`, none today)."""
    return [f"{r.kernel} on {r.arch}: spills {r.scratch} bytes of scratch per lane (reported, not enforced)"
            for r in results if not r.error and r.spills and not (r.hot and r.arch in SPILL_CHECK_ARCHS)]


COLUMNS = ["kernel", "arch", "VGPRs", "AGPRs", "SGPRs", "scratch B", "LDS B", "waves/SIMD", "limiter",
           "LLVM occ.", "MFMA", "WMMA", "hot", "dot", "key"]
FIGURES = ["VGPRs", "AGPRs", "SGPRs", "scratch B", "LDS B", "waves/SIMD", "MFMA", "WMMA"]
"""The columns compared across Triton versions (the key always differs: it hashes the version)."""


def _row(r: CompileResult) -> list[str]:
    if r.error:
        return [r.kernel, r.arch, "ERROR", r.error.replace("|", "/")] + [""] * (len(COLUMNS) - 5) + [r.key]
    return [r.kernel, r.arch, str(r.vgprs), str(r.agprs), str(r.sgprs), str(r.scratch), str(r.lds),
            str(r.waves_per_simd), r.limiter, str(r.llvm_occupancy), str(r.mfma), str(r.wmma),
            "yes" if r.hot else "no", "yes" if r.uses_dot else "no", r.key]


def _limits_text() -> str:
    parts = []
    for arch in AMD_ARCHS:
        f = ARCHS[arch]
        sg = f"{f.sgprs_per_simd} SGPRs (granule {f.sgpr_granule})" if f.sgprs_per_simd else "SGPRs not limiting"
        parts.append(f"{arch} (wave{f.wave_size}): {f.vgprs_per_simd} VGPRs (granule {f.vgpr_granule}), {sg}, "
                     f"{f.max_waves_per_simd} waves max, {f.lds_pool_kib} KiB LDS shared by {f.simds_per_lds_pool} SIMDs")
    return "; ".join(parts)


def render_markdown(results: list[CompileResult]) -> str:
    """The committed table of the running Triton, with how its numbers were obtained."""
    version = triton_version()
    lines = [
        f"# AMD compile table, Triton {version}",
        "",
        "Generated by `python -m optimum_amdx.devtools.amd_compile --write` (do not edit by hand) with "
        f"Triton {version}, compiled ahead of time on a CPU-only machine for " + ", ".join(AMD_ARCHS) + ". "
        "`tests/kernels/test_amd_compile.py` checks it is current; `VERSIONS.md` beside it lists what differs "
        "between Triton versions.",
        "",
        "- VGPRs: `.vgpr_count` (architectural + AGPRs on CDNA); scratch: bytes per lane of private memory "
        "(non-zero = register spills); LDS: Triton's shared memory per workgroup.",
        "- waves/SIMD = min(max waves, VGPR file / VGPRs rounded to the allocation granule, SGPR file / SGPRs, "
        "workgroups fitting in the LDS pool x waves per workgroup / SIMDs sharing it), with limits from "
        "`hardware/gpu_facts.py`: " + _limits_text() + ". `limiter` names the binding limit; `LLVM occ.` is the "
        "figure LLVM prints (it also honours `waves_per_eu`).",
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


def render_versions(tables: dict[str, dict[tuple[str, str], dict[str, str]]]) -> str:
    """`VERSIONS.md`: every (kernel, arch) whose figures differ between the committed Triton versions."""
    versions = list(tables)
    every = sorted({k for rows in tables.values() for k in rows}, key=lambda k: (k[0], AMD_ARCHS.index(k[1])))

    def cell(version: str, key: tuple[str, str]) -> str:
        row = tables[version].get(key)
        if row is None:
            return "-"
        if row["VGPRs"] == "ERROR":
            return "ERROR"
        extra = "".join(f" {tag}{row[col]}" for tag, col in (("a", "AGPRs"), ("m", "MFMA"), ("w", "WMMA"))
                        if row[col] != "0")
        return "/".join(row[c] for c in ("VGPRs", "SGPRs", "scratch B", "LDS B", "waves/SIMD")) + extra

    differing = [k for k in every if len({tuple(tables[v][k][c] for c in FIGURES) if k in tables[v] else None
                                          for v in versions}) > 1]
    lines = [
        "# AMD compile figures across Triton versions",
        "",
        "Generated by `python -m optimum_amdx.devtools.amd_compile --write` from the committed "
        "`triton-<version>.md` tables (" + ", ".join(versions) + "); review it when a table is added or changes.",
        f"{len(every) - len(differing)} of {len(every)} kernel x arch rows are identical in every version; "
        "the rows below differ. Cell: VGPRs/SGPRs/scratch B/LDS B/waves per SIMD, then aN = AGPRs, mN = MFMA "
        "and wN = WMMA instruction counts where non-zero; `-` = no such row in that version.",
        "",
        "| kernel | arch | " + " | ".join(f"Triton {v}" for v in versions) + " |",
        "|---|---|" + "---|" * len(versions),
    ]
    lines += ["| " + " | ".join([k[0], k[1]] + [cell(v, k) for v in versions]) + " |" for k in differing]
    return "\n".join(lines) + "\n"


def committed_tables() -> dict[str, dict[tuple[str, str], dict[str, str]]]:
    """Version -> parsed rows, for every committed table, oldest first."""
    return {v: parse_table(table_path(v).read_text()) for v in committed_versions()}


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m optimum_amdx.devtools.amd_compile",
                                     description="Compile every Triton kernel for AMD GPUs ahead of time.")
    parser.add_argument("--arch", action="append", choices=AMD_ARCHS, help="limit to these archs (repeatable)")
    parser.add_argument("--only", help="only kernels whose name contains this text")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--write", action="store_true",
                        help="write compile_tables/triton-<running version>.md and regenerate VERSIONS.md")
    parser.add_argument("--changed", action="store_true",
                        help="with --write: compile only the specs whose key differs from the committed table "
                             "(kernel or config changed) and keep the other rows")
    parser.add_argument("--json", dest="json_out", help="also write the results as JSON to this file")
    args = parser.parse_args(argv)
    if args.write and (args.arch or args.only):
        parser.error("--write records every kernel on every arch; drop --arch/--only")
    if args.changed and not args.write:
        parser.error("--changed only applies to --write")
    if args.changed:
        results, compiled = compile_changed(jobs=args.jobs)
        print(f"{compiled} of {len(results)} specs compiled (the others' keys are unchanged)", file=sys.stderr)
    else:
        results = compile_all(args.arch or AMD_ARCHS, jobs=args.jobs, only=args.only)
    text = render_markdown(results)
    print(text)
    if args.write:
        TABLES_DIR.mkdir(exist_ok=True)
        table_path().write_text(text)
        VERSIONS_PATH.write_text(render_versions(committed_tables()))
        print(f"wrote {table_path()} and {VERSIONS_PATH}", file=sys.stderr)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([asdict(r) for r in results], indent=1))
    for n in notices(results):
        print(f"NOTICE: {n}", file=sys.stderr)
    bad = violations(results)
    for b in bad:
        print(f"VIOLATION: {b}", file=sys.stderr)
    print(f"{len(results)} compiles with Triton {triton_version()}, {len(bad)} violations", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
