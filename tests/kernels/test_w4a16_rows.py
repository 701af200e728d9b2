"""The few-row W4A16 kernel (NVIDIA PTX, 2..8 rows of fp16): route choice, PTX that assembles, and
on a GPU every group layout, zero mode, act-order, ragged K/N, row count and split of the tile
stream against the exact float32 result.

On the CPU the kernel cannot run (inline PTX); it is compiled for sm_90 instead (Triton's bundled
ptxas), so a malformed asm string or constraint list fails here, not on the first GPU call.
"""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.kernels.w4a16 import prepare_gptq_weight, w4a16_matmul

from .test_w4a16 import DEVICE, quantize
from .test_w4a16_stream import PACKED_CASES


def _weight(group: int, act_order: bool = False, sym: bool = True):
    qweight, qzeros, scales, g_idx, _ = quantize(256, 128, 4, group, sym, act_order, "gptq", seed=1)
    return prepare_gptq_weight(qweight, qzeros, scales, g_idx, bits=4, group_size=group)


def test_rows_route_only_for_fp16_on_nvidia_with_at_most_four_groups_per_tile():
    from optimum_amdx.kernels._w4a16_rows_ptx import rows_eligible

    w128, w16 = _weight(128), _weight(16)
    assert rows_eligible("sm_90", torch.float16, w128)
    assert not rows_eligible("gfx942", torch.float16, w128)
    assert not rows_eligible("cpu", torch.float16, w128)
    assert not rows_eligible("sm_90", torch.bfloat16, w128)
    assert not rows_eligible("sm_90", torch.float16, w16)  # 8 groups per 128 rows


def test_rows_matmul_rejects_a_row_count_it_does_not_serve():
    from optimum_amdx.kernels._w4a16_rows_ptx import ROWS_MAX, rows_matmul

    w = _weight(128)
    for m in (0, ROWS_MAX + 1):
        x = torch.zeros(m, 256, dtype=torch.float16)
        with pytest.raises(ValueError, match="1 to"):
            rows_matmul(x, w, None, torch.empty(m, 128, dtype=torch.float16), "sm_90")


_ASSEMBLE = """
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from optimum_amdx.kernels import _w4a16_rows_ptx as kr

sig = {"x_ptr": "*fp16", "qw_ptr": "*i32", "s_ptr": "*fp16", "z_ptr": "*fp16", "bias_ptr": "*fp16",
       "out_ptr": "*fp16", "ws_ptr": "*fp32", "cnt_ptr": "*i32", "xp_ptr": "*i32", "N": "i32", "K": "i32",
       "KT": "i32", "NB": "i32", "stride_xm": "i32", "stride_om": "i32", "n_units": "i32"}
for rows, chunks, zeros, xprep in ((1, 1, False, False), (4, 2, True, False), (3, 4, True, True)):
    cons = {"ROWS": rows, "GROUP_SIZE": 128 // chunks, "CHUNKS": chunks, "BLOCK_N": 128, "HAS_ZEROS": zeros,
            "HAS_BIAS": True, "EVEN_K": not xprep, "XPREP": xprep}
    s = dict(sig, **{name: "constexpr" for name in cons})
    c = triton.compile(ASTSource(fn=kr._w4a16_rows_kernel, signature=s, constexprs=cons),
                       target=GPUTarget("cuda", 90, 32), options={"num_warps": 8, "num_stages": 1})
    assert len(c.asm["cubin"]) > 0
    # the dequantization runs once per word, not once per row
    print(rows, c.asm["ptx"].count("lop3.b32 "), flush=True)
"""


def sm90_build_stdout(script: str, timeout: int = 900) -> str:
    """Stdout of `script` run in a fresh process with the interpreter off (under it `@triton.jit` gives
    interpreter functions), where it compiles kernels for sm_90 with Triton's bundled ptxas; skips the
    test when this Triton build ships no ptxas, fails it with the script's stderr otherwise."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr.lower():
        pytest.skip("this Triton build ships no ptxas")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_rows_kernel_assembles_for_sm90():
    """Triton's bundled ptxas assembles the inline PTX for sm_90 (compiled in a fresh process)."""
    out = sm90_build_stdout(_ASSEMBLE, timeout=600)
    counts = dict(tuple(map(int, line.split())) for line in out.split("\n") if line.strip())
    # the LOP3s of the dequantization (4 per word, in the PTX once per word a thread holds) and the
    # flush's few: not multiplied by the rows (a per-row dequantization would make 4 rows ~4x 1 row)
    assert counts[4] < 1.5 * counts[1], counts


ROWS_CASES = [case for case in PACKED_CASES if case[2] != 16]
"""The one-row packed loop's cases less group 16 (eight groups per tile: the few-row kernel refuses it)."""


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the few-row kernel is inline PTX)")
@pytest.mark.parametrize("k,n,group,sym,act_order,fmt", ROWS_CASES)
@pytest.mark.parametrize("m", [1, 2, 3, 4])
@pytest.mark.parametrize("cfg", [None, {"num_warps": 8, "programs": 3}])
def test_rows_kernel_matches_exact(k, n, group, sym, act_order, fmt, m, cfg):
    qweight, qzeros, scales, g_idx, expected = quantize(k, n, 4, group, sym, act_order, fmt, seed=k + n + group)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=group,
                            checkpoint_format=fmt)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(k + m)).half().cuda()
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).half().cuda()
    config = None if cfg is None else dict({"programs_per_cu": 8}, **cfg)
    for _ in range(2):  # the second call checks that the split-K workspace and tickets were left clean
        out = w4a16_matmul(x, w, bias, route="rows", config=config)
        exact = x.double() @ expected.double().cuda() + bias.double()
        scale = exact.abs().max().item()
        # fp16 products and short fp16 sums, as the one-row packed loop
        assert (out.double() - exact).abs().max().item() <= 4e-3 * scale


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_dispatcher_takes_the_rows_kernel_for_few_fp16_rows_at_full_size():
    from unittest import mock

    from optimum_amdx.kernels import _w4a16_rows_ptx as kr
    from optimum_amdx.kernels.runtime import arch_family, device_arch
    from optimum_amdx.kernels.w4a16 import ROUTE_LIMITS

    qweight, qzeros, scales, g_idx, expected = quantize(4096, 1024, 4, 128, False, True, "gptq", seed=7)
    w = prepare_gptq_weight(*(t.cuda() for t in (qweight, qzeros, scales, g_idx)), bits=4, group_size=128)
    stream_max, rows_max = ROUTE_LIMITS.get(arch_family(device_arch()), ROUTE_LIMITS["default"])[:2]
    assert rows_max > stream_max, "no row count takes the few-row kernel on this GPU"
    for m in range(stream_max, rows_max + 2):
        x = torch.randn(m, 4096, generator=torch.Generator().manual_seed(m)).half().cuda()
        with mock.patch.object(kr, "rows_matmul", wraps=kr.rows_matmul) as spy:
            out = w4a16_matmul(x, w)
        assert spy.called == (stream_max < m <= rows_max), m
        exact = x.double() @ expected.double().cuda()
        assert (out.double() - exact).abs().max().item() <= 4e-3 * exact.abs().max().item()
