"""The kernel layout (fronts import no triton), the GPU fact table as kernels read it, the validated
Triton range that `optimum-amdx env` reports, and the interpreter repairs of `triton_compat`."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from optimum_amdx.hardware.gpu_facts import ARCHS, PROFILES
from optimum_amdx.hardware.triton_range import TORCH_TO_TRITON, parse_version, triton_validation
from optimum_amdx.kernels.compile_spec import WAVE_SIZE
from optimum_amdx.kernels.runtime import arch_family, compute_units

FRONTS = ["flash_attention", "paged_attention", "rmsnorm", "rotary"]


def test_fronts_import_and_run_their_references_without_triton():
    code = f"""
import sys
sys.modules["triton"] = None  # any `import triton` now raises ImportError
import torch
for name in {FRONTS!r}:
    __import__("optimum_amdx.kernels." + name)
from optimum_amdx.kernels.rmsnorm import rms_norm
from optimum_amdx.kernels.flash_attention import flash_attention
x = torch.randn(2, 8)
assert rms_norm(x, torch.ones(8), 1e-6).shape == (2, 8)
q = torch.randn(1, 2, 3, 4)
assert flash_attention(q, q, q).shape == (1, 2, 3, 4)
assert not any(m == "triton" or m.startswith("triton.") for m, v in sys.modules.items() if v is not None)
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "0"})
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


@pytest.mark.parametrize("arch,family", [("gfx90a", "cdna2"), ("gfx942", "cdna3"), ("gfx950", "cdna4"),
                                         ("gfx1100", "rdna3"), ("gfx1151", "rdna3"), ("gfx1201", "rdna4"),
                                         ("sm_90", "hopper"), ("sm_80", "nvidia"), ("sm_120", "nvidia"),
                                         ("cpu", "cpu"), ("gfx1036", "unknown")])
def test_arch_family_comes_from_the_fact_table(arch, family):
    assert arch_family(arch) == family


def test_kernels_import_on_a_triton_without_the_nvidia_backend():
    # ROCm wheels may ship no `triton.language.extra.cuda`: the PDL instructions then have no-op stand-ins
    code = """
import sys
import triton
sys.modules["triton.language.extra.cuda"] = None
from optimum_amdx.kernels import _pdl, _rmsnorm_triton, _w4a16_triton, _paged_attention_triton, _skinny_gemm_triton
assert _pdl.gdc_wait.fn.__module__ == _pdl.__name__
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


_PDL_BUILD = """
import importlib
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.devtools.amd_compile import full_signature
from optimum_amdx.kernels.compile_spec import spec_modules

seen = {}
for name in spec_modules():
    for spec in importlib.import_module(name).AMD_COMPILE_SPECS:
        if spec.kernel not in seen and any(p.name == "PDL" for p in spec.kernel.params):
            seen[spec.kernel] = spec
for kernel, spec in seen.items():
    sig, cons = full_signature(spec)
    for pdl in (True, False):
        c = triton.compile(ASTSource(kernel, sig, dict(cons, PDL=pdl)), target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": 4})
        ptx = c.asm["ptx"]
        print(kernel.fn.__name__, int(pdl), int("griddepcontrol.wait" in ptx), int("griddepcontrol.launch_dependents" in ptx),
              ptx.count("griddepcontrol.wait"))
"""


def test_every_pdl_kernel_waits_for_its_producer_only_when_asked():
    # each kernel that takes part (one AMD spec per kernel, built for sm_90 in a fresh process): with PDL the
    # launch-dependents and wait instructions are in its PTX, without it (AMD, the interpreter) they are not
    from .sm90_build import sm90_build_stdout

    rows = [line.split() for line in sm90_build_stdout(_PDL_BUILD, timeout=600).splitlines() if line.strip()]
    assert {r[0] for r in rows} == {"_rms_norm_kernel", "_silu_mul_kernel", "_rope_cache_kernel",
                                    "_unified_attention_kernel", "_split_reduce_kernel", "_skinny_gemm_kernel",
                                    "_w4a16_stream_kernel", "_w4a16_pipelined_kernel"}
    for name, pdl, waits, launches, n_waits in rows:
        assert waits == launches == pdl, (name, pdl, waits, launches)
        if name == "_unified_attention_kernel" and pdl == "1":
            # its wait sits before the first load of q, after a program with no query rows may leave: that path
            # waits too, so the kernel never ends before the one it follows (whose outputs later kernels read)
            assert n_waits == "2", n_waits


@pytest.mark.parametrize("arch,expected", [("sm_90", True), ("sm_100", True), ("sm_80", False), ("gfx942", False),
                                           ("cpu", False), ("sm_9a", False)])
def test_programmatic_dependent_launch_only_on_nvidia_sm90_and_later(arch, expected):
    from optimum_amdx.kernels import runtime

    saved = dict(runtime._PDL)
    try:
        runtime.set_pdl(True)
        assert runtime.pdl_enabled(arch) is expected
        runtime.set_pdl(False)
        assert not runtime.pdl_enabled(arch)
    finally:
        runtime._PDL.update(saved)


def test_programmatic_dependent_launch_per_launch_rules(monkeypatch):
    # one-row launches of the kernels that take part, on an sm_90 device, unless switched off; never on the
    # CPU or under the interpreter; an unknown kernel name in `off` is a mistake, said so
    import torch

    from optimum_amdx.kernels import runtime

    monkeypatch.setattr(runtime, "device_arch", lambda index=0: "sm_90")
    monkeypatch.setattr(runtime, "interpret_mode", lambda: False)

    class FakeCuda:
        device = torch.device("cuda", 0)

    t = FakeCuda()
    saved = dict(runtime._PDL)
    try:
        runtime.set_pdl(True)
        assert runtime.pdl_for(t, "rmsnorm", 1)
        for kernel in runtime.PDL_KERNELS:  # every kernel has its row limit: one row or the W4A16 chain's
            assert runtime.PDL_MAX_ROWS[kernel] in (1, runtime.PDL_CHAIN_ROWS)
            assert runtime.pdl_for(t, kernel, runtime.PDL_MAX_ROWS[kernel])
            assert not runtime.pdl_for(t, kernel, runtime.PDL_MAX_ROWS[kernel] + 1)
        assert runtime.pdl_for(t, "w4a16_rows", 16) and not runtime.pdl_for(t, "attention", 16)
        assert not runtime.pdl_for(torch.zeros(1), "rmsnorm", 1)
        runtime.set_pdl(True, off=("rmsnorm",))
        assert not runtime.pdl_for(t, "rmsnorm", 1) and runtime.pdl_for(t, "w4a16", 1)
        with pytest.raises(ValueError, match="unknown PDL kernels"):
            runtime.set_pdl(True, off=("rms_norm",))
        monkeypatch.setattr(runtime, "interpret_mode", lambda: True)
        assert not runtime.pdl_for(t, "rmsnorm", 1)
    finally:
        runtime._PDL.update(saved)


def test_compute_units_on_the_cpu_is_what_the_caller_asks_for():
    # the one place grids are sized from (SMs / CUs); the interpreter gets the caller's stand-in count
    import torch

    assert compute_units(torch.device("cpu")) == 1
    assert compute_units(torch.device("cpu"), on_cpu=4) == 4


def test_fact_table_lds_and_wave_meanings():
    # RDNA3: 64 KiB per workgroup, 128 KiB shared by a WGP; CDNA4 160 KiB; one entry per product.
    assert (ARCHS["gfx1100"].lds_workgroup_kib, ARCHS["gfx1100"].lds_pool_kib) == (64, 128)
    assert (ARCHS["gfx942"].lds_workgroup_kib, ARCHS["gfx942"].lds_pool_kib) == (64, 64)
    assert ARCHS["gfx950"].lds_workgroup_kib == 160
    assert WAVE_SIZE == {"gfx90a": 64, "gfx942": 64, "gfx950": 64, "gfx1100": 32}
    assert PROFILES["rx7900xtx"].to_dict()["lds_pool_kib"] == 128
    assert all(p.arch in ARCHS for p in PROFILES.values())


def test_triton_range_check_says_what_to_do():
    assert parse_version("3.4.0+gitf7888497") == (3, 4)
    for version in ("3.6.0", "3.7.1", "3.8.0", "3.9.0"):
        assert triton_validation(version, "2.13.0")["validated"] is True
    old = triton_validation("3.4.0", "2.13.0")
    assert old["validated"] is False and "triton==3.7.1" in old["fix"]
    new = triton_validation("3.10.0", None)
    assert new["validated"] is False and "newer" in new["fix"]
    assert triton_validation("", None)["validated"] is None
    assert all(triton_validation(t)["validated"] for t in TORCH_TO_TRITON.values())


def test_interpreter_defects_are_repaired():
    pytest.importorskip("triton")
    from optimum_amdx.kernels.triton_compat import fix_interpreter, interpreter_defects

    fix_interpreter()
    assert interpreter_defects() == []


def test_env_reports_a_triton_outside_the_range_as_a_problem_with_its_fix():
    from optimum_amdx.hardware.report import find_problems, format_report, hardware_report

    report = hardware_report()
    report["triton"].update(installed=True, version="3.4.0", **triton_validation("3.4.0", "2.13.0"))
    problems = [p for p in find_problems(report) if "validated" in p.problem]
    assert len(problems) == 1 and "triton==3.7.1" in problems[0].fix
    report["problems"] = []
    assert "validated (3.6 to 3.9): NO" in format_report(report)
