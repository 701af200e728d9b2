"""AMD ahead-of-time compile check: every kernel spec compiles for gfx90a/gfx942/gfx950/gfx1100,
hot kernels do not spill on gfx942/gfx90a (spills on gfx950/gfx1100 are reported as warnings),
`tl.dot` kernels use MFMA/WMMA, and the committed table of the running Triton version is what
compiles today.

Regenerate the running Triton's table (and VERSIONS.md) after changing a kernel or its shipped config,
or when adding a Triton version: `python -m optimum_amdx.devtools.amd_compile --write` (`--changed` compiles
only the specs whose key changed and keeps the other rows).
"""

from __future__ import annotations

import importlib
import warnings

import pytest

from optimum_amdx.devtools import amd_compile as ac
from optimum_amdx.kernels.compile_spec import AMD_ARCHS, spec_modules

HINT = ("regenerate with: python -m optimum_amdx.devtools.amd_compile --write --changed, once per Triton version "
        "(then review compile_tables/VERSIONS.md)")


def _table():
    path = ac.table_path()
    assert path.exists(), f"no committed AMD compile table for Triton {ac.triton_version()} ({path.name}); {HINT}"
    return ac.parse_table(path.read_text())


def test_occupancy_math_follows_the_register_and_lds_limits():
    assert ac.occupancy("gfx942", 128, 40, 0, 4) == (4, "vgpr")
    assert ac.occupancy("gfx942", 129, 40, 0, 4) == (3, "vgpr")  # 136 allocated: 512 // 136
    assert ac.occupancy("gfx90a", 40, 40, 0, 4) == (8, "max")
    assert ac.occupancy("gfx942", 64, 40, 32 * 1024, 4) == (2, "lds")  # 2 workgroups x 4 waves / 4 SIMDs
    assert ac.occupancy("gfx950", 64, 40, 32 * 1024, 4) == (5, "lds")  # 160 KiB holds 5
    assert ac.occupancy("gfx1100", 96, 100, 0, 4) == (16, "max")
    assert ac.occupancy("gfx1100", 256, 100, 0, 4) == (5, "vgpr")  # 1536 // 264
    assert ac.occupancy("gfx942", 32, 200, 0, 4) == (3, "sgpr")  # 800 // 208


def test_violations_are_detected():
    base = dict(key="k", agprs=0, sgprs=30, lds=0, waves_per_simd=4, limiter="vgpr", llvm_occupancy=4, wmma=0)
    spill = ac.CompileResult(kernel="a", arch="gfx942", vgprs=256, scratch=64, mfma=8, hot=True, uses_dot=True, **base)
    no_mfma = ac.CompileResult(kernel="b", arch="gfx90a", vgprs=64, scratch=0, mfma=0, hot=True, uses_dot=True, **base)
    no_wmma = ac.CompileResult(kernel="c", arch="gfx1100", vgprs=64, scratch=0, mfma=3, hot=False, uses_dot=True, **base)
    cold_spill = ac.CompileResult(kernel="d", arch="gfx942", vgprs=64, scratch=16, mfma=0, hot=False, uses_dot=False, **base)
    rdna_spill = ac.CompileResult(kernel="e", arch="gfx1100", vgprs=64, scratch=16, mfma=0, hot=True, uses_dot=False, **base)
    bad = ac.violations([spill, no_mfma, no_wmma, cold_spill, rdna_spill])
    assert len(bad) == 4  # a hot kernel's spill fails on every arch, gfx1100 included (since round 30)
    assert "spills" in bad[0] and "v_mfma" in bad[1] and "v_wmma" in bad[2] and "e on gfx1100: spills" in bad[3]
    assert ac.notices([spill, cold_spill, rdna_spill]) == [
        "d on gfx942: spills 16 bytes of scratch per lane (reported, not enforced)"]


def test_a_committed_row_reads_back_as_the_result_it_was_rendered_from():
    """`--write --changed` keeps unchanged rows by reading them back: the round trip must be lossless."""
    base = dict(key="0123456789ab", agprs=4, sgprs=30, lds=512, waves_per_simd=4, limiter="vgpr", llvm_occupancy=4)
    results = [ac.CompileResult(kernel="k[a,b]", arch="gfx942", vgprs=96, scratch=0, mfma=8, wmma=0, hot=True,
                                uses_dot=True, **base),
               ac.CompileResult(kernel="k[a,b]", arch="gfx1100", vgprs=128, scratch=16, mfma=0, wmma=2, hot=False,
                                uses_dot=False, **base)]
    rows = ac.parse_table(ac.render_markdown(results))
    assert [ac._result_from_row(rows[(r.kernel, r.arch)]) for r in results] == results


def test_committed_table_lists_every_spec_with_its_current_key():
    table = _table()
    keys = ac.current_keys()
    assert keys, "no AMD_COMPILE_SPECS were discovered"
    assert {a for _, a in keys} == set(AMD_ARCHS)
    missing = sorted(set(keys) - set(table))
    extra = sorted(set(table) - set(keys))
    stale = sorted(k for k in keys if k in table and table[k]["key"] != keys[k])
    hint = HINT
    assert not missing, f"specs missing from the table: {missing}; {hint}"
    assert not extra, f"table rows with no spec: {extra}; {hint}"
    assert not stale, f"kernels or configs changed since the table was generated: {stale}; {hint}"


def test_every_kernel_compiles_for_amd_without_spills_and_with_matrix_instructions():
    results = ac.compile_all(AMD_ARCHS, jobs=2)
    assert results
    for notice in ac.notices(results):
        warnings.warn(notice)
    bad = ac.violations(results)
    assert not bad, "\n".join(bad)
    table = _table()
    for r in results:
        row = table.get((r.kernel, r.arch))
        assert row is not None, f"{r.kernel} on {r.arch} is not in the committed table"
        assert row == ac.result_cells(r), f"{r.kernel} on {r.arch}: table says {row}, compiler says {ac.result_cells(r)}"


@pytest.mark.parametrize("arch", AMD_ARCHS)
def test_every_spec_is_compiled_for_every_arch_family(arch):
    names = {k for k, a in _table() if a == arch}
    assert names, f"no kernel is compiled for {arch}"


def test_every_triton_module_registers_specs_and_fronts_import_no_triton():
    names = spec_modules()
    assert "optimum_amdx.kernels._rmsnorm_triton" in names and "optimum_amdx.kernels._paged_attention_triton" in names
    for name in names:
        assert importlib.import_module(name).AMD_COMPILE_SPECS, f"{name} registers no AMD_COMPILE_SPECS"


def test_versions_summary_matches_the_committed_tables():
    assert ac.VERSIONS_PATH.exists(), HINT
    assert ac.VERSIONS_PATH.read_text() == ac.render_versions(ac.committed_tables()), HINT
