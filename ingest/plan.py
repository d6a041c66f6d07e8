"""The epoch plan: which rows each rank reads, in which order, and what is left after a cursor.

Rows are addressed as (work unit, row) where a work unit is one Parquet row group. An epoch is a
list of pieces `(unit, start, stop)` in a global order (fresh epoch: every unit, shuffled by
(seed, epoch)). The global row stream is the concatenation of the pieces; rank `r` of `W` reads
stream positions `[r*R, (r+1)*R)`:

- `remainder="drop"`: `R = N // W`, the last `N % W` rows of the shuffled order are dropped (counted);
- `remainder="pad_with_repeat"`: `R = ceil(N / W)`, positions past `N` wrap to the start (repeats, counted).

Each rank's stream is cut into windows of `window_rows` rows; a window is the bounded row shuffle
buffer: its rows are emitted in a permutation seeded by (seed, epoch, generation, rank, window).
Nothing here depends on the number of reader threads.

A plan made from the rows that remain after a saved cursor (possibly at another world size) has
`generation + 1`; `remaining_pieces` computes those rows from every old rank's consumed positions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

REMAINDER_POLICIES = ("drop", "pad_with_repeat")


@dataclass(frozen=True)
class ReadSlice:
    """Rows `[start, stop)` of a work unit, landing at `stream_pos` of the rank's stream."""

    unit: int
    start: int
    stop: int
    stream_pos: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def fresh_pieces(unit_rows: list[int], *, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    order = np.arange(len(unit_rows), dtype=np.int64)
    if shuffle:
        order = np.random.default_rng([seed, epoch, 0x5EED]).permutation(order)
    rows = np.asarray(unit_rows, dtype=np.int64)[order] if len(unit_rows) else np.zeros(0, np.int64)
    keep = rows > 0
    return np.stack([order[keep], np.zeros(int(keep.sum()), np.int64), rows[keep]], axis=1).reshape(-1, 3)


class EpochPlan:
    def __init__(self, pieces: np.ndarray, *, world_size: int, remainder: str, window_rows: int,
                 shuffle: bool, seed: int, epoch: int, generation: int = 0):
        self.pieces = np.asarray(pieces, dtype=np.int64).reshape(-1, 3)
        self.world_size, self.remainder, self.window_rows = world_size, remainder, max(1, window_rows)
        self.shuffle, self.seed, self.epoch, self.generation = shuffle, seed, epoch, generation
        lengths = self.pieces[:, 2] - self.pieces[:, 1]
        self._cum = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        self.total = int(self._cum[-1])
        if remainder == "drop":
            self.per_rank = self.total // world_size
        else:
            self.per_rank = -(-self.total // world_size)
        self.dropped = max(0, self.total - self.per_rank * world_size)
        self.repeated = max(0, self.per_rank * world_size - self.total)

    # ---- windows ---------------------------------------------------------------------------
    @property
    def num_windows(self) -> int:
        return -(-self.per_rank // self.window_rows)

    def window_len(self, w: int) -> int:
        return max(0, min(self.window_rows, self.per_rank - w * self.window_rows))

    def window_perm(self, rank: int, w: int) -> np.ndarray:
        n = self.window_len(w)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        rng = np.random.default_rng([self.seed, self.epoch, self.generation, rank, w, 0x5F1])
        return rng.permutation(n).astype(np.int64)

    # ---- positions -------------------------------------------------------------------------
    def _global(self, rank: int, stream_pos: np.ndarray) -> np.ndarray:
        g = rank * self.per_rank + np.asarray(stream_pos, dtype=np.int64)
        return g % self.total if self.total else g

    def is_repeat(self, rank: int, stream_pos: np.ndarray) -> np.ndarray:
        return rank * self.per_rank + np.asarray(stream_pos, dtype=np.int64) >= self.total

    def rows_at(self, rank: int, stream_pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(unit, row) of stream positions of a rank."""
        g = self._global(rank, stream_pos)
        i = np.searchsorted(self._cum, g, side="right") - 1
        return self.pieces[i, 0], self.pieces[i, 1] + (g - self._cum[i])

    def slices(self, rank: int, from_pos: int = 0) -> list[ReadSlice]:
        """The reads covering stream positions `[from_pos, per_rank)` of a rank, in stream order."""
        out: list[ReadSlice] = []
        pos = from_pos
        while pos < self.per_rank and self.total:
            g = int(self._global(rank, np.array(pos)))
            run_end = min(self.per_rank - pos, self.total - g)  # stop at the wrap point
            end = g + run_end
            i = int(np.searchsorted(self._cum, g, side="right") - 1)
            while g < end:
                unit, start, stop = (int(v) for v in self.pieces[i])
                off = g - int(self._cum[i])
                n = min(stop - start - off, end - g)
                out.append(ReadSlice(unit, start + off, start + off + n, pos))
                pos, g, i = pos + n, g + n, i + 1
        return out

    # ---- what is left ----------------------------------------------------------------------
    def remaining_pieces(self, consumed: dict[int, tuple[int, np.ndarray]]) -> np.ndarray:
        """Pieces of the rows no rank has consumed yet, in rank order.

        `consumed[rank] = (window, local)`: windows before `window` are done, and of window `window`
        the window-local positions `local` are done. Repeats (padding) are never remaining.
        """
        parts = []
        for rank in range(self.world_size):
            w, local = consumed.get(rank, (0, np.zeros(0, np.int64)))
            start = w * self.window_rows
            pos = np.arange(start, self.per_rank, dtype=np.int64)
            if len(local):
                mask = np.ones(len(pos), dtype=bool)
                local = np.asarray(local, dtype=np.int64)
                mask[local[local < len(pos)]] = False
                pos = pos[mask]
            pos = pos[~self.is_repeat(rank, pos)]
            if len(pos):
                parts.append(self._runs(rank, pos))
        return np.concatenate(parts) if parts else np.zeros((0, 3), np.int64)

    def _runs(self, rank: int, pos: np.ndarray) -> np.ndarray:
        g = self._global(rank, pos)
        piece = np.searchsorted(self._cum, g, side="right") - 1
        unit, row = self.rows_at(rank, pos)
        brk = np.ones(len(pos), dtype=bool)
        brk[1:] = (np.diff(g) != 1) | (np.diff(piece) != 0)
        starts = np.flatnonzero(brk)
        ends = np.append(starts[1:], len(pos))
        return np.stack([unit[starts], row[starts], row[ends - 1] + 1], axis=1)
