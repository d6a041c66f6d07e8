"""The GEM model as plain nn.Modules (parallelism is applied from outside, in model/parallelize.py)."""

from model.config import ModelConfig, ModelConfigError
from model.gem import GEMModel, ModelOutput, build_model, iter_precision_blocks
from model.losses import multitask_loss
from model.moe import MoE

__all__ = [
    "GEMModel",
    "MoE",
    "ModelConfig",
    "ModelConfigError",
    "ModelOutput",
    "build_model",
    "iter_precision_blocks",
    "multitask_loss",
]
