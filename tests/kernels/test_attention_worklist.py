"""The one-launch Triton work-list builder against the torch ops that define the list."""

import pytest
import torch

from kernels.attention_op import work_list
from kernels.attention_worklist import fits, work_list_triton


def _offsets(lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(dtype)


@pytest.mark.parametrize("rows,max_len,cross,dtype", [
    (1, 40, False, torch.int64), (5, 1, True, torch.int32), (33, 200, False, torch.int32),
    (64, 300, True, torch.int64), (300, 90, True, torch.int64),
])
@pytest.mark.parametrize("block", [16, 64, 128])
def test_triton_list_equals_the_reference(rows, max_len, cross, dtype, block):
    g = torch.Generator().manual_seed(rows * 7 + block)
    lq = torch.randint(0, max_len + 1, (rows,), generator=g)
    lq[::4] = 0  # empty rows own no tiles
    lq[-1] = max_len
    lk = torch.randint(0, max_len + 1, (rows,), generator=g) if cross else lq
    lk[1::3] = lk[0]  # ties on the other side: the order must stay stable, as the reference's is
    qo, ko = _offsets(lq, dtype), _offsets(lk, dtype)
    expected, n_items = work_list(qo, ko, block, int(lq.sum()))
    assert fits(rows, int(lq.sum()))
    assert torch.equal(work_list_triton(qo, ko, block, n_items), expected)


def test_all_rows_empty_gives_programs_that_exit():
    qo = torch.zeros(4, dtype=torch.int64)
    got = work_list_triton(qo, qo, 64, 3)
    assert got.tolist() == [[-1, 0]] * 3


def test_batches_beyond_one_program_take_the_torch_path():
    assert not fits(4097, 100) and not fits(8, 1 << 20) and not fits(0, 0)
