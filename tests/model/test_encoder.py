"""The sequence encoder through the whole model: every attention option trains on CPU; padded == jagged."""

from __future__ import annotations

import pytest
import torch

from model import build_model, multitask_loss
from tests.model.helpers import synth_batch, tiny_schema

SCHEMA = tiny_schema(max_length=20)
BASE = {"d_model": 16, "num_heads": 2, "top_dim": 32, "head_hidden": 8,
        "interaction": {"num_layers": 1, "fm_tokens": 4, "lcb_tokens": 4, "mlp_dim": 32}}


def _cfg(**enc) -> dict:
    return {**BASE, "sequence_encoder": {"num_layers": 2, "window": 3, "block_size": 4,
                                         "bias": {"time": True, "num_position_buckets": 9,
                                                                            "num_time_buckets": 8}, **enc}}


@pytest.fixture(scope="module")
def batch():
    return synth_batch(SCHEMA, rows=6, seed=1)


OPTIONS = {
    "full": _cfg(attention="full"),
    "window": _cfg(attention="window"),
    "block": _cfg(attention="block"),
    "mixed": _cfg(attention=["window:2", "block:8"]),
    "silu": _cfg(activation="silu"),
    "no_bias": _cfg(bias={"position": False, "time": False}),
    "pos_bias_only_bidirectional": _cfg(causal=False, bias={"time": False, "num_position_buckets": 5}),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_forward_backward_every_encoder_option(name, batch):
    torch.manual_seed(0)
    model = build_model(SCHEMA, OPTIONS[name])
    out = model(batch)
    assert out.logits.shape == (6, 2) and out.logits.dtype == torch.float32
    assert torch.isfinite(out.logits).all()
    loss, per = multitask_loss(out.logits, batch.labels, batch.label_mask, batch.weights, SCHEMA.label_names)
    (loss + out.aux_loss).backward()
    attn = model.encoders["history"].layers[0].attn
    assert attn.qkv.weight.grad is not None and attn.qkv.weight.grad.abs().sum() > 0
    bias_on = OPTIONS[name]["sequence_encoder"].get("bias", {}).get("position", True)
    if bias_on:  # the relative bias tables learn
        assert attn.pos_weight.grad.abs().sum() > 0
        if OPTIONS[name]["sequence_encoder"]["bias"].get("time", True):
            assert attn.time_weight.grad.abs().sum() > 0
    else:
        assert attn.pos_weight is None and attn.time_weight is None
    cross = model.cross["history"]
    assert cross.pos_weight.grad.abs().sum() > 0  # the cross attention's recency bias learns
    assert model.embeddings.sequences["history"].recency.weight.grad.abs().sum() > 0
    emb_grad = model.embeddings.ec.embeddings["item"].weight.grad
    assert emb_grad is not None and emb_grad.abs().sum() > 0  # history ids reach the loss


def test_layer_options_reach_the_kernel_calls(batch, monkeypatch):
    import model.attention as attention

    calls = []
    real = attention.jagged_attention

    def spy(*args, **kw):
        calls.append((kw.get("block_size"), kw.get("window"), kw["causal"], kw["activation"]))
        return real(*args, **kw)

    monkeypatch.setattr(attention, "jagged_attention", spy)
    build_model(SCHEMA, OPTIONS["mixed"])(batch)
    # two self-attention layers (window 2, then block 8), then cross attention (full, not causal)
    assert calls == [(None, 2, True, "softmax"), (8, None, True, "softmax"), (None, None, False, "softmax")]


@pytest.mark.parametrize("name", ["full", "mixed", "pos_bias_only_bidirectional", "silu"])
def test_padded_impl_equals_jagged(name, batch):
    torch.manual_seed(0)
    jagged = build_model(SCHEMA, OPTIONS[name])
    padded = build_model(SCHEMA, {**OPTIONS[name], "attention_impl": "padded"})
    padded.load_state_dict(jagged.state_dict())
    with torch.no_grad():  # non-zero bias tables, so the bias path is compared too
        for m in (jagged, padded):
            tables = [(layer.attn.pos_weight, layer.attn.time_weight) for layer in m.encoders["history"].layers]
            for pair in [*tables, (m.cross["history"].pos_weight, None)]:
                for w in pair:
                    if w is not None:
                        w.copy_(torch.linspace(-1, 1, w.numel()).view_as(w))
    a, b = jagged(batch).logits, padded(batch).logits
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    a.sum().backward()
    b.sum().backward()
    ga = jagged.encoders["history"].layers[0].attn.qkv.weight.grad
    gb = padded.encoders["history"].layers[0].attn.qkv.weight.grad
    torch.testing.assert_close(gb, ga, rtol=1e-3, atol=1e-5)


def test_padded_attention_function_matches_kernel_reference():
    from kernels import RelativeBias, jagged_attention
    from model.padded import padded_attention

    g = torch.Generator().manual_seed(0)
    lens_q, lens_k = [3, 0, 5, 1], [4, 2, 5, 0]
    q = torch.randn(sum(lens_q), 2, 8, generator=g)
    k, v = torch.randn(2, sum(lens_k), 2, 8, generator=g)
    qo = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()])
    ko = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()])
    pos = torch.randn(7, 2, generator=g)
    for kw in ({}, {"causal": True, "window": 1}, {"block_size": 2}, {"activation": "silu", "causal": True}):
        want = jagged_attention(q, k, v, qo, ko, bias=RelativeBias(pos_weight=pos), **kw)
        got = padded_attention(q, k, v, qo, ko, pos_weight=pos, **kw)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_model_on_the_triton_kernels_matches_the_reference_path():
    # The Triton kernels (interpreted on CPU) inside the model: same logits and bias gradients.
    from kernels import attention_impl

    schema = tiny_schema(max_length=12)
    batch = synth_batch(schema, rows=3, seed=2)
    torch.manual_seed(0)
    model = build_model(schema, {**BASE, "sequence_encoder": {"num_layers": 2, "attention": ["window:3", "block:4"],
                                                              "bias": {"time": True, "num_position_buckets": 9,
                                                                       "num_time_buckets": 8}}})
    ref = model(batch).logits
    ref.sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if "pos_weight" in n or "time_weight" in n}
    model.zero_grad()
    with attention_impl("triton"):
        tri = model(batch).logits
        tri.sum().backward()
    torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-6)
    for n, p in model.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6)
