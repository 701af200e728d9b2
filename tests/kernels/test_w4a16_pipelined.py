"""The pipelined fused W4A16 GEMM (NVIDIA: PTX weight loads and fp16 dequantization; AMD and the interpreter: its
portable form): who may take it, the sm_90 build's structure (compiled on the CPU), the AMD configs, and every
group layout, zero mode, act-order, ragged K/N, dtype, row count and K split against the exact float32 result.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.kernels._w4a16_pipelined_triton import PIPELINED_CONFIGS
from optimum_amdx.kernels.w4a16 import prepare_gptq_weight, w4a16_matmul

from .test_w4a16 import DEVICE, quantize
from .sm90_build import sm90_build_stdout
from .test_w4a16_stream import PACKED_CASES


def test_pipelined_route_targets():
    """NVIDIA takes it for fp16 and bf16, AMD for fp16 (its portable fp16 dequantization) and for bf16 on a weight
    of one scale group per tile (its portable bf16 planes), the interpreter only when forced; on a CDNA GPU the
    dispatcher sends 2-128 fp16 rows of a large weight here, bf16 of g128 too, bf16 of g32 elsewhere."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import pipelined_eligible
    from optimum_amdx.kernels.w4a16 import dispatch_route

    qweight, qzeros, scales, g_idx, _ = quantize(256, 128, 4, 128, True, False, "gptq", seed=1)
    w = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=128)
    assert pipelined_eligible("sm_90", w) and pipelined_eligible("sm_90", w, torch.bfloat16)
    assert pipelined_eligible("gfx942", w, torch.float16) and pipelined_eligible("gfx1100", w, torch.float16)
    assert pipelined_eligible("gfx942", w, torch.bfloat16) and pipelined_eligible("gfx1100", w, torch.bfloat16)
    qweight, qzeros, scales, g_idx, _ = quantize(256, 128, 4, 32, True, False, "gptq", seed=1)
    w32 = prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=32)
    assert pipelined_eligible("sm_90", w32, torch.bfloat16) and pipelined_eligible("gfx942", w32, torch.float16)
    assert not pipelined_eligible("gfx942", w32, torch.bfloat16)  # bf16's float32 form: at parity with the fused GEMM
    assert not pipelined_eligible("cpu", w)
    big = prepare_gptq_weight(torch.zeros(4096 // 8, 8192, dtype=torch.int32),
                              torch.zeros(4096 // 128, 8192 // 8, dtype=torch.int32),
                              torch.ones(4096 // 128, 8192, dtype=torch.float16), None, bits=4, group_size=128)
    assert [dispatch_route(m, big, torch.float16, "gfx942") for m in (1, 2, 128, 129)] == [
        "stream", "pipelined", "pipelined", "pipelined"]  # g128, wide: to the prefill limit (256)
    assert dispatch_route(257, big, torch.float16, "gfx942") == "dequant"
    assert dispatch_route(16, big, torch.float16, "gfx1100") == "pipelined"
    assert dispatch_route(17, big, torch.float16, "gfx1100") == "gemm"
    assert [dispatch_route(m, big, torch.bfloat16, "gfx942") for m in (2, 16, 128, 129)] == [
        "pipelined", "pipelined", "pipelined", "dequant"]  # bf16 planes: to the wide limit (128), no prefill rows
    assert dispatch_route(16, big, torch.bfloat16, "gfx1100") == "pipelined"
    big32 = prepare_gptq_weight(torch.zeros(4096 // 8, 8192, dtype=torch.int32),
                                torch.zeros(4096 // 32, 8192 // 8, dtype=torch.int32),
                                torch.ones(4096 // 32, 8192, dtype=torch.float16), None, bits=4, group_size=32)
    assert dispatch_route(16, big32, torch.bfloat16, "gfx942") == "gemm"
    assert dispatch_route(16, big32, torch.float16, "gfx942") == "pipelined"


def test_amd_configs_are_the_portable_form():
    """An AMD family runs the Hopper classes as `AMD_CLASSES` maps them, with plain word loads, the portable fp16
    dequantization (bf16: its portable planes of q - z where the class scales one-group tiles, else the float32 form),
    one K tile per step and two stages; gfx1100 only the 16-row tile (no scratch there)."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import AMD_CLASSES, float32_config, pipelined_config

    for family in AMD_CLASSES:
        for m, k, n in ((2, 4096, 4096), (16, 4096, 28672), (24, 4096, 28672), (48, 14336, 4096), (200, 4096, 28672)):
            for half in (True, False):
                cfg = pipelined_config(m, k, n, 1, half, family)
                assert cfg["PTX_LOADS"] is False and cfg["PTX_DEQ"] is False and cfg["num_stages"] == 2, cfg
                planes = not half and (m <= 192 or n < 8192)  # BF16_PLANES_MAX_WIDE, WIDE_N
                assert cfg["HALF_DEQ"] == (half or planes)
                assert bool(cfg.get("SCALE_AFTER")) == (planes or (half and cfg["BLOCK_N"] == 64)), cfg
                assert pipelined_config(m, k, n, 4, False, family)["HALF_DEQ"] is False  # g32: the float32 form
                assert cfg["BLOCK_M"] <= (64 if family == "cdna" else 16)
                assert ("matrix_instr_nonkdim" in cfg) == (family == "cdna")
    assert pipelined_config(200, 4096, 28672, 1, False, "cdna")["BLOCK_M"] == 64  # no 256-row tile in 64 KiB
    assert pipelined_config(16, 4096, 4096, 1, True, "hopper") == PIPELINED_CONFIGS["rows16"]
    # bf16 with one group per tile takes the scaled fp16 class itself (bf16 planes); with more, its float32 form
    assert pipelined_config(16, 4096, 4096, 1, False, "hopper") == PIPELINED_CONFIGS["rows16"]
    assert pipelined_config(16, 4096, 4096, 4, False, "hopper") == float32_config(PIPELINED_CONFIGS["rows16_regs"])



_SM90_PRELUDE = r"""
import json
import os
import re
import subprocess
import tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.kernels import _w4a16_pipelined_triton as kp

sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": "*fp16",
       "out_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "M": "i32", "N": "i32", "K": "i32", "KT": "i32",
       "stride_xm": "i32", "stride_om": "i32", "tiles_per_split": "i32", "e7_bits": "i32"}
# the register spills ptxas made: the STACK of the cubin's kernel (Triton ships cuobjdump and nvdisasm beside ptxas)
bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
cuobjdump = os.path.join(bindir, "cuobjdump")
os.chdir(tempfile.mkdtemp())
"""
"""What both sm_90 build scripts start with: the imports, the kernel's runtime signature, Triton's bundled tools."""

_BUILD = _SM90_PRELUDE + r"""
seen = []
for name, cfg in kp.PIPELINED_CONFIGS.items():
    # the layouts each config serves: one group per tile, and four (g32, asym, split K) except on the
    # 256x128 tile, which `pipelined_config` gives one-group layouts only
    served = [(1, False, 1, None)] if name == "rows256" else [(1, False, 1, None), (4, True, 2, None)]
    # and the g128 form under each register cap a grid can give it (`fit_wave`)
    caps = [cfg[key] for key in ("overflow_maxnreg", "scale_after_maxnreg") if key in cfg]
    served += [(1, False, 1, cap) for cap in caps]
    # and, where the class scales one-group tiles, g128 asym (its zeros and scales loaded first, SCALES_FIRST)
    if kp._scale_after(cfg, 1):
        served += [(1, True, 1, cap) for cap in [None] + caps]
    # and bf16's scaled form (its planes of q - z) wherever the class scales one-group tiles, under the same caps
    served = [(*v, False) for v in served] + [(*v, True) for v in served if v[0] == 1 and kp._scale_after(cfg, 1)]
    for chunks, zeros, split, cap, bf16 in served:
        cons = {"GROUP_SIZE": 128 // chunks, "CHUNKS": chunks, "BLOCK_M": cfg["BLOCK_M"], "BLOCK_N": cfg["BLOCK_N"],
                "GROUP_M": cfg.get("GROUP_M", 8), "SPLIT": split, "HAS_ZEROS": zeros, "HAS_BIAS": True, "EVEN_K": True,
                "EVEN_N": True, "PTX_LOADS": cfg.get("PTX_LOADS", True),
                "HALF_DEQ": cfg.get("HALF_DEQ", False) and not bf16, "ACCUM": False, "PTX_DEQ": True,
                "SCALE_AFTER": kp._scale_after(cfg, chunks), "BF16": bf16,
                "SCALES_FIRST": kp.scales_first(cfg, zeros, kp._scale_after(cfg, chunks)), "PDL": False,
                "PDL_TRIGGER": 1, "L2_AHEAD": 0, "UNROLL": 1}
        act = {"x_ptr": "*bf16", "bias_ptr": "*bf16", "out_ptr": "*bf16"} if bf16 else {}
        s = dict(sig, **act, **{name: "constexpr" for name in cons})
        attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 4, 5, 6, 7, 9, 10, 12, 13)}
        c = triton.compile(ASTSource(fn=kp._w4a16_pipelined_kernel, signature=s, constexprs=cons, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32),
                           options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"],
                                    **({"maxnreg": cap} if cap else {})})
        ir = c.asm["ttgir"]
        with open("kernel.cubin", "wb") as f:
            f.write(c.asm["cubin"])
        usage = subprocess.run([cuobjdump, "-res-usage", "kernel.cubin"], capture_output=True, text=True,
                               check=True).stdout
        seen.append({"config": name, "maxnreg": cap, "half": cons["HALF_DEQ"], "ptx_loads": cons["PTX_LOADS"],
                     "scale_after": cons["SCALE_AFTER"], "bf16": bf16, "f16x2_adds": c.asm["ptx"].count("add.rn.f16x2"),
                     "bf16x2_fmas": c.asm["ptx"].count("fma.rn.bf16x2"),
                     "f16x2_muls": c.asm["ptx"].count("mul.rn.f16x2"), "wgmma": ir.count("ttng.warp_group_dot "),
                     "async_copies": ir.count("ttg.async_copy_global_to_local"), "local_loads": ir.count("ttg.local_load"),
                     "stack": [int(v) for v in re.findall(r"STACK:(\d+)", usage)]})
print(json.dumps(seen))
"""


def test_pipelined_kernel_builds_for_sm90_with_the_weight_operand_in_registers():
    """Compiled in a fresh process with the interpreter off. What makes the kernel worth having: the
    activations are staged by asynchronous copies (pipelined), the dequantized weight feeds ``wgmma``
    straight from registers, the fp16 configs dequantize with the packed fp16 asm (without its multiplies where
    a config scales each tile's dot product: `SCALE_AFTER`; bf16 there with its bf16 planes), and nothing spills.
    With PTX word loads nothing goes
    through shared memory but the activations (no ``local_load``); the configs with plain word loads have their
    words staged too (more asynchronous copies) and read back."""
    import json

    from optimum_amdx.kernels._w4a16_pipelined_triton import PIPELINED_CONFIGS, _scale_after

    builds = json.loads(sm90_build_stdout(_BUILD).strip().splitlines()[-1])

    caps = sum(key in cfg for cfg in PIPELINED_CONFIGS.values() for key in ("overflow_maxnreg", "scale_after_maxnreg"))
    assert caps >= 2  # rows16's one-wave cap, rows64's scaled form on large grids
    fp16 = [b for b in builds if not b["bf16"]]
    scaled_asym = sum(1 + sum(key in cfg for key in ("overflow_maxnreg", "scale_after_maxnreg"))
                      for cfg in PIPELINED_CONFIGS.values() if _scale_after(cfg, 1))
    # the 256x128 tile serves one group per tile only
    assert len(fp16) == 2 * len(PIPELINED_CONFIGS) - 1 + caps + scaled_asym
    scaled = [b for b in fp16 if b["scale_after"]]
    assert len(scaled) >= 3 and sorted((b["config"], b["maxnreg"] or 0) for b in scaled) == sorted(
        (b["config"], b["maxnreg"] or 0) for b in builds if b["bf16"])  # bf16's scaled twins, cap for cap
    for b in builds:
        assert (b["bf16x2_fmas"] > 0) == b["bf16"], b  # bf16's planes of q - z, in its scaled form only
        assert b["wgmma"] >= 1, b
        assert b["async_copies"] >= 2, b  # at least double-buffered activations
        assert (b["f16x2_adds"] > 0) == b["half"], b  # the fp16 planes
        assert (b["f16x2_muls"] > 0) == (b["half"] and not b["scale_after"]), b  # scaled per weight, or per tile
        if b["ptx_loads"]:
            assert b["local_loads"] == 0, b  # the weight operand never goes through shared memory
        else:
            ptx_twin = next(c for c in builds if c["ptx_loads"] and c["config"] == "rows16_regs")
            assert b["async_copies"] > ptx_twin["async_copies"], b  # the words are staged as well
            assert b["local_loads"] >= 1, b  # and read back from shared memory
        # ptxas spilled no register, but for rows64's scaled form under its large-grid cap: 16-24 B on the stack
        # (Triton 3.6.0-3.9.0), and still 8-11 % faster than the unscaled form those grids ran before (H100,
        # RESULTS.md round22); and rows16 under its one-wave cap with its scales loaded first: 8 B with Triton 3.6.0,
        # which the H100 measurements ran, 2-6 % faster than the other order on 4096x28672 at 2-16 rows (round24)
        capped64 = b["config"] == "rows64" and b["maxnreg"] == PIPELINED_CONFIGS["rows64"]["scale_after_maxnreg"]
        capped16 = b["config"] == "rows16" and b["maxnreg"] == PIPELINED_CONFIGS["rows16"]["overflow_maxnreg"]
        assert len(b["stack"]) == 1 and b["stack"][0] <= (32 if capped64 else 8 if capped16 else 0), b


_UNROLL_BUILD = _SM90_PRELUDE + r"""
sig["out_ptr"] = "*fp32"  # the accumulator
cfg = kp.PIPELINED_CONFIGS["rows16"]
seen = {}
for unroll, stages in ((1, cfg["num_stages"]), (2, 2)):
    # the 16-row call as the decode step launches it: g128 symmetric, scaled, into an accumulator, with PDL
    cons = {"GROUP_SIZE": 128, "CHUNKS": 1, "BLOCK_M": 16, "BLOCK_N": cfg["BLOCK_N"], "GROUP_M": 8, "SPLIT": 4,
            "HAS_ZEROS": False, "HAS_BIAS": False, "EVEN_K": True, "EVEN_N": True, "PTX_LOADS": False,
            "HALF_DEQ": True, "ACCUM": True, "PTX_DEQ": True, "SCALE_AFTER": True, "BF16": False, "SCALES_FIRST": True,
            "PDL": True, "PDL_TRIGGER": 1, "L2_AHEAD": 2, "UNROLL": unroll}
    s = dict(sig, **{name: "constexpr" for name in cons})
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(14)}
    c = triton.compile(ASTSource(fn=kp._w4a16_pipelined_kernel, signature=s, constexprs=cons, attrs=attrs),
                       target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": cfg["num_warps"], "num_stages": stages, "maxnreg": cfg["maxnreg"]})
    with open("kernel.cubin", "wb") as f:
        f.write(c.asm["cubin"])
    usage = subprocess.run([cuobjdump, "-res-usage", "kernel.cubin"], capture_output=True, text=True, check=True).stdout
    sass = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", "kernel.cubin"], capture_output=True, text=True,
                          check=True).stdout
    seen[unroll] = {"shared": c.metadata.shared, "stack": int(usage.split("STACK:")[1].split()[0]),
                    "wgmma": sass.count("HGMMA"), "barriers": sass.count("BAR.SYNC")}
print(json.dumps(seen))
"""


def test_the_unroll_experiment_builds_for_sm90_within_the_16_row_grid():
    """``UNROLL`` = 2 at 2 stages (the `_w4a16_pipelined_triton` docstring; measured on no GPU yet) builds the 16-row
    call as the decode step launches it: under the class's register cap no spill in the shipped form and at most 8 B
    unrolled (none with Triton 3.6.0-3.8.0, which the H100 runs use; 8 B with 3.9.0), both tiles of a step as ``wgmma``
    chains beside the remainder loop's, and shared memory within what six programs an SM (the class's ``waves``) may
    hold on an H100 (227 KiB)."""
    import json

    builds = {int(k): v for k, v in json.loads(sm90_build_stdout(_UNROLL_BUILD).strip().splitlines()[-1]).items()}
    shipped, unrolled = builds[1], builds[2]
    assert shipped["stack"] == 0 and unrolled["stack"] <= 8, builds
    assert unrolled["wgmma"] >= 2 * shipped["wgmma"], builds  # the step's two tiles, and the odd one after the loop
    assert PIPELINED_CONFIGS["rows16"]["waves"] * unrolled["shared"] <= 227 * 1024, builds


def test_pipelined_configs_and_k_splits():
    from optimum_amdx.kernels._w4a16_gemm_triton import split_k
    from optimum_amdx.kernels._w4a16_pipelined_triton import (BF16_PLANES_MAX_WIDE, PIPELINED_CONFIGS, WIDE_TILE_N,
                                                           _scale_after, fit_wave, float32_config, launch_plan,
                                                           pipelined_config)
    from optimum_amdx.kernels.w4a16 import LONG_K

    n_wide, n_narrow = 14336, 4096
    rows64_cfg = PIPELINED_CONFIGS["rows64"]
    assert pipelined_config(16, 4096, n_wide)["BLOCK_M"] == 16 and pipelined_config(32, 4096, n_narrow)["BLOCK_M"] == 32
    # narrow outputs split K further (bf16's float32 form keeps the register class on wide ones)
    assert (pipelined_config(24, 4096, n_narrow, chunks=4, half=False)["waves"]
            > pipelined_config(24, 4096, n_wide, chunks=4, half=False)["waves"])
    # 33 rows and more: 64-row tiles, 64 columns wide and split along K (4 programs per SM) ...
    for m, k, n in ((33, 4096, n_narrow), (64, LONG_K + 1, n_narrow), (65, LONG_K + 1, n_narrow),
                    (128, LONG_K + 1, n_narrow), (256, LONG_K + 1, n_narrow), (100, 4096, 12288)):
        cfg = pipelined_config(m, k, n)
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["waves"]) == (64, 64, 4), (m, k, n)
    # ... or 128 wide: narrow outputs of a long input above 384 rows (prefill chunks), and at 65-128 where the 64 x 64
    # tile would run unscaled (no register cap on AMD; bf16's float32 form); outputs of WIDE_TILE_N columns from 33
    # rows, every wide output from 129 rows
    assert pipelined_config(384, LONG_K + 1, n_narrow)["BLOCK_N"] == 64
    for m, k, n in ((385, LONG_K + 1, n_narrow), (512, LONG_K + 1, n_narrow), (33, 4096, WIDE_TILE_N),
                    (129, 4096, 12288), (512, 4096, 12288)):
        cfg = pipelined_config(m, k, n)
        assert (cfg["BLOCK_M"], cfg["BLOCK_N"], cfg["num_warps"]) == (64, 128, 8), (m, k, n)
    for m in (65, 128):
        assert pipelined_config(m, LONG_K + 1, n_narrow, family="cdna")["BLOCK_N"] == 128
        assert pipelined_config(m, LONG_K + 1, n_narrow, chunks=4, half=False)["BLOCK_N"] == 128
        assert pipelined_config(m, LONG_K + 1, n_narrow, chunks=4)["BLOCK_N"] == 128  # g32: unscaled
    assert pipelined_config(128, 4096, WIDE_TILE_N - 1)["BLOCK_N"] == 64
    # up to 16 rows of fp16: words staged through shared memory, one K tile per step, the nearest split count,
    # each tile's dot product scaled; bf16 in its float32 form (more than one group per tile) keeps the register loads
    staged = pipelined_config(16, 4096, n_wide)
    assert staged["PTX_LOADS"] is False and staged["within_waves"] is False
    assert staged["SCALE_AFTER"] and pipelined_config(16, 4096, 4096) == staged
    assert pipelined_config(16, 4096, n_wide, chunks=4, half=False).get("PTX_LOADS", True)
    assert "SCALE_AFTER" not in pipelined_config(16, 4096, n_wide, chunks=4, half=False)
    # bf16 with one group per tile takes its bf16 planes of q - z: the fp16 class where that class is scaled, else the
    # scaled 64 x 64 tile (in place of the unscaled 64 x 128 one); on wide outputs up to BF16_PLANES_MAX_WIDE rows,
    # on narrow ones at every row count
    for m, k, n in ((2, 4096, n_wide), (16, 4096, 4096), (24, 4096, n_wide), (24, 4096, n_narrow),
                    (48, LONG_K + 1, n_narrow), (64, 4096, n_wide), (256, LONG_K + 1, n_narrow), (200, 4096, 4096)):
        assert pipelined_config(m, k, n, half=False) == pipelined_config(m, k, n), (m, k, n)
        assert pipelined_config(m, k, n, half=False)["SCALE_AFTER"]
    for m, k, n in ((48, 4096, WIDE_TILE_N), (BF16_PLANES_MAX_WIDE, 4096, n_wide)):
        assert pipelined_config(m, k, n)["BLOCK_N"] == 128 and pipelined_config(m, k, n, half=False) == rows64_cfg
    assert pipelined_config(BF16_PLANES_MAX_WIDE + 1, 4096, n_wide, half=False)["BLOCK_M"] == 256  # float32 form
    assert split_k(448, 1, 32, staged, 132) == (2, 16)  # 4096 x 28672: 896 programs, the nearest to 6 per SM
    assert split_k(64, 1, 112, staged, 132) == (12, 10)  # 14336 x 4096
    # a grid past 6 programs per SM takes the register cap that fits 7 (one wave); within it the cap stays 80
    assert fit_wave(staged, 896, 132)["maxnreg"] == 72 and fit_wave(staged, 768, 132) is staged
    assert fit_wave(PIPELINED_CONFIGS["rows64"], 10**6, 132) is PIPELINED_CONFIGS["rows64"]
    # the tile's dot product is scaled (one group per tile, fp16) on grids within the class's programs per SM, and
    # on larger ones where the launch caps registers (NVIDIA) so that the unscaled form's 4 per SM still fit
    rows64 = PIPELINED_CONFIGS["rows64"]
    assert _scale_after(rows64, 1, 384, 132) and not _scale_after(rows64, 1, 512, 132)
    assert _scale_after(rows64, 1, 512, 132, can_cap=True)
    assert fit_wave(rows64, 512, 132, scaled=True)["maxnreg"] == 128
    assert "maxnreg" not in fit_wave(rows64, 396, 132, scaled=True)
    assert "maxnreg" not in fit_wave(rows64, 512, 132, scaled=False)
    # where it may be scaled, the K splits aim at the scaled form's 3 programs per SM (4096 x 14336 at 64 rows:
    # 224 tiles, one split; 14336 x 4096: 64 tiles, 6 splits), which it then takes uncapped; the unscaled layouts
    # (g32, bf16) keep the class's 4 per SM
    rows64w = {**rows64, "within_waves": True}
    assert launch_plan(rows64w, 224, 32, 1, 132, True) == (rows64w, 1, 32, True)
    assert launch_plan(rows64w, 64, 112, 1, 132, True) == (rows64w, 6, 19, True)
    assert launch_plan(rows64w, 224, 32, 4, 132, True)[1:] == (2, 16, False)
    assert launch_plan(rows64w, 448, 32, 1, 132, False)[1:] == (1, 32, False)  # no cap (AMD): unscaled
    assert not _scale_after(PIPELINED_CONFIGS["rows64_n128"], 1, 10**6, 132, can_cap=True)
    assert not _scale_after(rows64, 4, 64, 132) and not _scale_after(float32_config(rows64), 1, 64, 132)
    assert _scale_after(staged, 1, 10**6, 132) and not _scale_after(PIPELINED_CONFIGS["rows32"], 1)
    # bf16's float32 form takes the float32 dequantization with the same tiles, one K tile per step (up to 16 rows,
    # and at 17-32 rows on wide outputs, its own register-load classes: above)
    for m, k, n in ((32, 4096, n_narrow), (100, 4096, n_wide),
                    (100, LONG_K + 1, n_narrow)):
        half, f32 = pipelined_config(m, k, n, chunks=4), pipelined_config(m, k, n, chunks=4, half=False)
        assert half["HALF_DEQ"] and not f32["HALF_DEQ"]
        assert f32.get("PTX_LOADS", True)  # the float32 dequantization keeps the register word loads
        assert f32 == float32_config(half)
    # bf16's float32 form on wide outputs above 64 rows: the 64 x 64 tile up to 128 rows; above 128 rows on every
    # output the 256 x 128 tile (one group per tile, where the planes do not serve; four take the 64 x 64 tile)
    assert pipelined_config(100, 4096, WIDE_TILE_N, chunks=4, half=False)["BLOCK_N"] == 64
    assert pipelined_config(48, 4096, WIDE_TILE_N, chunks=4, half=False)["BLOCK_N"] == 128
    assert pipelined_config(200, LONG_K + 1, n_wide, half=False)["BLOCK_M"] == 256
    for n in (n_wide, n_narrow):
        assert pipelined_config(200, LONG_K + 1, n, chunks=4, half=False)["BLOCK_M"] == 64
    # fp16 stages the words at every row count (wide outputs at 17-32 rows too since round 21)
    for m, n in ((24, n_narrow), (24, n_wide), (33, n_wide), (64, n_narrow), (100, n_wide), (200, n_narrow),
                 (256, WIDE_TILE_N)):
        cfg = pipelined_config(m, 4096, n)
        assert cfg["PTX_LOADS"] is False, (m, n)
    assert pipelined_config(24, 4096, n_wide) == PIPELINED_CONFIGS["narrow32"]
    assert pipelined_config(32, LONG_K + 1, n_narrow)["waves"] == 4  # narrow up to 32 rows: split K further
    within = {"within_waves": True}
    # 32 tiles on 132 SMs at 2 waves want 8 splits; 112 K tiles allow 7 of 16; every split non-empty
    assert split_k(32, 1, 112, {"waves": 2, "min_k_tiles": 16, **within}, 132) == (7, 16)
    assert split_k(32, 1, 32, {"waves": 2, "min_k_tiles": 16, **within}, 132) == (2, 16)
    assert split_k(400, 1, 32, {"waves": 1, **within}, 132) == (1, 32)
    # within the waves: 344 tiles at 4 per SM (528 programs) stay one split (the nearest would be two)
    assert split_k(344, 1, 32, {"waves": 4, "min_k_tiles": 8, **within}, 132) == (1, 32)
    assert split_k(344, 1, 32, {"waves": 4, "min_k_tiles": 8}, 132) == (2, 16)
    assert split_k(224, 1, 32, {"waves": 4, "min_k_tiles": 8, **within}, 132) == (2, 16)
    assert split_k(4, 1, 5, {"SPLIT": 4}, 132) == (3, 2)


def _check_exact(k, n, group, sym, act_order, fmt, m, cfg, dtype):
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)).to(dtype).to(DEVICE)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype).to(DEVICE)
    exact = x.double() @ expected.double().to(DEVICE) + bias.double()
    # the weight rounded once to the activation dtype, float32 sums
    tol = (4e-3 if dtype == torch.float16 else 2e-2) * exact.abs().max().item()
    for _ in range(2):  # the second call checks that the split-K workspace and tickets were left clean
        out = w4a16_matmul(x, w, bias, route="pipelined", config=cfg)
        assert out.dtype == dtype and out.shape == (m, n)
        assert (out.double() - exact).abs().max().item() <= tol


_SPLIT = {"BLOCK_M": 64, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "SPLIT": 2}
_HALF = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SPLIT": 2, "HALF_DEQ": True}
_SCALE_AFTER = {"BLOCK_M": 16, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "SPLIT": 2, "HALF_DEQ": True,
                "SCALE_AFTER": True}
"""The tile's dot of q - z scaled after it (layouts of one group per tile; others ignore the flag)."""


@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("cfg", [{"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 1, "num_stages": 1}, _SPLIT,
                                 _SCALE_AFTER, {**_SCALE_AFTER, "SCALES_FIRST": False}])
def test_pipelined_kernel_matches_exact_interpreted(k, n, group, sym, act_order, fmt, cfg):
    """Under the interpreter the words come from plain loads (it runs no asm); everything else of the
    kernel (group lookups, zeros, act-order gather, ragged K/N, split-K tickets, bias) is checked."""
    if DEVICE == "cuda":
        pytest.skip("the GPU runs the full matrix below")
    _check_exact(k, n, group, sym, act_order, fmt, 20, cfg, torch.float16)


_ONE_GROUP_CASES = [case for case in PACKED_CASES if case[2] in (128, -1)]
"""Layouts of one scale group per 128-row tile (g128 with and without act-order, per-channel), which the scaled form
serves."""


@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", _ONE_GROUP_CASES)
@pytest.mark.parametrize("m", [3, 20])
def test_bf16_planes_are_exact_before_the_last_rounding(k, n, group, sym, act_order, fmt, m):
    """bf16 activations on the scaled form (`SCALE_AFTER`, bf16 planes of q - z; the interpreter runs their
    portable form, the GPU their PTX): q - z is exact in bf16, the products exact in the dot's float32 sums, the scale
    applied in float32, so each output is within half a bf16 step of the exact product (plus float32 summation),
    where a weight rounded to bf16 first (the float32 form) errs by up to half a bf16 step per weight."""
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)).bfloat16().to(DEVICE)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).bfloat16().to(DEVICE)
    exact = x.double() @ expected.double().to(DEVICE) + bias.double()
    out = w4a16_matmul(x, w, bias, route="pipelined", config=_SCALE_AFTER)
    assert out.dtype == torch.bfloat16
    summed = (x.double().abs() @ expected.double().abs().to(DEVICE)) * (k * 2.0**-24)  # float32 summation's bound
    assert ((out.double() - exact).abs() <= exact.abs() * 2.0**-8 + summed + 1e-6).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the kernel is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", PACKED_CASES)
@pytest.mark.parametrize("m", [1, 20, 130, 300])
@pytest.mark.parametrize("cfg", [None, _SPLIT, _HALF, _SCALE_AFTER])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_pipelined_kernel_matches_exact(k, n, group, sym, act_order, fmt, m, cfg, dtype):
    _check_exact(k, n, group, sym, act_order, fmt, m, cfg, dtype)


_CLASS_LAYOUTS = [(128, True, False), (32, False, True), (128, False, True)]
"""g128 symmetric, g32 and g128 asymmetric act-order: one and four scale groups per tile, with and without zeros (the
scaled form loads them first, ``SCALES_FIRST``) and the x gather."""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the kernel is inline PTX)")
@pytest.mark.parametrize("name", sorted(PIPELINED_CONFIGS))
@pytest.mark.parametrize("group,sym,act_order", _CLASS_LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_pipelined_class_matches_exact(name, group, sym, act_order, dtype):
    """Each class of `PIPELINED_CONFIGS` as the dispatcher launches it (fp16: as written; bf16: as written where the
    class scales one-group tiles, its bf16 planes; otherwise `float32_config`), on a weight with several column tiles
    and K splits."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import _scale_after, float32_config

    cfg = PIPELINED_CONFIGS[name]
    if dtype == torch.bfloat16 and not (group == 128 and _scale_after(cfg, 1)):
        cfg = float32_config(cfg)
    _check_exact(2048, 768, group, sym, act_order, "gptq", 2 * cfg["BLOCK_M"] - 3, cfg, dtype)


@pytest.mark.parametrize("name", sorted(PIPELINED_CONFIGS))
@pytest.mark.parametrize("group,sym,act_order", _CLASS_LAYOUTS)
def test_every_pipelined_class_matches_exact_interpreted(name, group, sym, act_order):
    """The same tiles, warps and splits under the interpreter (plain word loads; the classes with HALF_DEQ take
    the portable fp16 dequantization, AMD's, the others the float32 one), on a 256 x 256 weight with two row
    blocks."""
    if DEVICE == "cuda":
        pytest.skip("the GPU runs every class above")
    cfg = PIPELINED_CONFIGS[name]
    _check_exact(256, 256, group, sym, act_order, "gptq", 2 * cfg["BLOCK_M"] - 3, cfg, torch.float16)


@pytest.mark.parametrize("family", ["cdna", "rdna3"])
@pytest.mark.parametrize("m", [2, 40])
@pytest.mark.parametrize("group,sym,act_order", _CLASS_LAYOUTS)
def test_amd_forms_match_exact(family, m, group, sym, act_order):
    """Each AMD family's config (`pipelined_config(..., family)`: plain word loads, portable fp16 dequantization,
    two stages) against the exact product; on a GPU it runs as that form on the GPU at hand (no PTX asked)."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import pipelined_config

    cfg = pipelined_config(m, 256, 256, 128 // group, True, family)
    _check_exact(256, 256, group, sym, act_order, "gptq", m, cfg, torch.float16)


@pytest.mark.parametrize("family", ["cdna", "rdna3"])
@pytest.mark.parametrize("m", [2, 40])
@pytest.mark.parametrize("sym,act_order", [(True, False), (False, True)])
def test_amd_bf16_planes_match_exact(family, m, sym, act_order):
    """bf16 as an AMD family runs it on a weight of one scale group per tile (g128, plain or act-order): the
    family's class with the portable bf16 planes of q - z and the scaled dot products, against the exact product."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import pipelined_config

    cfg = pipelined_config(m, 256, 256, 1, False, family)
    assert cfg["SCALE_AFTER"] and not cfg["PTX_DEQ"]
    _check_exact(256, 256, 128, sym, act_order, "gptq", m, cfg, torch.bfloat16)


def _past_fp16_range(k: int, n: int, m: int, cfg: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, exact product) of a g128 weight whose scales times q - z pass fp16's largest value (65504), so a
    launch that scales each weight overflows and one that scales each tile's float32 sums (`SCALE_AFTER`) does
    not: the output tells which form ran."""
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, 128, True, False, "gptq", seed=5)
    big = (scales.float() * (30000.0 / scales.float().abs().max())).half()  # q - z reaches -8: products to 2.4e5
    rows = g_idx.long()
    codes = torch.round(expected / scales.float()[rows])  # q - z
    exact_w = codes * big.float()[rows]
    assert exact_w.abs().max().item() > 65504
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, big, g_idx)), group_size=128)
    x = (torch.randn(m, k, generator=torch.Generator().manual_seed(1)) * 1e-3).half().to(DEVICE)
    exact = x.double() @ exact_w.double().to(DEVICE)
    return w4a16_matmul(x, w, route="pipelined", config=cfg).double(), exact


@pytest.mark.parametrize("scaled", [True, False])
def test_scaled_dot_products_take_scales_past_the_fp16_range(scaled):
    """With `SCALE_AFTER` the scale multiplies each tile's float32 sums, not the fp16 weights: scales whose products
    with q - z pass fp16's largest value (65504) still give the exact result, where scaling each weight overflows.
    So this also tells which form a launch took (the unscaled form is the control)."""
    out, exact = _past_fp16_range(256, 128, 20, dict(_SCALE_AFTER, SCALE_AFTER=scaled))
    if scaled:
        assert (out - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()
    else:
        assert not torch.isfinite(out).all()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.version.hip is not None,
                    reason="needs an NVIDIA GPU (the register cap)")
def test_rows64_scales_large_grids_under_its_register_cap():
    """``rows64`` on a grid past ``scale_after_waves`` programs per SM with one K split (128 rows of a 256 x 12800
    weight: 400 tiles) still scales each tile's sums, under ``scale_after_maxnreg`` (`launch_plan`), and is
    exact."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import launch_plan
    from optimum_amdx.kernels.runtime import compute_units

    cfg = {**PIPELINED_CONFIGS["rows64"], "within_waves": True}
    cus = compute_units(torch.device(DEVICE))
    tiles = 2 * 12800 // 64
    if tiles <= cfg["scale_after_waves"] * cus:
        pytest.skip(f"{cus} SMs fit the grid without the cap")
    planned, splits, _, scaled = launch_plan(cfg, tiles, 2, 1, cus, True)
    assert splits == 1 and scaled and planned["maxnreg"] == cfg["scale_after_maxnreg"]
    out, exact = _past_fp16_range(256, 12800, 128, cfg)
    assert (out - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the unrolled loop is the compiled kernel's)")
@pytest.mark.parametrize("k,splits", [(1408, 2), (2048, 4), (2048, 1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_unroll_experiment_matches_exact(k, splits, dtype):
    """``UNROLL`` = 2 (the `_w4a16_pipelined_triton` docstring) on the 16-row class's scaled loop: K runs of odd
    (1408 = 11 tiles over 2 splits: 6 and 5) and even lengths, flushed through the workspace or stored, fp16 and bf16
    planes, then accumulated as the decode step calls it."""
    from optimum_amdx.kernels._w4a16_pipelined_triton import pipelined_matmul
    from optimum_amdx.kernels.runtime import device_arch

    cfg = {**PIPELINED_CONFIGS["rows16"], "UNROLL": 2, "num_stages": 2, "SPLIT": splits}
    _check_exact(k, 768, 128, True, False, "gptq", 16, cfg, dtype)
    qweight, qzeros, scales, g_idx, expected = quantize(k, 768, 4, 128, True, False, "gptq", seed=k)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=128)
    x = torch.randn(16, k, generator=torch.Generator().manual_seed(5)).to(dtype).to(DEVICE)
    acc = torch.zeros(16, 768, dtype=torch.float32, device=DEVICE)
    pipelined_matmul(x, w, None, device_arch(), cfg, accumulate_into=acc)
    exact = x.double() @ expected.double().to(DEVICE)
    assert (acc.double() - exact).abs().max().item() <= 2e-2 * exact.abs().max().item()


@pytest.mark.parametrize("cfg", [{"BLOCK_M": 32, "BLOCK_N": 64, "num_warps": 1, "num_stages": 1}, _SPLIT])
def test_pipelined_kernel_accumulates_float32_sums(cfg):
    """`accumulate_into`: one split stores its tile into the caller's float32 accumulator, several add
    theirs (no ticket): the accumulator holds the matmul in float32 and the workspace tickets stay zero."""
    from optimum_amdx.kernels._w4a16_gemm_triton import _WORKSPACES
    from optimum_amdx.kernels._w4a16_pipelined_triton import pipelined_matmul
    from optimum_amdx.kernels.runtime import device_arch

    k, n, m = 512, 192, 20
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, 32, False, False, "gptq", seed=3)
    w = prepare_gptq_weight(*(t.to(DEVICE) for t in (qweight, qzeros, scales, g_idx)), group_size=32)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    exact = x.double() @ expected.double().to(DEVICE)
    acc = torch.zeros(m, n, dtype=torch.float32, device=DEVICE)
    arch = "cpu" if DEVICE == "cpu" else device_arch()
    assert pipelined_matmul(x, w, None, arch, cfg, accumulate_into=acc) is acc
    assert (acc.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()
    assert all(int(cnt.abs().sum()) == 0 for _, cnt in _WORKSPACES.values())
    with pytest.raises(ValueError, match="no bias"):
        pipelined_matmul(x, w, torch.zeros(n, dtype=x.dtype, device=DEVICE), arch, cfg, accumulate_into=acc)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_dispatcher_takes_the_pipelined_gemm_between_its_limits():
    from unittest import mock

    from optimum_amdx.kernels import _w4a16_pipelined_triton as kp
    from optimum_amdx.kernels.runtime import arch_family, device_arch
    from optimum_amdx.kernels.w4a16 import ROUTE_LIMITS

    lim = ROUTE_LIMITS.get(arch_family(device_arch()), ROUTE_LIMITS["default"])
    assert lim.pipelined_max_wide >= lim.pipelined_min, "no row count takes the pipelined GEMM on this GPU"
    # without act-order (act-order weights stop at pipelined_max_act_order, `choose_route`): a wide g128 weight keeps
    # the pipelined GEMM to the prefill limit
    qweight, qzeros, scales, g_idx, expected = quantize(4096, 8192, 4, 128, False, False, "gptq", seed=3)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=128)
    top = max(lim.pipelined_max_wide, lim.pipelined_max_prefill)
    for m in (lim.pipelined_min - 1, lim.pipelined_min, lim.pipelined_max_wide + 1, top, top + 1):
        x = torch.randn(m, 4096, generator=torch.Generator().manual_seed(m)).half().cuda()
        with mock.patch.object(kp, "pipelined_matmul", wraps=kp.pipelined_matmul) as spy:
            out = w4a16_matmul(x, w)
        assert spy.called == (lim.pipelined_min <= m <= top), m
        exact = x.double() @ expected.double().cuda()
        assert (out.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()


def test_pdl_form_and_when_the_pipelined_gemm_takes_it(monkeypatch):
    """Above one row the pipelined GEMM takes part in programmatic dependent launch where `runtime.pdl_for` allows it
    (NVIDIA sm_90+, up to the W4A16 chain's row limit), in `PDL_KNOBS`' form (L2 requests for its first tiles, the next
    kernel launched after its K loop); never on AMD, never when a config turns it off, and never right after a gather
    of x (act-order or ragged K outside the engine), which lets nothing launch early. A stand-in kernel records each
    launch's arguments."""
    from optimum_amdx.kernels import _w4a16_pipelined_triton as kp
    from optimum_amdx.kernels import runtime

    launches: list[dict] = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs)

    monkeypatch.setattr(kp, "_w4a16_pipelined_kernel", Recorder())
    monkeypatch.setattr(kp, "gather_x", lambda x2, w, natural: x2.clone())  # a launch of its own on a GPU
    monkeypatch.setattr(kp, "pdl_for", lambda t, kernel, rows: kernel == "w4a16_rows"
                        and rows <= runtime.PDL_MAX_ROWS[kernel])  # an sm_90 GPU with PDL on
    assert runtime.PDL_MAX_ROWS["w4a16_rows"] == runtime.PDL_CHAIN_ROWS >= 16

    def weight(act_order: bool):
        qweight, qzeros, scales, g_idx, _ = quantize(256, 128, 4, 128, True, act_order, "gptq", seed=1)
        return prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=128)

    plain, act = weight(False), weight(True)
    x16 = torch.randn(16, 256).half()

    def launch(x, w, arch, config=None):
        launches.clear()
        kp.pipelined_matmul(x, w, None, arch, config)
        (kwargs,) = launches
        return kwargs["PDL"], kwargs["launch_pdl"], kwargs["PDL_TRIGGER"], kwargs["L2_AHEAD"]

    form = (kp.PDL_KNOBS["PDL_TRIGGER"], kp.PDL_KNOBS["L2_AHEAD"])
    assert form == (1, 2)
    assert launch(x16, plain, "sm_90") == (True, True, *form)
    assert launch(x16, act, "sm_90")[:2] == (False, False)  # after the gather of x
    assert launch(x16, plain, "gfx942")[:2] == (False, False)  # AMD: no PDL, no PTX
    rows_over = runtime.PDL_CHAIN_ROWS + 1
    assert launch(torch.randn(rows_over, 256).half(), plain, "sm_90")[:2] == (False, False)
    off = dict(kp.pipelined_config(16, 256, 128), PDL=0)
    assert launch(x16, plain, "sm_90", off)[:2] == (False, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_pdl_chain_reads_each_input_after_its_producer_under_graph_replay():
    """Above one row the pipelined GEMM and the norms around it launch early on NVIDIA sm_90+ (`runtime.PDL_MAX_ROWS`;
    plain launches elsewhere). A captured chain of residual blocks, h = norm(h @ W + h), through the accumulating, the
    flushed and the act-order route, whose input flips sign between replays, gives each replay's float32 result: a
    kernel that read its producer's output before it was written would have read the last replay's, of the opposite
    sign."""
    from optimum_amdx.kernels.rmsnorm import rms_norm
    from optimum_amdx.kernels.runtime import device_arch
    from optimum_amdx.kernels.w4a16 import accumulating_route, accumulator, dispatch_route, w4a16_accumulate

    k = 4096
    layers = []
    for seed, act_order in ((1, False), (2, False), (3, True)):
        qweight, qzeros, scales, g_idx, dense = quantize(k, k, 4, 128, True, act_order, "gptq", seed=seed)
        w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=128)
        layers.append((w, dense.cuda()))
    norm_w = torch.ones(k, dtype=torch.float16, device="cuda")
    for m in (2, 16, 64):
        if device_arch().startswith("sm_"):
            assert dispatch_route(m, layers[0][0], torch.float16, device_arch()) == "pipelined"
        x0 = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).half().cuda()
        sign = torch.ones(1, dtype=torch.float16, device="cuda")

        def chain() -> torch.Tensor:
            h = x0 * sign
            for i, (w, _) in enumerate(layers):
                route = accumulating_route(h, w) if i == 0 else None  # the first one accumulated where a route takes it
                if route is not None:
                    acc = w4a16_accumulate(h, w, accumulator(h.device, k, m), route)
                    h = rms_norm(acc, norm_w, 1e-6, residual=h, accumulated=True)[0]
                else:
                    h = rms_norm(w4a16_matmul(h, w), norm_w, 1e-6, residual=h)[0]
            return h

        def reference(s: float) -> torch.Tensor:
            h = x0.float() * s
            for _, dense in layers:
                h = h @ dense + h
                h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
            return h

        chain()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = chain()
        for rep in range(4):
            s = -1.0 if rep % 2 else 1.0
            sign.fill_(s)
            graph.replay()
            torch.cuda.synchronize()
            err = (out.float() - reference(s)).abs().max().item()
            assert err < 0.05, (m, rep, err)
