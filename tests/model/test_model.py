"""GEMModel end to end on synthetic batches: torchrec modules from both schemas, shapes, FLOPs, variants."""

from __future__ import annotations

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from model import ModelConfigError, build_model, iter_precision_blocks
from tests.model.helpers import equal_length_batch, synth_batch, tiny_schema

SMALL = {"d_model": 16, "num_heads": 2, "top_dim": 32, "head_hidden": 8,
         "sequence_encoder": {"num_layers": 1, "bias": {"num_position_buckets": 9, "num_time_buckets": 8}},
         "interaction": {"num_layers": 1, "fm_tokens": 3, "lcb_tokens": 3, "mlp_dim": 32}}


@pytest.mark.parametrize("name", ["demo", "gem_medium"])
def test_torchrec_modules_built_from_the_schema(name):
    schema = tiny_schema(name, max_length=16, max_rows=64)
    model = build_model(schema, SMALL)
    ec, ebc = model.embeddings.ec, model.embeddings.ebc
    assert isinstance(ec, EmbeddingCollection) and isinstance(ebc, EmbeddingBagCollection)
    ec_tables = {c.name: c.feature_names for c in ec.embedding_configs()}
    assert ec_tables["category"] == ["history.item_category", "ad_category"]  # the ad shares the history's space
    assert set(ec_tables) == schema.sequence_tables()
    ebc_tables = {c.name for c in ebc.embedding_bag_configs()}
    assert "user" in ebc_tables and "interest" in ebc_tables and not ebc_tables & set(ec_tables)
    for c in ec.embedding_configs():
        assert c.num_embeddings == schema.table(c.name).num_embeddings
    batch = synth_batch(schema, rows=4, seed=3)
    out = model(batch)
    assert out.logits.shape == (4, len(schema.labels)) and torch.isfinite(out.logits).all()
    # one token per id feature, per float_vector, one for the scalar floats, plus the history summary
    # and the target match token (ad_category on the history's category table)
    n_ids = len(schema.id_features)
    assert model.num_tokens == n_ids + 1 + 1 + 1 + 1
    assert list(model.matches) == ["history"]


def test_outputs_moe_aux_and_no_history_variant():
    schema = tiny_schema(max_length=16)
    batch = synth_batch(schema, rows=5, seed=2)
    torch.manual_seed(0)
    moe = build_model(schema, {**SMALL, "moe": {"num_experts": 3, "top_k": 2, "hidden_dim": 16}})
    out = moe(batch)
    assert out.aux_loss.dim() == 0 and float(out.aux_loss) > 0
    plain = build_model(schema, SMALL)(batch)
    assert float(plain.aux_loss) == 0.0
    no_hist = build_model(schema, {**SMALL, "use_history": False})
    assert len(no_hist.encoders) == 0 and no_hist.num_tokens == len(schema.id_features) + 2
    assert no_hist(batch).logits.shape == (5, 2)


def test_empty_histories_and_history_sensitivity():
    schema = tiny_schema(max_length=16)
    batch = synth_batch(schema, rows=32, seed=1)
    lengths = batch.seq_offsets["history"].diff()
    assert (lengths == 0).any() and (lengths > 0).any(), "the sample should hold empty and non-empty rows"
    torch.manual_seed(0)
    model = build_model(schema, SMALL).eval()
    base = model(batch).logits
    assert torch.isfinite(base).all()
    # the history matters: perturbing its floats changes exactly the rows that have events
    batch.seq_floats["history"] = batch.seq_floats["history"] + 1.0
    moved = (model(batch).logits - base).abs().sum(dim=1) > 0
    assert torch.equal(moved, lengths > 0)


def test_forward_flops_match_the_flop_counter():
    # Equal lengths and full non-causal attention without bias: the reference computes exactly the
    # real pairs, so torch's FlopCounterMode must agree with the formula to the FLOP.
    schema = tiny_schema(max_length=16)
    batch = equal_length_batch(schema, 5, rows=4)
    cfg = {**SMALL, "sequence_encoder": {"num_layers": 2, "causal": False, "bias": {"position": False,
                                         "time": False}}, "moe": {"num_experts": 3, "top_k": 2, "hidden_dim": 8}}
    model = build_model(schema, cfg)
    counter = FlopCounterMode(display=False)
    with counter:
        model(batch)
    flops = model.forward_flops(batch)
    assert flops["total"] == counter.get_total_flops()
    assert flops["encoder_attention_core"] == 2 * 4 * 4 * 5 * 5 * 16  # layers * 4*pairs*H*D
    # per-part numbers add up, and block-local attention counts fewer pairs
    assert flops["total"] == sum(v for k, v in flops.items() if k != "total")
    assert model.forward_flops(batch, padded=True) == flops  # equal lengths: nothing to pad
    ragged = synth_batch(schema, rows=8, seed=1)
    real, box = model.forward_flops(ragged), model.forward_flops(ragged, padded=True)
    assert box["encoder_attention_core"] > real["encoder_attention_core"] and box["heads"] == real["heads"]
    blk = build_model(schema, {**cfg, "sequence_encoder": {"num_layers": 2, "attention": "block", "block_size": 2}})
    assert blk.forward_flops(batch)["encoder_attention_core"] < flops["encoder_attention_core"]


def test_precision_kinds_and_bf16_autocast():
    schema = tiny_schema(max_length=16)
    model = build_model(schema, {**SMALL, "moe": {"num_experts": 2, "top_k": 1, "hidden_dim": 8}})
    kinds = {kind for _, _, kind in iter_precision_blocks(model)}
    assert kinds == {"attention", "mlp", "interaction", "embedding", "head", "norm"}
    assert model.embeddings.ec.precision_kind == "embedding"
    batch = synth_batch(schema, rows=4, seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch)
    assert out.logits.dtype == torch.float32 and torch.isfinite(out.logits).all()
    out.logits.sum().backward()


def test_sequence_tables_of_different_dims_are_refused():
    import dataclasses

    schema = tiny_schema()
    tables = tuple(dataclasses.replace(t, dim=8) if t.name == "action" else t for t in schema.tables)
    with pytest.raises(ModelConfigError, match="must share one dim"):
        build_model(dataclasses.replace(schema, tables=tables), SMALL)


TWO_SEQUENCES = """
name: two_seq
tables:
  item: {num_embeddings: 300, dim: 8}
  cat: {num_embeddings: 20, dim: 8}
  topic: {num_embeddings: 30, dim: 4, pooling: mean}
  query: {num_embeddings: 50, dim: 8}
  user: {num_embeddings: 40, dim: 4}
sequences:
  clicks:
    max_length: 10
    fields:
      item_id: {type: id, table: item}
      item_cat: {type: id, table: cat}
      dwell: {type: float}
      ts: {type: timestamp}
  searches:
    max_length: 6
    fields:
      query_id: {type: id, table: query}
features:
  user_id: {type: id, table: user}
  ad_cat: {type: id, table: cat}
  liked_topics: {type: id_list, table: topic}
  bid: {type: float}
labels:
  click: {}
metadata:
  row_id: int64
"""


def test_two_sequences():
    # A second history without floats or timestamps; an `id` on the first history's table.
    from features.schema import parse_schema

    schema = parse_schema(TWO_SEQUENCES)
    batch = synth_batch(schema, rows=6, seed=0)
    torch.manual_seed(0)
    model = build_model(schema, {**SMALL, "sequence_encoder": {"num_layers": 1, "bias": {"time": True}}})
    assert set(model.encoders) == {"clicks", "searches"} and model.num_tokens == 4 + 2 + 1
    assert list(model.matches) == ["clicks"]  # ad_cat shares only the clicks' table
    assert model.embeddings.ec_single == {"ad_cat"}
    out = model(batch)
    assert out.logits.shape == (6, 1) and torch.isfinite(out.logits).all()
    out.logits.sum().backward()
    assert model.embeddings.ec.embeddings["query"].weight.grad.abs().sum() > 0
    _, pooled = model.embeddings.lookup(batch.sparse)
    ad_cat = batch.sparse.to_dict()["ad_cat"].values()
    torch.testing.assert_close(pooled["ad_cat"], model.embeddings.ec.embeddings["cat"].weight[ad_cat])
    flops = model.forward_flops(batch)
    assert flops["encoder_attention_core"] > 0 and flops["total"] == sum(v for k, v in flops.items() if k != "total")
