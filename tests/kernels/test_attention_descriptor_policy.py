"""When the generic attention kernels stream tiles through tensor descriptors, and the per-thread CUDA context
that descriptor launches need (``attention_triton_common.bind_context``)."""

from __future__ import annotations

import threading

import pytest
import torch

from kernels import attention_op as op
from kernels import attention_triton_common as common

# (tokens, longest row, heads, head dim) of the device README's standard batches
BATCH_A = (85_648, 4096, 8, 128)
BATCH_B = (86_966, 1024, 4, 64)


def test_descriptors_pay_on_batch_a_only():
    tokens, longest, heads, dim = BATCH_A
    assert op.descriptors_pay(tokens, longest, heads, dim)
    assert not op.descriptors_pay(*BATCH_B)
    assert not op.descriptors_pay(16 * 64, longest, heads, dim)  # batch A's cross attention: 16 queries a row


@pytest.mark.parametrize("mode,batch,block_size,expected", [
    ("auto", BATCH_A, 0, True), ("auto", BATCH_B, 0, False), ("auto", BATCH_A, 64, False),
    ("1", BATCH_B, 0, True), ("0", BATCH_A, 0, False)])
def test_plan_streams_through_descriptors_where_they_pay(monkeypatch, mode, batch, block_size, expected):
    # meta tensors stand in for a Hopper GPU's (no data, no context to bind)
    monkeypatch.setattr(common, "TMA", mode)
    monkeypatch.setattr(common, "on_hopper", lambda t: True)
    tokens, longest, heads, dim = batch
    q = torch.empty(tokens, heads, dim, dtype=torch.bfloat16, device="meta")
    plan = op._plan(q, q, longest, block_size, 0, q)
    assert plan["tma"] is expected


def test_bind_context_queries_a_stream_once_per_thread_and_device(monkeypatch):
    queried = []

    class Stream:
        def __init__(self, device):
            self.device = device

        def query(self):
            queried.append((threading.get_ident(), self.device.index))
            return True

    monkeypatch.setattr(torch.cuda, "current_stream", Stream)
    monkeypatch.setattr(common, "_THREAD", threading.local())  # no thread has bound a context yet
    cuda0, cuda1 = torch.device("cuda", 0), torch.device("cuda", 1)
    common.bind_context(cuda0)
    common.bind_context(cuda0)
    common.bind_context(cuda1)
    worker = threading.Thread(target=lambda: [common.bind_context(cuda0) for _ in range(2)])
    worker.start()
    worker.join()
    here = threading.get_ident()
    assert [(t == here, d) for t, d in queried] == [(True, 0), (True, 1), (False, 0)]
