"""`argmax_rows` (greedy decoding's next token) against torch.argmax: first maximum, ties, -inf, ragged rows."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.argmax import argmax_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("rows,n", [(1, 128256 // 8), (3, 5000), (2, 4096), (4, 77)])
def test_argmax_rows_matches_torch(dtype, rows, n):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n + rows)).to(dtype).to(DEVICE)
    assert torch.equal(argmax_rows(x).cpu(), x.float().argmax(dim=-1).cpu())
    assert argmax_rows(x).dtype == torch.int64


def test_argmax_rows_takes_the_first_of_equal_maxima_across_chunks():
    """Ties go to the lower index, inside a chunk and between chunks (the first chunk of the stage-one grid that
    holds the maximum); rows of -inf give 0, as torch does; a strided row view reads its own values."""
    n = 9000  # three 4096-value chunks, the last ragged
    x = torch.zeros(4, n)
    x[0, [4100, 8200, 5000]] = 3.0  # the maximum in chunks 1 and 2: the first wins
    x[1, [17, 18]] = 2.0  # within one chunk
    x[2] = float("-inf")
    x[3, n - 1] = 1.0  # in the ragged tail
    x = x.half().to(DEVICE)
    assert argmax_rows(x).tolist() == [4100, 17, 0, n - 1]
    wide = torch.zeros(2, 2 * n, dtype=torch.float16, device=DEVICE)
    wide[:, :n] = x[:2]
    assert argmax_rows(wide[:, :n]).tolist() == [4100, 17]


def test_argmax_rows_counts_nan_as_the_maximum():
    x = torch.zeros(1, 5000)
    x[0, 4500] = float("nan")
    x[0, 10] = 7.0
    assert argmax_rows(x.to(DEVICE)).tolist() == [4500]


def test_argmax_rows_rejects_what_it_cannot_rank():
    with pytest.raises(InvalidArgumentError, match="2-D float"):
        argmax_rows(torch.zeros(3, dtype=torch.float32, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="2-D float"):
        argmax_rows(torch.zeros(2, 3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="no values"):
        argmax_rows(torch.zeros(2, 0, device=DEVICE))
