"""Bias tables and their gradients on every path the kernels take, against the float64 reference.

The interpreter runs 32x32 tiles. Per tile and table the kernels find the span of buckets the tile's
pairs fall in (``bucket_span``) and take one of four paths: one bucket (one value, one reduced sum);
a narrow span (thresholds: one compare per score, one masked sum per threshold); a wide position span
(sums by diagonal); a wide time span (bucket by bucket in the loops near the diagonal, one atomic per
score in the long loop). Each case below is built to reach given paths; ``spans`` checks that it does.
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from kernels.attention_spec import pos_bucket, time_bucket
from kernels.attention_triton_bias import diagonal_grad
from tests.kernels.attention_cases import assert_accurate, make_problem

TILE = 32  # the interpreter's tiles
ROWS = [130, 70]


def spans(lengths: list[int], ts: torch.Tensor, num_pos: int, num_time: int, causal: bool = True) -> set[str]:
    """Paths the (query tile, key tile) pairs of self-attention rows reach: 'pos one/narrow/wide',
    'time one/narrow/wide' (exact spans over visible pairs; the kernels' spans may only be wider)."""
    seen, start = set(), 0
    for n in lengths:
        i = torch.arange(n)
        vis = (i[:, None] >= i[None, :]) if causal else torch.ones(n, n, dtype=torch.bool)
        pb = pos_bucket(i[:, None] - i[None, :], num_pos)
        t = ts[start:start + n]
        tb = time_bucket(t[:, None] - t[None, :], num_time)
        for a in range(0, n, TILE):
            for b in range(0, n, TILE):
                v = vis[a:a + TILE, b:b + TILE]
                if not v.any():
                    continue
                for name, bk, narrow in (("pos", pb, 2), ("time", tb, 4)):
                    x = bk[a:a + TILE, b:b + TILE][v]
                    width = int(x.max() - x.min()) + 1
                    seen.add(f"{name} {'one' if width == 1 else 'narrow' if width <= narrow else 'wide'}")
        start += n
    return seen


def _problem(seed: int, num_pos: int, num_time: int, ts: torch.Tensor, heads: int = 1):
    p = make_problem(seed=seed, lq=ROWS, lk=ROWS, heads=heads, bias=True)
    g = torch.Generator().manual_seed(seed + 1)
    p.pos = torch.randn(num_pos, heads, generator=g, dtype=torch.float64)
    p.time = torch.randn(num_time, heads, generator=g, dtype=torch.float64)
    p.q_ts, p.kv_ts = ts, ts
    return p


def _sorted_ts(seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, step, (sum(ROWS),), generator=g).cumsum(0)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "non-causal"])
def test_position_spans_one_narrow_and_wide(causal):
    # 5 buckets (reach 2): a tile one tile past the diagonal spans exactly 2 buckets (thresholds); the
    # diagonal tiles span all 5 (by diagonal); farther tiles one. Time buckets in time order.
    ts = _sorted_ts(0, 6)
    assert {"pos one", "pos narrow", "pos wide"} <= spans(ROWS, ts, 5, 8, causal)
    p = _problem(1, num_pos=5, num_time=8, ts=ts)
    assert_accurate(p, torch.float32, activation="softmax", causal=causal)


def test_wide_position_table_and_silu():
    # 129 buckets (reach 64): tiles up to two tiles off the diagonal span dozens of buckets.
    ts = _sorted_ts(2, 6)
    assert "pos wide" in spans(ROWS, ts, 129, 8)
    p = _problem(3, num_pos=129, num_time=8, ts=ts, heads=2)
    assert_accurate(p, torch.float32, activation="silu", causal=True)


def test_time_spans_in_time_order():
    # Steps of 0..5 s with 8 log buckets: near the diagonal a tile spans most buckets (bucket by bucket,
    # in the near loops), two tiles away two or three (thresholds), far away one.
    ts = _sorted_ts(4, 6)
    assert {"time one", "time narrow", "time wide"} <= spans(ROWS, ts, 11, 8)
    p = _problem(5, num_pos=11, num_time=8, ts=ts)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


def test_time_out_of_order_takes_atomics_in_the_long_loop():
    # Unordered timestamps: wide time spans on every tile, also far from the diagonal.
    g = torch.Generator().manual_seed(6)
    ts = torch.randint(0, 10**6, (sum(ROWS),), generator=g)
    p = _problem(7, num_pos=11, num_time=32, ts=ts)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


def test_time_thresholds_at_float32_rounding():
    # Each row: early events at 0..2 s, later ones around 2**25 (row 0) or 2**26 (row 1) s, so tiles of
    # late queries over early keys have |dt| + 1 within a few seconds of where float32 rounds up to the
    # next power of two (2**25 - 1 -> 2**25; 2**26 - 2 -> 2**26): two buckets, decided by thresholds.
    g = torch.Generator().manual_seed(8)
    parts = []
    for n, late, split in ((ROWS[0], 2**25 - 1, 64), (ROWS[1], 2**26 - 2, 32)):
        t = torch.randint(0, 3, (n,), generator=g)
        t[split:] = late + torch.randint(-3, 3, (n - split,), generator=g)
        parts.append(t)
    ts = torch.cat(parts)
    assert "time narrow" in spans(ROWS, ts, 11, 32, causal=False)
    p = _problem(9, num_pos=11, num_time=32, ts=ts)
    assert_accurate(p, torch.float32, activation="softmax", causal=False)


def test_timestamps_beyond_int32_take_the_int64_path():
    # Steps of up to 2**28 s: a tile's timestamps spread past 2**30, so its offsets do not fit in int32.
    ts = _sorted_ts(10, 2**28)
    p = _problem(11, num_pos=11, num_time=40, ts=ts)
    assert_accurate(p, torch.float32, activation="softmax", causal=True)


@triton.jit
def _diagonal_kernel(DS, OUT, base, NUM: tl.constexpr, PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr):
    a = tl.arange(0, BLOCK_M)[:, None]
    n = tl.arange(0, BLOCK_N)[None, :]
    acc = diagonal_grad(tl.zeros([PAD], dtype=tl.float32), tl.load(DS + a * BLOCK_N + n), base, NUM, PAD, BLOCK_M,
                        BLOCK_N)
    tl.store(OUT + tl.arange(0, PAD), acc)


@pytest.mark.parametrize("block_m,block_n", [(16, 64), (64, 16)])
@pytest.mark.parametrize("num", [1, 2, 5, 129])
def test_diagonal_sums_match_per_score_buckets(block_m, block_n, num):
    # Tiles of other shapes than the interpreter's 32x32 (the GPU also runs 32x128 tiles; 32x32 is covered
    # above) and bases below, across and above the table's reach, against the bucket of every score.
    g = torch.Generator().manual_seed(block_m + num)
    pad = triton.next_power_of_2(num)
    for base in (-200, -3, 0, 40, 130):
        ds = torch.randn(block_m, block_n, generator=g, dtype=torch.float32)
        out = torch.zeros(pad, dtype=torch.float32)
        _diagonal_kernel[(1,)](ds, out, base, num, pad, block_m, block_n)
        rel = base + torch.arange(block_m)[:, None] - torch.arange(block_n)[None, :]
        want = torch.zeros(pad, dtype=torch.float64).index_add_(0, pos_bucket(rel, num).flatten(),
                                                                 ds.double().flatten())
        torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-4)
