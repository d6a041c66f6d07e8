"""Shared pytest fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCHEMAS = REPO / "schemas"
os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def demo_schema():
    from features import load_schema

    return load_schema(SCHEMAS / "demo.yaml")
