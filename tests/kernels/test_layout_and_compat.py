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


_PRE_WAIT_BUILD = r"""
import importlib, re
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.devtools.amd_compile import full_signature
from optimum_amdx.kernels import _w4a16_triton as kt
from optimum_amdx.kernels.compile_spec import spec_modules

DEF = re.compile(r"^\s*(%[\w.]+)(?::\d+)?\s*=\s*(.*)$")
NAME = re.compile(r"%[\w.]+")


def pre_wait_roots(ttir):
    # the pointer parameters every load (or inline-asm load / prefetch) before the last griddepcontrol.wait reads
    # through: the backward slice of its address, through SSA definitions, loop inits and earlier loads
    fn = next(l for l in ttir.splitlines() if "tt.func public" in l)
    lines = [l.split(" loc(")[0] for l in ttir.splitlines()]
    params = {m.group(1) for m in re.finditer(r"(%[\w.]+): !tt\.ptr", fn)}
    defs = {}
    for l in lines:
        m = DEF.match(l)
        if m:
            defs[m.group(1)] = NAME.findall(m.group(2))
        if "iter_args" in l or "scf.while" in l:
            for a, b in re.findall(r"(%[\w.]+) = (%[\w.]+)", l):
                defs.setdefault(a, []).append(b)
    # the wait: inline PTX up to Triton 3.8, an op of its own from 3.9
    last_wait = max(i for i, l in enumerate(lines) if "griddepcontrol.wait" in l or "grid_dependency_wait" in l)
    roots = set()
    for l in lines[:last_wait]:
        if "tt.load " in l:
            ops = NAME.findall(l.split("tt.load", 1)[1])[:1]
        elif "tt.elementwise_inline_asm" in l and ("ld.global" in l or "prefetch" in l) and "}" in l:
            ops = NAME.findall(l.split("}", 1)[1])
        else:
            continue
        seen, stack = set(), list(ops)
        while stack:
            v = stack.pop()
            if v not in seen:
                seen.add(v)
                roots.update({v} & params)
                stack.extend(defs.get(v, []))
    return sorted(r[1:] for r in roots)


def build(kernel, sig, cons, warps=4):
    c = triton.compile(ASTSource(kernel, sig, cons), target=GPUTarget("cuda", 90, 32), options={"num_warps": warps})
    return c.asm["ttir"]


seen = set()
for name in spec_modules():
    for spec in importlib.import_module(name).AMD_COMPILE_SPECS:
        if spec.kernel in seen or not any(p.name == "PDL" for p in spec.kernel.params):
            continue
        seen.add(spec.kernel)
        sig, cons = full_signature(spec)
        print(spec.kernel.fn.__name__, ",".join(pre_wait_roots(build(spec.kernel, sig, dict(cons, PDL=True)))) or "-")
# the decode step's W4A16 form on NVIDIA: packed loop, paired input, accumulating, scales a tile ahead
sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "perm_ptr": "*i32", "bias_ptr": "*fp16",
       "out_ptr": "*fp32", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "xp_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32",
       "KT": "i32", "NB": "i32", "stride_xm": "i32", "stride_om": "i32", "n_units": "i32", "e7_bits": "i32"}
cons = dict(GROUP_SIZE=128, CHUNKS=1, BLOCK_M=1, BLOCK_N=128, HAS_ZEROS=True, HAS_PERM=False, HAS_BIAS=False,
            EVEN_K=True, EVEN_N=True, FENCE=False, PIPELINE=False, STAGES=1, JOIN=True, PACKED=True, XPREP=True,
            PACK4=True, LOOKAHEAD=False, PDL=True, ACCUM=True, HALF_LOOP=False, BF16_PAIRS=False, SCALES_AHEAD=True)
sig.update({c: "constexpr" for c in cons})
print("w4a16_decode_form", ",".join(pre_wait_roots(build(kt._w4a16_stream_kernel, sig, cons, 8))))
# the decode step's attention on NVIDIA: its first tile's keys and values of earlier steps before the wait (KV_AHEAD)
from optimum_amdx.kernels import _paged_attention_triton as pa
spec = next(s for s in pa.AMD_COMPILE_SPECS if s.kernel is pa._unified_attention_kernel and s.constexprs.get("ONE_TOKEN"))
sig, cons = full_signature(spec)
print("attention_decode_form", ",".join(pre_wait_roots(build(pa._unified_attention_kernel, sig,
                                                             dict(cons, PDL=True, KV_AHEAD=True)))))
"""

_PRE_WAIT_ALLOWED = {  # what no kernel of a step writes: the model's tensors and the inputs staged before the graph
    "_rms_norm_kernel": {"w_ptr", "perm_ptr"},
    "_rope_cache_kernel": {"pos_ptr", "slot_ptr", "cos_ptr", "sin_ptr"},
    "_unified_attention_kernel": {"qsl_ptr", "seq_lens_ptr", "block_tables_ptr", "first_pages_ptr", "out_cols_ptr"},
    # the rotary + cache kernel before it writes each sequence's newest key and value: the loads of the cache before
    # the wait are masked to earlier steps' keys (the interpreter checks that mask:
    # test_paged_attention.py::test_a_decode_step_reads_this_steps_keys_only_after_its_wait)
    "attention_decode_form": {"qsl_ptr", "seq_lens_ptr", "block_tables_ptr", "first_pages_ptr", "out_cols_ptr",
                              "k_cache_ptr", "v_cache_ptr"},
    "_w4a16_stream_kernel": {"qw_ptr", "s_ptr", "z_ptr", "perm_ptr"},
    "w4a16_decode_form": {"qw_ptr", "s_ptr", "z_ptr", "perm_ptr"},
    "_w4a16_pipelined_kernel": {"qw_ptr", "s_ptr", "z_ptr"},
    "_skinny_gemm_kernel": {"w_ptr", "b_ptr", "nw_ptr"},
    "_silu_mul_kernel": set(),
    "_split_reduce_kernel": set(),
}


def test_what_a_pdl_kernel_reads_before_its_wait_is_never_written_by_a_kernel_of_the_step():
    """A PDL kernel's code before its wait may run beside any earlier kernel of the chain still running, so every load
    there must read only the model's tensors or the step's inputs (staged before the graph replays). Each PDL kernel
    (one AMD spec each, and the decode step's W4A16 form) is built for sm_90 and the address of every load before its
    last wait traced back to the pointer parameters it reads through (TTIR). The norm, rope, attention and W4A16 forms
    must show what they load early (rounds 30-31), so the trace is not vacuous."""
    from .sm90_build import sm90_build_stdout

    rows = dict(line.split() for line in sm90_build_stdout(_PRE_WAIT_BUILD, timeout=600).splitlines() if line.strip())
    got = {k: set() if v == "-" else set(v.split(",")) for k, v in rows.items()}
    assert set(got) == set(_PRE_WAIT_ALLOWED)
    for kernel, roots in got.items():
        assert roots <= _PRE_WAIT_ALLOWED[kernel], (kernel, roots - _PRE_WAIT_ALLOWED[kernel])
    assert {"w_ptr"} <= got["_rms_norm_kernel"]
    assert {"pos_ptr", "cos_ptr", "sin_ptr", "slot_ptr"} <= got["_rope_cache_kernel"]
    assert {"qsl_ptr", "seq_lens_ptr"} <= got["_unified_attention_kernel"]
    assert {"qw_ptr", "s_ptr", "z_ptr"} <= got["w4a16_decode_form"]
    assert {"block_tables_ptr", "k_cache_ptr", "v_cache_ptr"} <= got["attention_decode_form"]


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
