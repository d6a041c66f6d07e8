"""The block / window accuracy check of the attention benchmark runs on CPU (interpreter), so it cannot rot."""

import math

import torch

from benchmarks import attention_local


def test_check_self_attention_passes_and_takes_each_op_on_cpu():
    for op, size in (("block", 8), ("window", 5)):
        rows = attention_local.check_self_attention(
            op, [(size, 16, "softmax", True, True, True, (torch.float32,))], [0, 1, 9, 20], [0, 0, 2, 3],
            seed=0, device="cpu")
        assert rows[-1] == f"\n{op.upper()} ALL OK: True", rows
        assert rows[2].endswith("| True | yes |"), rows  # the call took the op and met the accuracy rule


def test_copy_ceiling_is_measured_on_this_device():
    # The "of copy ceiling" columns divide by this rate, so it must be a measured, finite, positive rate
    # (on CPU: a wall-clock clone), not one card's constant.
    gbs = attention_local.copy_ceiling_gbs(nbytes=1 << 20)
    assert math.isfinite(gbs) and gbs > 0
