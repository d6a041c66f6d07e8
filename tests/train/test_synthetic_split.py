"""ensure_synthetic: a finished split is reused only when its marker matches the config's rows and seed."""

from __future__ import annotations

import pyarrow.parquet as pq

from features import load_schema
from tests.train.conftest import DEMO_CONFIG
from train.config import load_run_config
from train.data import DONE_MARKER, ensure_synthetic


def _rows(folder) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted(folder.glob("*.parquet")))


def test_a_split_written_for_other_rows_or_seed_is_written_again(tmp_path):
    def cfg(rows: int, seed: int = 0):
        return load_run_config(DEMO_CONFIG, [
            f"--data.train_url={tmp_path / 'train'}", f"--data.eval_url={tmp_path / 'eval'}",
            f"--data.synth.train_rows={rows}", "--data.synth.eval_rows=16", "--data.synth.files=1",
            f"--data.synth.seed={seed}"])

    schema = load_schema(cfg(40).schema_path())
    logs: list[str] = []
    ensure_synthetic(cfg(40), schema, log=logs.append)
    assert _rows(tmp_path / "train") == 40 and len(logs) == 2  # both splits written
    first = (tmp_path / "train" / DONE_MARKER).stat().st_mtime_ns

    logs.clear()
    ensure_synthetic(cfg(40), schema, log=logs.append)
    assert logs == [] and (tmp_path / "train" / DONE_MARKER).stat().st_mtime_ns == first  # reused as is

    ensure_synthetic(cfg(64), schema, log=logs.append)
    assert _rows(tmp_path / "train") == 64
    assert any("rows=40 seed=0" in m and "rows=64 seed=0" in m for m in logs)
    assert _rows(tmp_path / "eval") == 16  # the held-out split still matched: kept

    logs.clear()
    ensure_synthetic(cfg(64, seed=3), schema, log=logs.append)
    assert (tmp_path / "train" / DONE_MARKER).read_text().strip() == "rows=64 seed=3"
    assert any("seed=3" in m for m in logs)
