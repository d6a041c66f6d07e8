"""The attention kernels' work list (one (row, tile) pair per program) built in one Triton launch.

``attention_op.work_list`` defines the list; built from torch ops it takes about 25 small launches, whose
host time dominates short batches. This kernel computes the same list in one program: the rows are
sorted by one packed int64 key (other side's length, own length, row index for stability), their tile
counts are summed in sorted order, and each list entry finds its row by binary search over those sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import triton_launch

MAX_ROWS = 4096  # one program sorts every row; larger batches take the torch path
_FIELD = 20  # bits of each packed field: lengths and row indices below 2**20
CHUNK = 1024  # list entries written per loop step


def fits(num_rows: int, tokens: int) -> bool:
    """Whether the one-program builder applies: few enough rows, row lengths (at most ``tokens``, the
    tiled side's total) that fit the packed key."""
    return 0 < num_rows <= MAX_ROWS and tokens < (1 << _FIELD)


@triton.jit
def owner(SUMS, t, n, BIG: tl.constexpr, ROWS: tl.constexpr, LOG_ROWS: tl.constexpr):
    """For each list entry ``t``: the number of rows whose running count ``SUMS[i]`` (inclusive, ``i < n``) is
    <= t, which is the row that owns entry t. Binary search; ``ROWS`` is a power of two >= ``n``, ``BIG`` exceeds
    every count."""
    pos = tl.zeros(t.shape, dtype=tl.int32)
    for s in tl.static_range(LOG_ROWS + 1):
        probe = pos + (ROWS >> s)
        val = tl.load(SUMS + probe - 1, mask=probe <= n, other=BIG)
        pos = tl.where(val <= t, probe, pos)
    return pos


@triton.jit
def _work_list_kernel(TILE_OFF, OTHER_OFF, SCRATCH, WORK, num_rows, n_items,
                      BLOCK: tl.constexpr, ROWS: tl.constexpr, LOG_ROWS: tl.constexpr, CHUNK: tl.constexpr,
                      FIELD: tl.constexpr):
    r = tl.arange(0, ROWS)
    ok = r < num_rows
    lens = (tl.load(TILE_OFF + r + 1, mask=ok, other=0) - tl.load(TILE_OFF + r, mask=ok, other=0)).to(tl.int64)
    other = (tl.load(OTHER_OFF + r + 1, mask=ok, other=0) - tl.load(OTHER_OFF + r, mask=ok, other=0)).to(tl.int64)
    mask_f = (1 << FIELD) - 1
    other = tl.minimum(other, mask_f)  # beyond 2**20 the order of equally long rows may differ (harmless)
    # Descending sort on (other, lens, -row): longest other side first, then longest own side, ties in
    # row order (a stable descending argsort). Unused slots get -1 and sort last.
    key = (((other << FIELD) | lens) << FIELD) | (ROWS - 1 - r).to(tl.int64)
    key = tl.where(ok, key, -1)
    key = tl.sort(key, descending=True)
    real = key >= 0
    perm = (ROWS - 1) - (key & mask_f)
    tiles = tl.where(real, (((key >> FIELD) & mask_f) + BLOCK - 1) // BLOCK, 0)
    cum = tl.cumsum(tiles, axis=0)
    tl.store(SCRATCH + r, cum)
    tl.store(SCRATCH + ROWS + r, perm)
    tl.store(SCRATCH + 2 * ROWS + r, tiles)
    tl.debug_barrier()  # the sums written above are read back by other threads of this program
    for start in range(0, n_items, CHUNK):
        t = start + tl.arange(0, CHUNK)
        pos = owner(SCRATCH, t, ROWS, 1 << 62, ROWS, LOG_ROWS)  # the sorted row that owns entry t
        valid = pos < num_rows
        at = tl.minimum(pos, ROWS - 1)
        own = tl.load(SCRATCH + 2 * ROWS + at)
        first = tl.load(SCRATCH + at) - own
        row = tl.where(valid, tl.load(SCRATCH + ROWS + at), -1)
        tile = tl.where(valid, own - 1 - (t - first), 0)  # a row's last tile first
        in_list = t < n_items
        tl.store(WORK + 2 * t, row.to(tl.int32), mask=in_list)
        tl.store(WORK + 2 * t + 1, tile.to(tl.int32), mask=in_list)


def work_list_triton(tile_offsets: torch.Tensor, other_offsets: torch.Tensor, block: int, n_items: int) -> torch.Tensor:
    """``[n_items, 2]`` int32 list, equal to ``attention_op.work_list``'s (needs ``fits``)."""
    num_rows = tile_offsets.numel() - 1
    rows = max(16, triton.next_power_of_2(num_rows))
    # One allocation for the scratch and the list (each allocation costs host time in short calls).
    buffer = torch.empty(3 * rows + n_items, dtype=torch.int64, device=tile_offsets.device)
    scratch, work = buffer[:3 * rows], buffer[3 * rows:].view(torch.int32).view(n_items, 2)
    triton_launch.run(_work_list_kernel, (1,), tile_offsets, other_offsets, scratch, work, num_rows, n_items,
                      BLOCK=block, ROWS=rows, LOG_ROWS=rows.bit_length() - 1, CHUNK=CHUNK, FIELD=_FIELD, num_warps=4)
    return work
