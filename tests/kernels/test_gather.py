"""`gather_rows` (token embedding, the pick of sampled rows) against torch's index_select."""

from __future__ import annotations

import pytest
import torch

from optimum_amdx.errors import InvalidArgumentError
from optimum_amdx.kernels.gather import gather_rows

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("rows,width,picks", [(50, 4096, 16), (7, 1000, 3), (300, 2080, 1)])
def test_gather_rows_matches_index_select(dtype, index_dtype, rows, width, picks):
    g = torch.Generator().manual_seed(rows + width)
    table = torch.randn(rows, width, generator=g).to(dtype).to(DEVICE)
    index = torch.randint(0, rows, (picks,), generator=g).to(index_dtype).to(DEVICE)
    out = gather_rows(table, index)
    assert out.dtype == dtype and out.shape == (picks, width) and out.is_contiguous()
    assert torch.equal(out.cpu(), table.cpu().index_select(0, index.cpu().long()))


def test_gather_rows_repeats_and_strided_tables():
    """A row picked twice comes out twice; a table whose rows are a column slice of a wider one (row stride above
    its width) reads its own columns only; the last row of the table is reachable; a strided index reads its own
    elements."""
    wide = torch.arange(6 * 3000, dtype=torch.float32).reshape(6, 3000).half().to(DEVICE)
    table = wide[:, :1500]
    index = torch.tensor([5, 0, 5, 2], device=DEVICE)
    assert torch.equal(gather_rows(table, index).cpu(), table.cpu()[[5, 0, 5, 2]])
    every_other = torch.tensor([3, 9, 1, 9, 4], device=DEVICE)[::2]  # a strided index view: 3, 1, 4
    assert torch.equal(gather_rows(table, every_other).cpu(), table.cpu()[[3, 1, 4]])


def test_gather_rows_rejects_bad_arguments():
    table = torch.zeros(4, 8, device=DEVICE)
    with pytest.raises(InvalidArgumentError, match="2-D table"):
        gather_rows(table[0], torch.tensor([0], device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="int32/int64 index"):
        gather_rows(table, torch.tensor([0.0], device=DEVICE))
    with pytest.raises(InvalidArgumentError, match="int32/int64 index"):
        gather_rows(table, torch.zeros(1, 1, dtype=torch.long, device=DEVICE))
    assert gather_rows(table, torch.zeros(0, dtype=torch.long, device=DEVICE)).shape == (0, 8)
