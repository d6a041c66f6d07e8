"""Synthetic training data for any `FeatureSchema`, with a planted signal a model must learn.

Everything is derived from the schema, so any schema works:

- Rows are generated in fixed chunks (`chunk_rows(schema)` rows: at most `CHUNK_ROWS`, fewer for
  long histories), each seeded by `(seed, chunk index)`, so the data for a seed does not depend on
  how it is split into files and row groups.
- History lengths are lognormal, clipped to `[0, max_length]`, with a few empty histories; the
  lognormal mean is chosen so that padding a batch of `PAD_BATCH` rows to its longest history
  would waste about half of the padded box.
- Event timestamps increase within a row and end before the row's `request_ts` (metadata, when
  the schema declares it).
- The planted signal. The "signal field" is a sequence id field whose table is shared with a
  non-sequential `id` feature (e.g. `history.item_category` and `ad_category`). Each row has a few
  preferred values of that table; history events and (half of the time) the candidate's value are
  drawn from them. The first label without a mask (e.g. `click`) has the logit
  `bias + f(features) + HISTORY_WEIGHT * s`, where `s = 1 - exp(-m)` and `m` sums
  `exp(-age / RECENCY_SCALE)` over the `RECENT` most recent events whose value equals the
  candidate's. `f` uses float features, small non-hashed id tables (a per-id effect, e.g. a
  country) and float vectors, with coefficients fixed by the feature names (not by the seed, so
  datasets made with different seeds share one ground truth).
- A label with `mask: other` (e.g. `conversion`) is 0 wherever `other` is 0, and otherwise a
  Bernoulli draw with its own feature effects and a weaker history effect. Its `p_<label>`
  column is the conditional probability given the mask label is 1 (what the masked task learns).
- Metadata: `row_id` is the global row index; `p_<label>` is the true probability of a label;
  `request_ts` is the request time; a string column holds the row index as text; any other
  column gets seeded values of its type.
- Ids are within table ranges, except hashed features, which get raw int64 ids of any value.
"""

from __future__ import annotations

import functools
import math
import threading
import zlib
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from features.errors import GemtrainError
from features.hashing import splitmix64
from features.schema import FeatureSchema, LabelSpec

CHUNK_ROWS = 4096
CHUNK_EVENTS = 1 << 20  # expected history events per chunk, at most
PAD_BATCH = 256  # the batch size the padding-waste target refers to
TARGET_WASTE = 0.5
LENGTH_SIGMA = 1.0
EMPTY_FRACTION = 0.02
RECENT = 32
RECENCY_SCALE = 12.0
HISTORY_WEIGHT = 3.0
N_PREFERRED = 3
P_EVENT_PREFERRED = 0.7
P_CANDIDATE_PREFERRED = 0.5
SMALL_TABLE = 1000  # id features on tables at most this big get a per-id effect
HASH_POOL = 4  # hashed features draw from HASH_POOL * num_embeddings distinct raw ids
T0 = 1_700_000_000  # request times: 30 days from here (seconds)
MEAN_EVENT_GAP_S = 3600.0  # gaps between events: 1 s + exponential with this mean


# ---- the plan: everything derived from the schema (not from the data seed) ---------------------


@dataclass(frozen=True)
class _Signal:
    sequence: str
    field: str
    feature: str
    size: int  # number of distinct values (the shared table's num_embeddings)


@dataclass
class _LabelModel:
    label: LabelSpec
    bias: float
    history_weight: float
    float_coef: dict[str, float] = field(default_factory=dict)
    id_effect: dict[str, np.ndarray] = field(default_factory=dict)
    vector_dir: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass
class _Plan:
    schema: FeatureSchema
    lengths: dict[str, tuple[float, float]]  # sequence -> lognormal (mu, sigma)
    chunk_rows: int
    signal: _Signal | None
    labels: list[_LabelModel]  # in dependency order (a mask label before the labels it masks)


def _stable_rng(*keys: str) -> np.random.Generator:
    return np.random.default_rng([0x6E7, zlib.crc32("/".join(keys).encode())])


@functools.lru_cache(maxsize=64)
def length_params(max_length: int, batch: int = PAD_BATCH, waste: float = TARGET_WASTE,
                  sigma: float = LENGTH_SIGMA) -> tuple[float, float]:
    """Lognormal (mu, sigma) whose clipped lengths waste `waste` of a batch padded to its max."""
    z = np.random.default_rng(7).standard_normal(batch * 64)
    empty = np.random.default_rng(8).random(batch * 64) < EMPTY_FRACTION

    def ratio(mu: float) -> float:
        lengths = np.where(empty, 0, np.clip(np.floor(np.exp(mu + sigma * z)), 0, max_length))
        box = lengths.reshape(64, batch).max(axis=1).mean()
        return float(lengths.mean() / box) if box > 0 else 0.0

    lo, hi = -5.0, math.log(max_length) + 4 * sigma
    for _ in range(50):
        mid = (lo + hi) / 2
        if ratio(mid) < 1.0 - waste:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2, sigma


def _find_signal(schema: FeatureSchema) -> _Signal | None:
    by_table = {f.table: f for f in schema.features if f.type == "id"}
    for s in schema.sequences:
        for f in s.id_fields:
            feat = by_table.get(f.table)
            if feat is not None:
                return _Signal(s.name, f.name, feat.name, schema.table(f.table).num_embeddings)
    return None


def _label_order(labels: tuple[LabelSpec, ...]) -> list[LabelSpec]:
    by_name = {label.name: label for label in labels}
    out: list[LabelSpec] = []
    done: set[str] = set()

    def visit(label: LabelSpec, stack: tuple[str, ...]) -> None:
        if label.name in done:
            return
        if label.name in stack:
            raise GemtrainError(f"label masks form a cycle: {' -> '.join((*stack, label.name))}")
        if label.mask:
            visit(by_name[label.mask], (*stack, label.name))
        done.add(label.name)
        out.append(label)

    for label in labels:
        visit(label, ())
    return out


def _make_plan(schema: FeatureSchema) -> _Plan:
    signal = _find_signal(schema)
    models = []
    primary = next((lb.name for lb in schema.labels if not lb.mask), None)
    for label in _label_order(schema.labels):
        if label.mask:  # e.g. conversion given click: rarer, weaker history effect
            m = _LabelModel(label, bias=-1.8, history_weight=0.4 * HISTORY_WEIGHT)
        elif label.name == primary:
            m = _LabelModel(label, bias=-3.4, history_weight=HISTORY_WEIGHT)
        else:
            m = _LabelModel(label, bias=-2.5, history_weight=0.5 * HISTORY_WEIGHT)
        scale = 1.5 if label.mask else 1.0
        for f in schema.features:
            if signal is not None and f.name == signal.feature:
                continue
            frng = _stable_rng(schema.name, label.name, f.name)
            if f.type == "float":
                m.float_coef[f.name] = scale * float(frng.choice([-1, 1]) * frng.uniform(0.25, 0.5))
            elif f.type == "id" and not f.hash and schema.table(f.table).num_embeddings <= SMALL_TABLE:
                m.id_effect[f.name] = scale * 0.5 * frng.standard_normal(schema.table(f.table).num_embeddings)
            elif f.type == "float_vector":
                d = frng.standard_normal(f.dim)
                m.vector_dir[f.name] = scale * 0.3 * d / np.linalg.norm(d)
        models.append(m)
    lengths = {s.name: length_params(s.max_length, waste=TARGET_WASTE) for s in schema.sequences}
    events_per_row = sum(math.exp(mu + sigma**2 / 2) for mu, sigma in lengths.values())
    rows = CHUNK_ROWS
    while rows > 64 and rows * events_per_row > CHUNK_EVENTS:
        rows //= 2
    return _Plan(schema, lengths, rows, signal, models)


_PLANS: dict[int, tuple[FeatureSchema, _Plan]] = {}


def _plan(schema: FeatureSchema) -> _Plan:
    # Keyed by identity (a schema holds a dict, so it is not hashable); the entry keeps the
    # schema alive so its id cannot be reused while cached.
    hit = _PLANS.get(id(schema))
    if hit is None or hit[0] is not schema:
        if len(_PLANS) > 32:
            _PLANS.clear()
        hit = _PLANS[id(schema)] = (schema, _make_plan(schema))
    return hit[1]


# ---- one chunk -----------------------------------------------------------------------------------


@dataclass
class _Truth:
    """Per-row quantities behind the labels (for the oracle / no-history NE report)."""

    s: np.ndarray  # history score in [0, 1)
    base_logit: dict[str, np.ndarray]  # label -> logit without the history term
    history_weight: dict[str, float]
    p: dict[str, np.ndarray]  # label -> true (conditional) probability
    y: dict[str, np.ndarray]  # label -> 0/1
    lengths: dict[str, np.ndarray]  # sequence -> history lengths


def _raw_ids(index: np.ndarray, salt: str) -> np.ndarray:
    """Arbitrary-looking int64 ids (any sign) for hashed features, stable per index."""
    return splitmix64(index.astype(np.int64) + np.int64(zlib.crc32(salt.encode()))).view(np.int64)


def _ids(rng: np.random.Generator, schema: FeatureSchema, table: str, hashed: bool, n: int,
         salt: str) -> np.ndarray:
    size = schema.table(table).num_embeddings
    if hashed:
        return _raw_ids(rng.integers(0, HASH_POOL * size, n), salt)
    return rng.integers(0, size, n)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _chunk(plan: _Plan, seed: int, chunk: int) -> tuple[dict[str, pa.Array], _Truth]:
    schema, n = plan.schema, plan.chunk_rows
    rng = np.random.default_rng([seed, chunk])
    cols: dict[str, pa.Array] = {}
    values: dict[str, np.ndarray] = {}  # non-sequential feature values (indices before hashing)
    request_ts = T0 + rng.integers(0, 30 * 86400, n)
    sig = plan.signal
    pref = rng.integers(0, sig.size, (n, N_PREFERRED)) if sig else None

    for f in schema.features:
        if f.type == "id":
            if sig is not None and f.name == sig.feature:
                idx = np.where(rng.random(n) < P_CANDIDATE_PREFERRED,
                               pref[np.arange(n), rng.integers(0, N_PREFERRED, n)],
                               rng.integers(0, sig.size, n))
                values[f.name] = idx
                cols[f.name] = pa.array(_raw_ids(idx, f.table) if f.hash else idx, pa.int64())
            else:
                ids = _ids(rng, schema, f.table, f.hash, n, f.table)
                values[f.name] = ids
                cols[f.name] = pa.array(ids, pa.int64())
        elif f.type == "id_list":
            lens = np.minimum(rng.poisson(3.0, n), 16)
            offsets = np.zeros(n + 1, np.int32)
            np.cumsum(lens, out=offsets[1:])
            ids = _ids(rng, schema, f.table, f.hash, int(offsets[-1]), f.table)
            cols[f.name] = pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids, pa.int64()))
        elif f.type == "float":
            x = rng.standard_normal(n, dtype=np.float32)
            values[f.name] = x
            cols[f.name] = pa.array(x)
        else:  # float_vector
            x = rng.standard_normal((n, f.dim), dtype=np.float32)
            values[f.name] = x
            cols[f.name] = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), f.dim)

    s = np.zeros(n)
    seq_lengths = {}
    for seq in schema.sequences:
        mu, sigma = plan.lengths[seq.name]
        lengths = np.clip(np.floor(np.exp(mu + sigma * rng.standard_normal(n))), 0, seq.max_length)
        lengths = np.where(rng.random(n) < EMPTY_FRACTION, 0, lengths).astype(np.int64)
        seq_lengths[seq.name] = lengths
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        row = np.repeat(np.arange(n), lengths)
        per_event = functools.partial(np.repeat, repeats=lengths)  # x[row], but faster
        is_signal_seq = sig is not None and seq.name == sig.sequence
        sig_idx = None
        if is_signal_seq:
            # one uniform picks both whether the event is a preferred value and which one
            u = rng.random(total)
            which = np.minimum((u * (N_PREFERRED / P_EVENT_PREFERRED)).astype(np.int64), N_PREFERRED - 1)
            sig_idx = np.where(u < P_EVENT_PREFERRED, pref.ravel()[row * N_PREFERRED + which],
                               rng.integers(0, sig.size, total))
            age = per_event(offsets[1:] - 1) - np.arange(total)  # 0 = most recent event
            hit = (age < RECENT) & (sig_idx == per_event(values[sig.feature]))
            m = np.bincount(row[hit], weights=np.exp(-age[hit] / RECENCY_SCALE), minlength=n)
            s = 1.0 - np.exp(-m)
        children = []
        for f in seq.fields:
            if f.type == "id":
                size = schema.table(f.table).num_embeddings
                if is_signal_seq and f.name == sig.field:
                    idx = sig_idx
                elif is_signal_seq and not f.hash and size >= 2 * sig.size:
                    # e.g. an item id whose category is the signal field: item % categories == category
                    idx = sig_idx + sig.size * rng.integers(0, size // sig.size, total)
                    idx = np.minimum(idx, size - 1)
                else:
                    idx = rng.integers(0, HASH_POOL * size if f.hash else size, total)
                children.append(pa.array(_raw_ids(idx, f.table) if f.hash else idx, pa.int64()))
            elif f.type == "float":  # lognormal, drawn in float32 (faster than rng.lognormal)
                children.append(pa.array(np.exp(rng.standard_normal(total, dtype=np.float32))))
            else:  # timestamp: strictly increasing, the last one before request_ts
                gaps = 1 + rng.exponential(MEAN_EVENT_GAP_S, total).astype(np.int64)
                incl = np.cumsum(gaps)
                row_end = np.zeros(n, np.int64)
                nz = lengths > 0
                row_end[nz] = incl[offsets[1:][nz] - 1]
                ts = per_event(request_ts - row_end) + (incl - gaps)
                children.append(pa.array(ts, pa.int64()))
        struct = pa.StructArray.from_arrays(children, names=[f.name for f in seq.fields])
        cols[seq.name] = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), struct)

    truth = _Truth(s=s, base_logit={}, history_weight={}, p={}, y={}, lengths=seq_lengths)
    for lm in plan.labels:
        name = lm.label.name
        logit = np.full(n, lm.bias)
        for fname, c in lm.float_coef.items():
            logit += c * values[fname]
        for fname, eff in lm.id_effect.items():
            logit += eff[values[fname]]
        for fname, d in lm.vector_dir.items():
            logit += values[fname] @ d
        p = _sigmoid(logit + lm.history_weight * s)
        y = rng.random(n) < p
        if lm.label.mask:
            y &= truth.y[lm.label.mask].astype(bool)
        truth.base_logit[name], truth.history_weight[name] = logit, lm.history_weight
        truth.p[name], truth.y[name] = p, y.astype(np.float32)
    for label in schema.labels:
        cols[label.name] = pa.array(truth.y[label.name])
        if label.weight:
            cols[label.weight] = pa.array(np.ones(n, np.float32))

    row_ids = np.arange(chunk * n, (chunk + 1) * n, dtype=np.int64)
    for name, mtype in schema.metadata.items():
        if name == "row_id":
            v = row_ids
        elif name == "request_ts":
            v = request_ts
        elif name.startswith("p_") and name[2:] in truth.p:
            v = truth.p[name[2:]]
        elif mtype == "string":
            v = row_ids
        elif mtype in ("float32", "float64"):
            v = rng.random(n)
        else:
            v = rng.integers(0, 2**31 - 1, n)
        if mtype == "string":
            cols[name] = pa.array(v).cast(pa.string())
        else:
            cols[name] = pa.array(v).cast(_META_ARROW[mtype])
    return cols, truth


_META_ARROW = {"int64": pa.int64(), "int32": pa.int32(), "float32": pa.float32(), "float64": pa.float64()}


# ---- public API ---------------------------------------------------------------------------------


def _chunks(start_row: int, rows: int, chunk_rows: int) -> range:
    return range(start_row // chunk_rows, -(-(start_row + rows) // chunk_rows))


def chunk_rows(schema: FeatureSchema) -> int:
    """Rows per independently seeded chunk (aligning row groups to it avoids regenerating rows)."""
    return _plan(schema).chunk_rows


def _check(rows: int, seed: int, start_row: int = 0) -> None:
    if rows < 0 or start_row < 0:
        raise GemtrainError(f"rows and start_row must be >= 0, got rows={rows}, start_row={start_row}")
    if seed < 0:
        raise GemtrainError(f"the seed must be >= 0, got {seed}")


_CACHE = threading.local()  # per thread: the last chunks made (consecutive row groups share chunks)


def _chunk_table(plan: _Plan, seed: int, chunk: int) -> pa.Table:
    cache: OrderedDict = getattr(_CACHE, "tables", None) or OrderedDict()
    _CACHE.tables = cache
    key = (id(plan), seed, chunk)
    hit = cache.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    cols, _ = _chunk(plan, seed, chunk)
    arrow_schema = plan.schema.arrow_schema()
    table = pa.Table.from_arrays([cols[n] for n in arrow_schema.names], schema=arrow_schema)
    cache[key] = (plan, table)
    while len(cache) > 2:
        cache.popitem(last=False)
    return table


def generate_table(schema: FeatureSchema, rows: int, *, seed: int, start_row: int = 0) -> pa.Table:
    """Rows `[start_row, start_row + rows)` of the synthetic dataset for `seed`.

    The result has exactly `schema.arrow_schema()`; any split of a range gives the same rows.
    """
    _check(rows, seed, start_row)
    plan = _plan(schema)
    chunks = _chunks(start_row, rows, plan.chunk_rows)
    if not chunks:
        return schema.arrow_schema().empty_table()
    table = pa.concat_tables([_chunk_table(plan, seed, c) for c in chunks])
    return table.slice(start_row - chunks[0] * plan.chunk_rows, rows)


def write_synthetic(schema: FeatureSchema, url: str, rows: int, *, seed: int = 0, files: int = 4,
                    row_group_rows: int | None = None, storage_options: dict | None = None,
                    threads: int = 1) -> list[str]:
    """Writes `rows` synthetic rows as `files` Parquet files under `url` (any fsspec URL).

    Parquet with zstd and page checksums. `row_group_rows` defaults to a quarter of a file, capped
    so that a row group holds about `ROW_GROUP_BYTES` of Arrow data. `threads > 1` writes up to
    that many files at once (the output is the same).
    Returns the URLs of the files written, in row order.
    """
    import fsspec
    import pyarrow.parquet as pq

    _check(rows, seed)
    if files < 1:
        raise GemtrainError(f"files must be >= 1, got {files}")
    per_file = -(-rows // files) if rows else 0
    if row_group_rows is None:
        row_group_rows = default_row_group_rows(schema, per_file)
    if row_group_rows < 1:
        raise GemtrainError(f"row_group_rows must be >= 1, got {row_group_rows}")
    try:
        fs, root = fsspec.core.url_to_fs(url, **(storage_options or {}))
        fs.makedirs(root, exist_ok=True)
    except Exception as e:  # noqa: BLE001 - any storage failure (credentials, network) is the user's to fix
        raise GemtrainError(f"cannot open {url} for writing: {type(e).__name__}: {e}") from None
    arrow_schema = schema.arrow_schema()
    options = parquet_write_options(schema)
    root = root.rstrip("/")

    def write_file(i: int) -> str:
        start, stop = min(rows, i * per_file), min(rows, (i + 1) * per_file)
        name = f"part-{i:05d}.parquet"
        try:
            with fs.open(f"{root}/{name}", "wb") as fh:
                with pq.ParquetWriter(fh, arrow_schema, **options) as w:
                    for rg in range(start, stop, row_group_rows):
                        table = generate_table(schema, min(row_group_rows, stop - rg), seed=seed, start_row=rg)
                        w.write_table(table, row_group_size=table.num_rows)
        except OSError as e:
            raise GemtrainError(f"cannot write {url.rstrip('/')}/{name}: {e}") from None
        return f"{url.rstrip('/')}/{name}"

    if threads <= 1 or files == 1:
        return [write_file(i) for i in range(files)]
    with ThreadPoolExecutor(min(threads, files)) as pool:
        return list(pool.map(write_file, range(files)))


ROW_GROUP_BYTES = 128 << 20


def default_row_group_rows(schema: FeatureSchema, rows_per_file: int) -> int:
    """A quarter of a file, capped at about `ROW_GROUP_BYTES` of Arrow data per row group."""
    n = chunk_rows(schema)
    bytes_per_row = max(1, generate_table(schema, n, seed=0).nbytes // n)
    cap = max(n, ROW_GROUP_BYTES // bytes_per_row // n * n)
    return max(1, min(cap, -(-rows_per_file // 4)))


def parquet_write_options(schema: FeatureSchema) -> dict:
    """zstd, page checksums; dictionaries only for small id tables; delta timestamps, split floats."""
    small, encoding = [], {}
    for s in schema.sequences:
        for f in s.fields:
            path = f"{s.name}.list.element.{f.name}"
            if f.type == "timestamp":
                encoding[path] = "DELTA_BINARY_PACKED"
            elif f.type == "float":
                encoding[path] = "BYTE_STREAM_SPLIT"
            elif f.type == "id" and not f.hash and schema.table(f.table).num_embeddings <= 4096:
                small.append(path)
    for f in schema.features:
        if f.type == "id" and not f.hash and schema.table(f.table).num_embeddings <= 4096:
            small.append(f.name)
    return dict(compression="zstd", write_page_checksum=True, use_dictionary=small,
                column_encoding=encoding or None)


# ---- the signal report --------------------------------------------------------------------------


def normalized_entropy(y: np.ndarray, p: np.ndarray) -> float:
    """Log loss of `p` over the entropy of the base rate (1.0 = predicting the average)."""
    p = np.clip(p, 1e-7, 1 - 1e-7)
    rate = float(np.mean(y))
    if rate <= 0 or rate >= 1:
        return float("nan")
    loss = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
    return float(loss / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate)))


@dataclass
class SignalReport:
    rows: int
    label_rate: dict[str, float]  # over the rows where the label is observed
    oracle_ne: dict[str, float]
    no_history_ne: dict[str, float]  # the best predictor that sees every feature but the history
    mean_length: dict[str, float]
    padding_waste: dict[str, float]  # of batches of PAD_BATCH rows padded to their longest history

    def lines(self) -> list[str]:
        out = []
        for name in self.oracle_ne:
            out.append(f"{name}: rate {self.label_rate[name]:.4f}, oracle NE {self.oracle_ne[name]:.4f}, "
                       f"best no-history NE {self.no_history_ne[name]:.4f}")
        for name in self.mean_length:
            out.append(f"{name}: mean length {self.mean_length[name]:.1f}, padding to the batch max "
                       f"(batch {PAD_BATCH}) would waste {self.padding_waste[name]:.1%}")
        return out


def signal_report(schema: FeatureSchema, rows: int = 100_000, *, seed: int = 0,
                  quantiles: int = 64) -> SignalReport:
    """Oracle NE (the true probabilities) vs the NE of the best predictor without the history.

    The history score `s` is independent of the other features, so the best no-history predictor
    averages the true probability over the distribution of `s` (here its `quantiles` quantiles).
    For a masked label it averages the conditional probability weighted by the chance that the
    mask label is 1, since the label is only observed there.
    """
    _check(rows, seed)
    plan = _plan(schema)
    truths = [_chunk(plan, seed, c)[1] for c in _chunks(0, max(rows, 1), plan.chunk_rows)]
    cat = lambda get: np.concatenate([get(t) for t in truths])[:rows]  # noqa: E731
    s = cat(lambda t: t.s)
    s_q = np.quantile(s, (np.arange(quantiles) + 0.5) / quantiles)
    masks = {lb.name: lb.mask for lb in schema.labels}
    rate, oracle, nohist = {}, {}, {}
    for label in schema.labels:
        name = label.name
        chain = [name]
        while masks[chain[-1]]:
            chain.append(masks[chain[-1]])
        # P(every label of the chain) as a function of s, for each row: [rows, quantiles]
        joint = np.ones((rows, quantiles))
        for lname in chain[1:]:
            b = cat(lambda t, n=lname: t.base_logit[n])
            joint *= _sigmoid(b[:, None] + truths[0].history_weight[lname] * s_q[None, :])
        b = cat(lambda t, n=name: t.base_logit[n])
        p_s = _sigmoid(b[:, None] + truths[0].history_weight[name] * s_q[None, :])
        p_nh = (joint * p_s).sum(1) / joint.sum(1)
        y = cat(lambda t, n=name: t.y[n])
        observed = np.ones(rows, bool)
        for lname in chain[1:]:
            observed &= cat(lambda t, n=lname: t.y[n]) > 0
        p_true = cat(lambda t, n=name: t.p[n])
        rate[name] = float(y[observed].mean()) if observed.any() else float("nan")
        oracle[name] = normalized_entropy(y[observed], p_true[observed])
        nohist[name] = normalized_entropy(y[observed], p_nh[observed])
    mean_len, waste = {}, {}
    for seq in schema.sequences:
        lengths = cat(lambda t, n=seq.name: t.lengths[n])
        b = len(lengths) // PAD_BATCH * PAD_BATCH
        boxes = lengths[:b].reshape(-1, PAD_BATCH) if b else lengths[None, :]
        mean_len[seq.name] = float(lengths.mean())
        box = boxes.max(1).sum() * boxes.shape[1]
        waste[seq.name] = float(1 - boxes.sum() / box) if box else 0.0
    return SignalReport(rows, rate, oracle, nohist, mean_len, waste)
