"""Triton helpers of the relative position / log-time bias: buckets, bias values, table gradients.

A tile's scores of one table span the buckets ``lo .. hi`` (from the extremes of the tile's positions and
timestamps). One-bucket tiles add one value and send one reduced gradient; narrow spans use thresholds
(one int32 compare per score); wide spans (near the diagonal) gather per score and sum their gradients
by diagonal (positions) or bucket by bucket (time). Each program keeps per-bucket gradient sums and adds
them to the table once (``flush_table_grad``).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def pos_bucket(pos_q, pos_k, NUM_POS: tl.constexpr):
    half: tl.constexpr = (NUM_POS - 1) // 2
    rel = pos_q - pos_k
    return tl.minimum(tl.maximum(rel, -half), NUM_POS - 1 - half) + half


@triton.jit
def time_bucket(ts_q, ts_k, NUM_TIME: tl.constexpr):
    dt = ts_q - ts_k
    dt = tl.where(dt < 0, -dt, dt) + 1
    bits = dt.to(tl.float32).to(tl.int32, bitcast=True)
    e = (bits >> 23) - 127
    return tl.minimum(tl.maximum(e, 0), NUM_TIME - 1)


@triton.jit
def pos_uniform(pos_q, q_ok, pos_k, NUM_POS: tl.constexpr):
    """(every valid query of the tile and every key fall in one position bucket, that bucket).

    Buckets clamp the relative position, so tiles farther apart than the table's reach share one bucket
    and take one table read instead of a gather per score. ``pos_k``: the keys' positions (all valid).
    """
    rel_lo = tl.min(tl.where(q_ok, pos_q, 2**30)) - tl.max(pos_k)
    rel_hi = tl.max(tl.where(q_ok, pos_q, -(2**30))) - tl.min(pos_k)
    b_lo = pos_bucket(rel_lo, 0, NUM_POS)
    return b_lo == pos_bucket(rel_hi, 0, NUM_POS), b_lo


@triton.jit
def time_uniform(ts_q, q_ok, ts_k, NUM_TIME: tl.constexpr):
    """(every valid query/key pair of the tile falls in one log time bucket, that bucket): the bucket
    grows with |dt|, so the extremes of |dt| over the tile decide (dt spanning 0 never counts as one)."""
    dt_lo = tl.min(tl.where(q_ok, ts_q, 2**62)) - tl.max(ts_k)
    dt_hi = tl.max(tl.where(q_ok, ts_q, -(2**62))) - tl.min(ts_k)
    one_sign = (dt_lo >= 0) | (dt_hi <= 0)
    a_lo = tl.minimum(tl.abs(dt_lo), tl.abs(dt_hi))
    a_hi = tl.maximum(tl.abs(dt_lo), tl.abs(dt_hi))
    b_lo = time_bucket(a_lo, 0, NUM_TIME)
    return one_sign & (b_lo == time_bucket(a_hi, 0, NUM_TIME)), b_lo


@triton.jit
def bucket_tile(at_q, at_k, NUM: tl.constexpr, IS_POS: tl.constexpr):
    """[M, N] bucket of each (query, key) pair: positions (``IS_POS``) or timestamps ``at_q`` / ``at_k``."""
    if IS_POS:
        return pos_bucket(at_q[:, None], at_k[None, :], NUM)
    else:
        return time_bucket(at_q[:, None], at_k[None, :], NUM)


@triton.jit
def bias_buckets(pos_q, pos_k, ts_q, ts_k, q_ok, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
                 HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, WHOLE_KEYS: tl.constexpr):
    """(position tile in one bucket, that bucket, time tile in one bucket, that bucket), found once per
    tile for the bias and its gradient. Only where every key of the tile is real (``WHOLE_KEYS``);
    otherwise (False, 0) and every score gathers its own bucket."""
    pos_one = False
    pos_b = 0
    time_one = False
    time_b = 0
    if WHOLE_KEYS:
        if HAS_POS:
            pos_one, pos_b = pos_uniform(pos_q, q_ok, pos_k, NUM_POS)
        if HAS_TIME:
            time_one, time_b = time_uniform(ts_q, q_ok, ts_k, NUM_TIME)
    return pos_one, pos_b, time_one, time_b


@triton.jit
def add_table(s, W, at_q, at_k, one, b, h, scale, H: tl.constexpr, NUM: tl.constexpr, IS_POS: tl.constexpr,
              WHOLE_KEYS: tl.constexpr):
    """``s`` plus one bias table's values: one table value when the tile is in one bucket ``b`` (``one``,
    from ``bias_buckets``), else a gather per score."""
    if WHOLE_KEYS:
        if one:
            s += tl.load(W + b * H + h) * scale
        else:
            s += tl.load(W + bucket_tile(at_q, at_k, NUM, IS_POS) * H + h) * scale
    else:
        s += tl.load(W + bucket_tile(at_q, at_k, NUM, IS_POS) * H + h) * scale
    return s


@triton.jit
def add_bias(s, pos_q, pos_k, ts_q, ts_k, pos_one, pos_b, time_one, time_b, h, POSW, TIMEW, bias_scale,
             H: tl.constexpr,
             HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr,
             WHOLE_KEYS: tl.constexpr):
    """``s`` plus the position and time bias (``add_table`` for each table present; the one-bucket
    flags and buckets from ``bias_buckets``)."""
    if HAS_POS:
        s = add_table(s, POSW, pos_q, pos_k, pos_one, pos_b, h, bias_scale, H, NUM_POS, True, WHOLE_KEYS)
    if HAS_TIME:
        s = add_table(s, TIMEW, ts_q, ts_k, time_one, time_b, h, bias_scale, H, NUM_TIME, False, WHOLE_KEYS)
    return s


@triton.jit
def add_table_grad(DT, bkt, ds, ok, h, H: tl.constexpr, NUM: tl.constexpr):
    """Add the score gradients ``ds`` into ``DT[bkt, h]``.

    Most tiles span few buckets (far-apart positions clamp to one; nearby timestamps share a log bucket),
    so a tile adds one reduced value per bucket; per-element atomics, which contend on the few table
    cells, are used only for tiles spanning many buckets (near the diagonal).
    """
    b_lo = tl.min(tl.where(ok, bkt, NUM))
    b_hi = tl.max(tl.where(ok, bkt, -1))
    if b_hi - b_lo < 8:
        for b in range(b_lo, b_hi + 1):
            tl.atomic_add(DT + b * H + h, tl.sum(tl.where(ok & (bkt == b), ds, 0.0)))
    else:
        tl.atomic_add(DT + bkt * H + h, ds, mask=ok)


# Heuristics of the kernels that read bias tables: the table sizes rounded up to powers of two (vectors of
# per-bucket values and gradients).
TABLE_PADS = {"POS_PAD": lambda a: triton.next_power_of_2(a["NUM_POS"]),
              "TIME_PAD": lambda a: triton.next_power_of_2(a["NUM_TIME"])}

# Tiles of one bias table span the buckets ``lo .. hi`` (``tile_spans``, from the extremes of the tile's
# positions and timestamps: no per-score work). Spans of at most ``SPAN_*`` buckets are handled by
# thresholds (is the pair's bucket >= c?: one int32 compare per score, no bucket arithmetic and no table
# gather); wider spans (near the diagonal) gather per score and reduce their gradients by diagonal
# (positions) or bucket by bucket (time).
SPAN_POS = tl.constexpr(2)
SPAN_TIME = tl.constexpr(4)


@triton.jit
def pos_span(q_first, q_last, k_first, k_last, NUM: tl.constexpr):
    """(lo, hi): the position buckets of every pair of queries at positions ``q_first .. q_last`` and keys
    at ``k_first .. k_last`` (the bucket grows with ``query - key``); ``hi < lo`` when a side is empty."""
    lo = pos_bucket(q_first, k_last, NUM)
    hi = pos_bucket(q_last, k_first, NUM)
    if (q_last < q_first) | (k_last < k_first):
        hi = lo - 1
    return lo, hi


@triton.jit
def _min_max(a_min, a_max, b_min, b_max):
    return tl.minimum(a_min, b_min), tl.maximum(a_max, b_max)


@triton.jit
def min_max(ts, ok):
    """(min, max) of the timestamps ``ts`` where ``ok``, in one reduction ((2**61, -2**61) when none)."""
    return tl.reduce((tl.where(ok, ts, 2**61), tl.where(ok, ts, -(2**61))), 0, _min_max)


@triton.jit
def time_span(tq_min, tq_max, tk_min, tk_max, NUM: tl.constexpr):
    """(lo, hi, fits): the log time buckets of every pair of queries with timestamps in ``tq_min .. tq_max``
    and keys in ``tk_min .. tk_max`` (the bucket grows with |dt|; dt spanning 0 starts at bucket 0;
    ``hi < lo`` when a side is empty), and whether every timestamp lies within 2**30 of ``tk_min`` (the
    int32 offsets of ``time_offsets`` are then exact)."""
    dt_lo = tq_min - tk_max
    dt_hi = tq_max - tk_min
    a_lo = tl.minimum(tl.abs(dt_lo), tl.abs(dt_hi))
    a_lo = tl.where((dt_lo >= 0) | (dt_hi <= 0), a_lo, 0)
    lo = time_bucket(a_lo, 0, NUM)
    hi = time_bucket(tl.maximum(tl.abs(dt_lo), tl.abs(dt_hi)), 0, NUM)
    if (tq_min > tq_max) | (tk_min > tk_max):
        hi = lo - 1
    far = tl.maximum(tl.maximum(tl.abs(tq_min - tk_min), tl.abs(tq_max - tk_min)), tk_max - tk_min)
    return lo, hi, far < 2**30


@triton.jit
def time_offsets(ts, ref):
    """Timestamps as int32 offsets from ``ref`` (clamped to +-2**30: exact where ``time_span`` fits)."""
    return tl.minimum(tl.maximum(ts - ref, -(2**30)), 2**30).to(tl.int32)


@triton.jit
def at_or_above(rq, rk, c, NUM: tl.constexpr, IS_POS: tl.constexpr):
    """[M, N]: the pair's bucket is >= ``c`` (1 <= c <= NUM - 1), decided without computing the bucket.
    Positions (``rq``, ``rk``: int32): relative position >= c - (NUM - 1) // 2. Time (``rq``, ``rk``: the
    int32 offsets of ``time_offsets``): float32(1 + |dt|) >= 2**c, i.e. |dt| + 1 >= 2**c, less 2**(c - 25)
    from c = 25 on (float32 rounds to nearest even; the reference reads the float32 exponent)."""
    if IS_POS:
        half: tl.constexpr = (NUM - 1) // 2
        return (rq[:, None] - rk[None, :]) >= c - half
    else:
        # |dt| <= 2**31 - 2 here (time_span fits), so clamping the threshold to 2**31 - 1 keeps the test.
        e = tl.minimum(c, 32).to(tl.int64)
        one = tl.full([], 1, tl.int64)
        thr = (one << e) - tl.where(e >= 25, one << tl.maximum(e - 25, 0), 0) - 1
        thr = tl.minimum(thr, 2**31 - 1).to(tl.int32)
        return tl.abs(rq[:, None] - rk[None, :]) >= thr


@triton.jit
def table_lookup(W, bkt, h, H: tl.constexpr, NUM: tl.constexpr, PAD: tl.constexpr):
    """``W[bkt, h]`` for a [M, N] tile of buckets: the table's column is loaded once as a vector (``PAD``:
    ``NUM`` rounded up to a power of two) and read per score through a gather (in shared memory), which
    needs no 64-bit address per score."""
    ar = tl.arange(0, PAD)
    col = tl.load(W + ar * H + h, mask=ar < NUM, other=0.0)
    M: tl.constexpr = bkt.shape[0]
    N: tl.constexpr = bkt.shape[1]
    return tl.reshape(tl.gather(col, tl.reshape(bkt, [M * N]), 0), [M, N])


@triton.jit
def add_table_span(s, W, at_q, at_k, rq, rk, narrow, lo, hi, h, scale, H: tl.constexpr, NUM: tl.constexpr,
                   PAD: tl.constexpr, IS_POS: tl.constexpr, SPAN: tl.constexpr):
    """``s`` plus one table's bias on a tile spanning buckets ``lo .. hi`` (``tile_spans``). ``narrow``
    (at most ``SPAN`` buckets, and exact int32 offsets ``rq`` / ``rk``): selects among the span's table
    values by thresholds; otherwise a lookup per score (``at_q`` / ``at_k``: positions or timestamps)."""
    if narrow:
        val = tl.load(W + lo * H + h)
        w = tl.zeros_like(s) + val
        for r in tl.static_range(1, SPAN):
            if lo + r <= hi:
                val = tl.load(W + (lo + r) * H + h)
                w = tl.where(at_or_above(rq, rk, lo + r, NUM, IS_POS), val, w)
        s += w * scale
    else:
        s += table_lookup(W, bucket_tile(at_q, at_k, NUM, IS_POS), h, H, NUM, PAD) * scale
    return s


@triton.jit
def tile_spans(q_first, q_last, k_first, k_last, ts_q, tq_min, tq_max, ts_k, tk_min, tk_max,
               HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr):
    """What a tile's bias and table gradients need, from the extremes of its valid queries and keys
    (positions ``*_first .. *_last``, timestamps ``t*_min .. t*_max``): (position lo, hi; time lo, hi;
    int32 time offsets u, w of queries and keys; time tile narrow: at most ``SPAN_TIME`` buckets and
    exact offsets)."""
    p_lo = 0
    p_hi = 0
    t_lo = 0
    t_hi = 0
    u = q_first
    w = k_first
    t_narrow = False
    if HAS_POS:
        p_lo, p_hi = pos_span(q_first, q_last, k_first, k_last, NUM_POS)
    if HAS_TIME:
        t_lo, t_hi, exact = time_span(tq_min, tq_max, tk_min, tk_max, NUM_TIME)
        t_narrow = exact & (t_hi - t_lo < SPAN_TIME)
        u = time_offsets(ts_q, tk_min)
        w = time_offsets(ts_k, tk_min)
    return p_lo, p_hi, t_lo, t_hi, u, w, t_narrow


@triton.jit
def add_bias_span(s, pos_q, pos_k, p_lo, p_hi, ts_q, ts_k, u, w, t_lo, t_hi, t_narrow, h, POSW, TIMEW, bias_scale,
                  H: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr,
                  NUM_TIME: tl.constexpr, POS_PAD: tl.constexpr, TIME_PAD: tl.constexpr):
    """``s`` plus the position and time bias of a tile (spans and offsets from ``tile_spans``; ``*_PAD``:
    the table sizes rounded up to powers of two, from ``TABLE_PADS``)."""
    if HAS_POS:
        s = add_table_span(s, POSW, pos_q, pos_k, pos_q, pos_k, p_hi - p_lo < SPAN_POS, p_lo, p_hi, h, bias_scale, H,
                           NUM_POS, POS_PAD, True, SPAN_POS)
    if HAS_TIME:
        s = add_table_span(s, TIMEW, ts_q, ts_k, u, w, t_narrow, t_lo, t_hi, h, bias_scale, H, NUM_TIME,
                           TIME_PAD, False, SPAN_TIME)
    return s


@triton.jit
def diagonal_grad(acc, ds, base, NUM: tl.constexpr, PAD: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """``acc`` ([PAD] per-bucket sums of a position table's gradient) plus a tile's score gradients ``ds``
    (zero outside visible pairs), whose pair (a, n) sits at relative position ``base + a - n``.

    The position bucket is constant along a diagonal, so the tile is summed by diagonal: row ``a`` is
    rotated left by ``a`` (a gather), which puts diagonal ``a - n = k * BLOCK_N - c`` in column ``c`` of
    the rows with ``(a + c) // BLOCK_N == k``; one column sum per k, then each diagonal's sum goes to its
    bucket. No per-score atomics, whatever the tile's span; gathers keep the register use low."""
    a = tl.arange(0, BLOCK_M)[:, None]
    c = tl.arange(0, BLOCK_N)[None, :]
    rot = tl.gather(ds, (a + c) % BLOCK_N, axis=1)
    wrap = (a + c) // BLOCK_N
    cols = tl.arange(0, BLOCK_N)
    ar = tl.arange(0, PAD)
    half: tl.constexpr = (NUM - 1) // 2
    for k in tl.static_range((BLOCK_M + BLOCK_N - 2) // BLOCK_N + 1):
        diag = tl.sum(tl.where(wrap == k, rot, 0.0), axis=0)
        rel = base + k * BLOCK_N - cols
        if NUM == 1:
            acc += tl.where(ar == 0, tl.sum(diag), 0.0)
        else:
            # Inner buckets 1 .. NUM - 2 hold one relative position each (bucket b: column
            # base + k * BLOCK_N + half - b), read with a gather; the two end buckets sum the clamped rest.
            col = base + k * BLOCK_N + half - ar
            inner = (ar >= 1) & (ar <= NUM - 2) & (col >= 0) & (col < BLOCK_N)
            acc += tl.where(inner, tl.gather(diag, tl.minimum(tl.maximum(col, 0), BLOCK_N - 1), 0), 0.0)
            top = tl.sum(tl.where(rel >= NUM - 1 - half, diag, 0.0))
            bottom = tl.sum(tl.where(rel <= -half, diag, 0.0))
            acc += tl.where(ar == NUM - 1, top, 0.0) + tl.where(ar == 0, bottom, 0.0)
    return acc


@triton.jit
def table_grad_span(acc, DT, ds, total, at_q, at_k, rq, rk, narrow, ok, lo, hi, base, h, H: tl.constexpr,
                    NUM: tl.constexpr, PAD: tl.constexpr, IS_POS: tl.constexpr, SPAN: tl.constexpr,
                    WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """One tile's score gradients ``ds`` (zero outside visible pairs; ``total`` their sum) added into
    ``acc``, a program's [PAD] per-bucket sums of one table's gradient (``flush_table_grad`` adds them to
    the table once, at the program's end). Buckets ``lo .. hi`` (``tile_spans``):

    * ``narrow`` (as in ``add_table_span``): bucket ``lo`` takes ``total``, then one masked sum S(c) per
      threshold c (the sum at buckets >= c) moves S(c) from bucket c - 1 to bucket c;
    * wider, in the loops over tiles near the diagonal (``WIDE``): positions sum by diagonal
      (``diagonal_grad``); time takes one masked sum per bucket of the span (a loop);
    * wider, in the long loops (not ``WIDE``, kept free of nested loops and of the diagonal sums' registers
      so the compiler pipelines them): one atomic per score into ``DT[bucket, h]``. Position tiles there
      lie beyond the table's reach (``near_tiles``), so they hold one bucket; wide time tiles there are rare
      on histories in time order.
    """
    ar = tl.arange(0, PAD)
    if narrow:
        acc += tl.where(ar == lo, total, 0.0)
        for r in tl.static_range(1, SPAN):
            if lo + r <= hi:
                above = tl.sum(tl.where(at_or_above(rq, rk, lo + r, NUM, IS_POS), ds, 0.0))
                acc += tl.where(ar == lo + r, above, 0.0) - tl.where(ar == lo + r - 1, above, 0.0)
    elif WIDE:
        if IS_POS:
            acc = diagonal_grad(acc, ds, base, NUM, PAD, BLOCK_M, BLOCK_N)
        else:
            bkt = bucket_tile(at_q, at_k, NUM, IS_POS)
            for b in range(lo, hi + 1):
                acc += tl.where(ar == b, tl.sum(tl.where(bkt == b, ds, 0.0)), 0.0)
    else:
        tl.atomic_add(DT + bucket_tile(at_q, at_k, NUM, IS_POS) * H + h, ds, mask=ok)
    return acc


@triton.jit
def tile_table_grads(dpos, dtime, DPOSW, DTIMEW, ds, ok, pos_q, pos_k, ts_q, ts_k, p_lo, p_hi, t_lo, t_hi, u, w,
                     t_narrow, base, h, H: tl.constexpr, HAS_POS: tl.constexpr, NUM_POS: tl.constexpr,
                     POS_PAD: tl.constexpr, HAS_TIME: tl.constexpr, NUM_TIME: tl.constexpr, TIME_PAD: tl.constexpr,
                     WIDE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A [queries, keys] tile's score gradients ``ds`` added into a program's per-bucket sums of both tables
    (``table_grad_span``); spans and bucket helpers from ``tile_spans``, ``base`` the relative position of the
    tile's first pair."""
    total = tl.sum(ds)
    if HAS_POS:
        dpos = table_grad_span(dpos, DPOSW, ds, total, pos_q, pos_k, pos_q, pos_k, p_hi - p_lo < SPAN_POS, ok, p_lo,
                               p_hi, base, h, H, NUM_POS, POS_PAD, True, SPAN_POS, WIDE, BLOCK_M, BLOCK_N)
    if HAS_TIME:
        dtime = table_grad_span(dtime, DTIMEW, ds, total, ts_q, ts_k, u, w, t_narrow, ok, t_lo, t_hi, base, h, H,
                                NUM_TIME, TIME_PAD, False, SPAN_TIME, WIDE, BLOCK_M, BLOCK_N)
    return dpos, dtime


@triton.jit
def near_tiles(mid, end, k_first, k_last, shift, BLOCK_M: tl.constexpr, HAS_POS: tl.constexpr,
               NUM_POS: tl.constexpr, HAS_TIME: tl.constexpr, TIME_REACH: tl.constexpr):
    """[a, b): the tiles of queries ``mid + j * BLOCK_M`` (up to ``end``) near a KV tile at positions
    ``k_first .. k_last`` (queries at ``shift + index``): within the position table's reach, past which
    every pair clamps to an end bucket (so farther tiles hold one position bucket), or within
    ``TIME_REACH`` positions, where log time buckets change fastest."""
    reach = 0
    if HAS_POS:
        reach = NUM_POS - 1 - (NUM_POS - 1) // 2  # relative positions past +-reach clamp to an end bucket
    if HAS_TIME:
        reach = tl.maximum(reach, TIME_REACH)
    lo_pos = k_first - reach - shift - mid  # first query index (from mid) a near tile may reach
    hi_pos = k_last + reach - shift - mid  # last one
    a = mid + tl.cdiv(tl.maximum(lo_pos - BLOCK_M + 1, 0), BLOCK_M) * BLOCK_M
    b = mid + (tl.maximum(hi_pos, -1) // BLOCK_M + 1) * BLOCK_M
    b = tl.where(hi_pos < 0, mid, b)
    a = tl.minimum(a, end)
    b = tl.maximum(tl.minimum(b, end), a)
    return a, b


@triton.jit
def flush_table_grad(DT, acc, h, H: tl.constexpr, NUM: tl.constexpr, PAD: tl.constexpr):
    """Add a program's per-bucket sums into the table gradient ``DT[:, h]`` (one vector of atomics)."""
    ar = tl.arange(0, PAD)
    tl.atomic_add(DT + ar * H + h, acc, mask=ar < NUM)
