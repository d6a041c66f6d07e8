"""The kernels' unmasked interior tiles (below the causal diagonal, inside the history) against the reference.

The interpreter runs 32x32 tiles, so rows longer than 64 have whole KV tiles that every query of a later
tile sees in full (forward and dq loops) and Q tiles that see every key of an earlier KV tile (dk/dv loop).
Row lengths are chosen so tiles end exactly at, just before and just after a row end (63, 64, 65, 96, 97),
and so the last Q tile of a row is partial.
"""

from __future__ import annotations

import pytest
import torch

from tests.kernels.attention_cases import assert_accurate, make_problem

LONG = [97, 64, 1, 65, 130]
SHORTER_Q = [97, 3, 0, 40, 70]  # cross rows: the queries sit at the end of the history (bottom-right)
LONGER_Q = [63, 96, 2, 65, 33]  # more queries than keys in some rows: queries at negative positions

CASES = {
    "causal softmax + pos/time bias": dict(act="softmax", causal=True, bias=True, dtype=torch.float32),
    "non-causal softmax": dict(act="softmax", causal=False, bias=False, dtype=torch.float16),
    "causal softmax, targets": dict(act="softmax", causal=True, bias=True, targets=True, dtype=torch.float32),
    "non-causal silu, targets": dict(act="silu", causal=False, bias=True, targets=True, dtype=torch.float32),
    "causal gelu": dict(act="gelu", causal=True, bias=False, dtype=torch.float16),
}


@pytest.mark.parametrize("name", list(CASES))
def test_long_rows_match_reference(name):
    c = CASES[name]
    p = make_problem(seed=len(name), lq=LONG, lk=LONG, heads=1, bias=c["bias"], targets=c.get("targets", False))
    assert_accurate(p, c["dtype"], activation=c["act"], causal=c["causal"])


@pytest.mark.parametrize("lq", [SHORTER_Q, LONGER_Q], ids=["shorter-q", "longer-q"])
def test_unequal_lengths_match_reference(lq):
    p = make_problem(seed=5, lq=lq, lk=LONG, heads=2, bias=True)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


def test_padded_head_dim_on_the_unmasked_path():
    # D=24 pads to 32 columns: the unmasked loads still mask the columns.
    p = make_problem(seed=6, lq=[70, 5], lk=[70, 5], heads=1, dim=24, bias=False)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)
