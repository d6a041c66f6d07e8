"""FeatureSchema -> torchrec EmbeddingConfig (unpooled, sequence tables) and EmbeddingBagConfig."""

from __future__ import annotations

from torchrec.modules.embedding_configs import PoolingType

from features.torchrec_configs import embedding_bag_configs, embedding_configs, pooled_keys, unpooled_keys


def test_demo_configs(demo_schema):
    ec = {c.name: c for c in embedding_configs(demo_schema)}
    ebc = {c.name: c for c in embedding_bag_configs(demo_schema)}
    assert set(ec) == {"item", "category", "action"}
    assert ec["category"].feature_names == ["history.item_category", "ad_category"]
    assert ec["item"].num_embeddings == 20000 and ec["item"].embedding_dim == 32
    assert set(ebc) == {"user", "ad", "country", "interest"}
    assert ebc["interest"].feature_names == ["user_interests"] and ebc["interest"].pooling == PoolingType.SUM
    assert unpooled_keys(demo_schema) == ["history.item_id", "history.item_category", "history.action_type",
                                          "ad_category"]
    assert pooled_keys(demo_schema) == ["user_id", "ad_id", "user_country", "user_interests"]
    # every key is embedded exactly once
    keys = [k for c in [*ec.values(), *ebc.values()] for k in c.feature_names]
    assert sorted(keys) == sorted(demo_schema.sparse_keys)


def test_collections_build_from_configs(demo_schema):
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingCollection

    ec = EmbeddingCollection(tables=embedding_configs(demo_schema), device=torch.device("meta"))
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(demo_schema), device=torch.device("meta"))
    assert len(ec.embeddings) == 3 and len(ebc.embedding_bags) == 4
