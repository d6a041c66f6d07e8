"""The GEM model as plain nn.Modules (parallelism is applied from outside, in model/parallelize.py)."""
