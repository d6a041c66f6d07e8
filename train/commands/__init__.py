"""One module per command group of the `gemtrain` CLI (see train/cli.py)."""
