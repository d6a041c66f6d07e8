"""Training: config, trainer, pipeline, checkpoints, metrics, MFU, reports and the CLI."""
