"""Hashing of raw ids into a table's `num_embeddings` buckets (vectorised, deterministic)."""

from __future__ import annotations

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(ids: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser: a fast, well-mixed 64-bit hash of each id."""
    with np.errstate(over="ignore"):
        z = ids.astype(np.int64, copy=False).view(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def hash_ids(ids: np.ndarray, num_embeddings: int) -> np.ndarray:
    """Raw int64 ids (any value, negative too) -> int64 rows in [0, num_embeddings)."""
    return (splitmix64(ids) % np.uint64(num_embeddings)).astype(np.int64)
