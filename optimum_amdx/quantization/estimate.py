"""How long a GPTQ run will take, before it starts, so a slow CPU run is announced with its cheaper options.

The cost is counted in floating-point operations and divided by a matmul rate measured here in a few
milliseconds. Per decoder block: the calibration tokens pass through the block about 3 times (true-
sequential steps stop early after the step's last linear, plus the final pass producing the next
block's inputs), each linear's input Hessian costs 2 * tokens * in^2 (an upper bound: q/k/v and
gate/up share one), and each linear is solved once (about in^3 / 3 for the Cholesky work plus
2 * out * in^2 for the updates). For SmolLM2-135M with 128 x 2048 tokens this counts 3.1e14 FLOP; the
reported 1.5 h on a 2-core CPU is 58 GFLOP/s, a plausible fp32 matmul rate for such a machine.
The rest of the work (small ops, Python) runs below the measured matmul rate: on a loaded 2-core
machine, tiny Llamas (hidden 256/512) took 2-4x the raw FLOP estimate, so the estimate assumes half
the measured rate. It is an order of magnitude, said as "about".
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn

CPU_DEFAULT_SAMPLES = 32
CPU_DEFAULT_SEQLEN = 512
"""Calibration size the CLI uses on a CPU when --samples/--seqlen are not given (GPU default: 128 x 2048)."""

_PASSES = 3.0
_EFFICIENCY = 0.5
"""Fraction of the measured matmul rate the whole run reaches (see the module docstring)."""
_FASTEST_CPU = 5e12
"""FLOP/s no CPU reaches in fp32 today: a run estimated quick at this rate is quick everywhere."""


def gptq_flops(model: nn.Module, n_samples: int, seqlen: int) -> float:
    """Floating-point operations of a GPTQ run over `n_samples` x `seqlen` calibration tokens."""
    from .model_utils import block_linears, decoder_layers

    prefix, layers = decoder_layers(model)
    tokens = float(n_samples * seqlen)
    cfg = model.config
    hidden = float(getattr(cfg, "hidden_size", 0) or 0)
    total = 0.0
    for i, layer in enumerate(layers):
        linears = block_linears(layer, f"{prefix}.{i}", [])
        params = float(sum(lin.in_features * lin.out_features for lin in linears.values()))
        attention = 4.0 * n_samples * seqlen * seqlen * hidden  # QK^T and PV, causal half counted twice
        total += _PASSES * (2.0 * tokens * params + attention)
        for lin in linears.values():  # Hessian (counted per linear: an upper bound where inputs are shared) + solve
            total += 2.0 * tokens * lin.in_features ** 2
            total += 2.0 * lin.out_features * lin.in_features ** 2 + lin.in_features ** 3 / 3.0
    return total


def matmul_rate(device: torch.device | str = "cpu", size: int = 384, seconds: float = 0.05) -> float:
    """Measured fp32 matmul rate in FLOP/s on `device` (a short burst, median of a few runs)."""
    device = torch.device(device)
    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    times = []
    deadline = time.perf_counter() + seconds
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ b
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    times.sort()
    return 2.0 * size ** 3 / max(times[len(times) // 2], 1e-9)


def estimate_seconds(model: nn.Module, n_samples: int, seqlen: int, device: torch.device | str = "cpu",
                     rate: float | None = None) -> float:
    """Estimated wall time of GPTQ on `device` (about; the measured rate varies with machine load)."""
    return gptq_flops(model, n_samples, seqlen) / (_EFFICIENCY * (rate or matmul_rate(device)))


def describe(seconds: float) -> str:
    """'45 s', '12 min', '1.5 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def cpu_cost_warning(model: Any, n_samples: int, seqlen: int, threshold_s: float = 600.0) -> str | None:
    """A warning naming the expected time and a cheaper setting when CPU GPTQ would take over `threshold_s`."""
    flops = gptq_flops(model, n_samples, seqlen)
    if flops / _FASTEST_CPU < threshold_s:  # quick even on the fastest CPU: no need to measure this one
        return None
    rate = matmul_rate("cpu")
    seconds = flops / (_EFFICIENCY * rate)
    if seconds < threshold_s:
        return None
    cheap_samples, cheap_seqlen = min(n_samples, CPU_DEFAULT_SAMPLES), min(seqlen, CPU_DEFAULT_SEQLEN)
    cheap = estimate_seconds(model, cheap_samples, cheap_seqlen, "cpu", rate)
    return (
        f"GPTQ on the CPU with {n_samples} calibration samples x {seqlen} tokens will take about "
        f"{describe(seconds)} here. For a quicker run use fewer, shorter samples (CLI: --samples "
        f"{cheap_samples} --seqlen {cheap_seqlen}; Python: GPTQConfig(n_samples={cheap_samples}, "
        f"seqlen={cheap_seqlen})), about {describe(cheap)}, or quantize on a GPU."
    )
