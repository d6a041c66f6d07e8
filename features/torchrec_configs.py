"""FeatureSchema -> torchrec table configs.

Tables looked up by a sequence are unpooled (`EmbeddingConfig`, for an `EmbeddingCollection`);
non-sequential `id` features on those tables share them (one id per row, so pooling is moot), which
lets a candidate ad's ids and the history's ids live in one embedding space. Every other table is
pooled (`EmbeddingBagConfig`, for an `EmbeddingBagCollection`).
"""

from __future__ import annotations

from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

from features.schema import FeatureSchema


def unpooled_keys(schema: FeatureSchema) -> list[str]:
    """KJT keys embedded by the EmbeddingCollection, in batch key order."""
    seq_tables = schema.sequence_tables()
    table_of = schema.key_table()
    return [k for k in schema.sparse_keys if table_of[k] in seq_tables]


def pooled_keys(schema: FeatureSchema) -> list[str]:
    seq_tables = schema.sequence_tables()
    table_of = schema.key_table()
    return [k for k in schema.sparse_keys if table_of[k] not in seq_tables]


def embedding_configs(schema: FeatureSchema) -> list[EmbeddingConfig]:
    table_of = schema.key_table()
    keys = unpooled_keys(schema)
    out = []
    for t in schema.tables:
        names = [k for k in keys if table_of[k] == t.name]
        if names:
            out.append(EmbeddingConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.dim,
                                       feature_names=names))
    return out


def embedding_bag_configs(schema: FeatureSchema) -> list[EmbeddingBagConfig]:
    table_of = schema.key_table()
    keys = pooled_keys(schema)
    out = []
    for t in schema.tables:
        names = [k for k in keys if table_of[k] == t.name]
        if names:
            pooling = PoolingType.MEAN if t.pooling == "mean" else PoolingType.SUM
            out.append(EmbeddingBagConfig(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.dim,
                                          feature_names=names, pooling=pooling))
    return out
