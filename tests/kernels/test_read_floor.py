"""The read-floor instrument (`benchmark.read_floor`): its kernel reads every word of its runs exactly once.

A read kernel that skipped words (a wrong mask, a block left out of the run) would time fewer bytes than it claims
and overstate the floor, so its XOR per run is checked against NumPy, including a ragged last run."""

import numpy as np
import pytest
import torch

from optimum_amdx.benchmark.read_floor import CHUNK_WORDS, read_floor_ms, read_words
from optimum_amdx.kernels.runtime import device_arch, pdl_enabled

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("chunk", [512, 4096])
@pytest.mark.parametrize("n", [4096, 4096 * 3 + 517])
def test_each_program_xors_exactly_its_run(chunk, n):
    gen = torch.Generator().manual_seed(n + chunk)
    src = torch.randint(-(2**31), 2**31 - 1, (n,), dtype=torch.int32, generator=gen)
    got = read_words(src.to(DEVICE), chunk).cpu().numpy()
    words = src.numpy()
    want = [np.bitwise_xor.reduce(words[i:i + chunk]) for i in range(0, n, chunk)]
    np.testing.assert_array_equal(got, np.array(want, dtype=np.int32))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_read_floor_times_every_program_size():
    r = read_floor_ms(8 << 20)
    assert set(r["by_form"]) == {str(c) for c in CHUNK_WORDS} and r["ms"] == min(r["by_form"].values()) > 0
    if pdl_enabled(device_arch()):
        r = read_floor_ms(8 << 20, pdl=True)
        assert len(r["by_form"]) == 2 * len(CHUNK_WORDS) and r["ms"] == min(r["by_form"].values()) > 0
