"""Streaming ingest: Parquet on any fsspec URL -> JaggedBatch, exactly once, resumable."""
