"""MFU accounting: FLOP counting, local vs end-to-end MFU and the scaling ratio."""

from __future__ import annotations

import os
import subprocess
import sys

import torch
from torch import nn

from tests.conftest import REPO
from train.mfu import (
    LayerMFU,
    capture_block_inputs,
    count_flops,
    device_peak_flops,
    measure_local,
    mfu_report,
)


class TwoBlocks(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.a = nn.Linear(d, 4 * d)
        self.b = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_count_flops_matches_matmul_formula():
    torch.manual_seed(0)
    m = TwoBlocks(32)
    x = torch.randn(10, 32)
    flops, per_module = count_flops(lambda: m(x))
    expected = 2 * 10 * 32 * 128 * 2  # two linears, 2*m*n*k each
    assert flops == expected
    assert per_module["Global"] == expected


def test_forward_backward_flops_are_three_times_forward():
    m = TwoBlocks(16)
    x = torch.randn(8, 16, requires_grad=True)
    fwd, _ = count_flops(lambda: m(x))
    both, _ = count_flops(lambda: m(x).sum().backward())
    assert both == 3 * fwd


def test_local_measurement_covers_each_block():
    torch.manual_seed(0)
    m = TwoBlocks(16)
    x = torch.randn(8, 16)
    blocks = {"a": m.a, "b": m.b}
    inputs = capture_block_inputs(m, blocks, lambda: m(x))
    assert set(inputs) == {"a", "b"}
    assert inputs["b"][0][0].shape == (8, 64)
    layers = measure_local(blocks, inputs, torch.device("cpu"), warmup=1, repeat=3)
    assert [x.name for x in layers] == ["a", "b"]
    assert all(x.flops == 3 * 2 * 8 * 16 * 64 for x in layers)
    assert all(x.seconds > 0 for x in layers)


def test_report_ratios_with_explicit_peak():
    layers = [LayerMFU("a", flops=100, seconds=1.0), LayerMFU("b", flops=300, seconds=1.0)]
    r = mfu_report(step_flops=400, step_seconds=4.0, layers=layers, peak_override_tflops=1e-10)  # 100 FLOP/s
    assert abs(r.end_to_end_mfu - 1.0) < 1e-12  # 400 / 4 s / 100
    assert abs(r.local_mfu - 2.0) < 1e-12  # 400 / 2 s / 100
    assert abs(r.scaling_ratio - 0.5) < 1e-12
    assert "scaling ratio 0.50" in r.table()
    assert r.to_dict()["layers"][1]["gflops"] == 300 / 1e9


def test_cpu_has_no_peak():
    assert device_peak_flops("cpu") is None
    r = mfu_report(step_flops=1, step_seconds=1.0, device="cpu")
    assert r.end_to_end_mfu is None and r.local_mfu is None and r.scaling_ratio is None


def test_attention_custom_op_flops_are_counted_in_a_fresh_process():
    # The jagged attention custom op registers its FLOP formula when its module is first imported, and
    # FlopCounterMode copies the registry when created: count_flops must import it first. A fresh process,
    # so no other test has imported the op module already.
    code = """
import sys, torch
from train.mfu import count_flops
import kernels
assert "kernels.attention_op" not in sys.modules
from kernels import attention_impl, jagged_attention_flops
torch.manual_seed(0)
offsets = torch.tensor([0, 3, 8])
q, k, v = (torch.randn(8, 2, 16) for _ in range(3))
with attention_impl("triton"):
    flops, _ = count_flops(lambda: kernels.jagged_attention(q, k, v, offsets, offsets, causal=False))
expected = jagged_attention_flops(offsets, offsets, 2, 16, causal=False)
print(flops, expected)
assert flops == expected > 0, (flops, expected)
"""
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
