"""benchmarks/attention.py's bias breakdown (rows=biasparts) runs its variants through the real kernels
(interpreter) with a stand-in timer, so the device script cannot rot."""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before any kernel module is imported

import benchmarks.attention as bench  # noqa: E402
from kernels import attention_impl  # noqa: E402
from tests.kernels.attention_cases import make_problem  # noqa: E402


def test_bias_parts_rows_time_every_variant(monkeypatch):
    calls_made = []
    monkeypatch.setattr(bench, "cuda_time", lambda fn, reps=10, warmup=2, calls=1: (fn(), calls_made.append(1), 2.0)[2])
    p = make_problem(3, [40, 7], [40, 7], heads=2)
    q, k, v = (t.float().requires_grad_() for t in (p.q, p.k, p.v))
    pos_w, time_w = (t.float().requires_grad_() for t in (p.pos, p.time))
    rows = []
    with attention_impl("triton"):
        bench._bias_parts_row(lambda row, results, flops: rows.append((row, results)), q, k, v, p.do.float(),
                              p.q_offsets, p.kv_ts, pos_w, time_w, 40, 2, 16)
    assert len(calls_made) == 8  # four variants, forward and forward+backward each
    assert [r for r, _ in rows] == ["causal softmax, position table", "causal softmax, time table",
                                    "causal softmax, both tables"]
    assert all(res[1][0] == "ours, no bias" for _, res in rows)
