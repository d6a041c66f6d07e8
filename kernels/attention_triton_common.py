"""Triton helpers shared by the jagged attention kernels: configurations, visibility, loop ranges, tile
loads, the softmax step, activations (the bias helpers: ``kernels.attention_triton_bias``).

The rules are those of ``kernels.attention_spec``; the KV (or Q) loop range of a tile is the smallest
interval of positions the rules allow, so block-local and windowed attention never touch keys outside
the block or window (O(L*S) / O(L*W) work).
"""

from __future__ import annotations

import functools
import os
import threading

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from kernels import triton_launch

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
# GEMTRAIN_ATTN_AUTOTUNE=0 uses one configuration per kernel (fast compile for correctness runs).
AUTOTUNE = os.environ.get("GEMTRAIN_ATTN_AUTOTUNE", "1") != "0"
LOG2E = tl.constexpr(1.4426950408889634)

# GEMTRAIN_ATTN_TMA: "auto" streams tiles through tensor descriptors (bulk tensor copies) on Hopper and
# newer when the head dim is a power of two; "1" forces them (also under the interpreter), "0" never.
TMA = os.environ.get("GEMTRAIN_ATTN_TMA", "auto")

ACT_CODES = {"softmax": 0, "silu": 1, "gelu": 2}
SMEM_LIMIT = 232448  # bytes of shared memory per block on Hopper (H100/H200)


def use_tma(tensors: list[torch.Tensor], head_dim: int, block_d: int, pays: bool = True) -> bool:
    """Whether the kernels stream tiles through tensor descriptors for these operands. ``pays``: whether the
    call is large enough for them (``attention_op.descriptors_pay``); "auto" needs it, "1" does not."""
    if TMA == "0" or head_dim != block_d or any(t.data_ptr() % 16 for t in tensors):
        return False
    t = tensors[0]
    if TMA != "1" and not (pays and on_hopper(t)):
        return False
    if t.is_cuda:
        bind_context(t.device)
    return True


def on_hopper(t: torch.Tensor) -> bool:
    """Whether ``t`` lives on a GPU with the bulk tensor copy engine (sm_90+), outside the interpreter."""
    return t.is_cuda and not INTERPRET and _major(t.device.index) >= 9


@functools.cache
def _major(index: int | None) -> int:
    return torch.cuda.get_device_capability(index)[0]  # a driver query per call: ~10 us of host time


_THREAD = threading.local()


def bind_context(device: torch.device) -> None:
    """Make ``device``'s CUDA context current on this thread, once per thread and device.

    Triton encodes a launch's tensor descriptors before its launcher binds a context, so the first launch
    with descriptors on a thread that has not used the CUDA runtime yet fails with "invalid device context".
    Autograd's device thread is such a thread when the backward's kernels were compiled on another one and
    nothing in the backward launched a CUDA kernel before them. A stream query binds the primary context.
    """
    bound = _THREAD.__dict__.setdefault("devices", set())
    if device.index not in bound:
        torch.cuda.current_stream(device).query()
        bound.add(device.index)


def descriptor(t: torch.Tensor, enabled: bool) -> torch.Tensor | TensorDescriptor:
    """A ``[tokens, H*D]`` descriptor of a contiguous ``[tokens, H, D]`` tensor (block shape set by
    ``descriptor_hook`` per configuration), or the tensor itself when descriptors are off."""
    if not enabled:
        return t
    tokens, heads, dim = t.shape
    return TensorDescriptor(t, [tokens, heads * dim], [heads * dim, 1], [16, dim])


def descriptor_hook(rows: str, *names: str):
    """Autotune ``pre_hook``: descriptor blocks of ``rows`` (a config or launch key) x BLOCK_D."""

    def hook(nargs: dict) -> None:
        for name in names:
            if isinstance(nargs[name], TensorDescriptor):
                nargs[name].block_shape = [nargs[rows], nargs["BLOCK_D"]]

    return hook


def kernel_configs(inner: str, defaults: dict[int, tuple[int, int, int]], candidates: list[tuple[int, int, int]],
                   hook) -> list[triton.Config]:
    """Configurations ``(inner tile, warps, stages)`` of one kernel: the default of each head-dim class
    first (``defaults``: largest ``BLOCK_D`` it serves -> config), then the autotuning candidates.
    ``config_prune`` keeps the head dim's default alone when autotuning is off."""
    hook_cfg = lambda t: triton.Config({inner: t[0]}, num_warps=t[1], num_stages=t[2], pre_hook=hook)
    if INTERPRET:
        return [hook_cfg((32, 4, 1))]
    firsts = [hook_cfg(t) for t in defaults.values()]
    for cfg, bound in zip(firsts, defaults):
        cfg.default_for = bound
    if not AUTOTUNE:
        return firsts
    seen = set(defaults.values())
    return firsts + [hook_cfg(t) for t in candidates if t not in seen and not seen.add(t)]


# What each autotuned kernel settled on, per launch key (``launch``): its JIT function, the configuration's
# ``pre_hook`` and every keyword argument of the launch (meta-parameters, configuration, heuristics).
_SETTLED: dict[tuple, tuple] = {}


def launch(kernel, grid: tuple, args: tuple, meta: dict, key: tuple) -> None:
    """``kernel[grid](*args, **meta)`` for an autotuned kernel (optionally wrapped in ``triton.heuristics``).

    The first launch per ``key`` goes through the autotuner; later ones launch the JIT function's compiled
    kernel with the configuration it chose (``triton_launch.run``; the configuration's ``pre_hook`` applied
    here), which skips the autotuner's and the JIT's per-launch bookkeeping: host time that short batches pay
    in full (benchmarks/RESULTS.md, "Host time per launch"). ``key`` must determine the configuration:
    everything the kernel's autotuning key and pruning read that ``meta`` does not already hold (length bucket,
    dtypes). Heuristics are evaluated once per key, so they must depend on ``meta`` and the configuration only
    (``TABLE_PADS`` does).
    """
    full_key = (kernel, id(kernel.configs), key, tuple(meta.items()))
    settled = _SETTLED.get(full_key)
    if settled is None:
        kernel[grid](*args, **meta)
        config = kernel.best_config
        kwargs = {**meta, **config.all_kwargs()}
        named = {**dict(zip(kernel.arg_names, args)), **kwargs}
        fn = kernel.fn
        while isinstance(fn, triton.runtime.Heuristics):
            kwargs.update((name, rule(named)) for name, rule in fn.values.items())
            fn = fn.fn
        _SETTLED[full_key] = (fn, config.pre_hook, kwargs)
        return
    fn, pre_hook, kwargs = settled
    if pre_hook is not None and any(type(a) is TensorDescriptor for a in args):  # the hooks size descriptors only
        pre_hook({**dict(zip(kernel.arg_names, args)), **kwargs})
    triton_launch.run(fn, grid, *args, **kwargs)


def config_prune(inner: str, outer: str):
    """``early_config_prune``: without autotuning the default for this head dim; then what fits in
    shared memory (``smem_prune``)."""
    smem = smem_prune(inner, outer)

    def prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
        if not AUTOTUNE:
            block_d = kwargs["BLOCK_D"]
            marked = sorted((c for c in configs if hasattr(c, "default_for")), key=lambda c: c.default_for)
            configs = [next((c for c in marked if block_d <= c.default_for), marked[-1])] if marked else configs
        return smem(configs, nargs, **kwargs)

    return prune


def smem_prune(inner: str, outer: str):
    """``early_config_prune`` dropping configs whose pipelined tiles cannot fit in shared memory.

    Estimate: the resident ``outer`` tile plus two streamed ``inner`` tiles per extra pipeline stage,
    each ``BLOCK_D`` wide (fits the compiler's figures: 344 KB for fp32, D=256, 64/64 tiles, 3 stages).
    Keeps a small single-stage config when nothing else fits (fp32 with D=256).
    """

    def prune(configs: list[triton.Config], nargs: dict, **kwargs) -> list[triton.Config]:
        elsize = nargs["Q"].element_size()
        width, resident = kwargs["BLOCK_D"], kwargs[outer]
        keep = [c for c in configs
                if 1.1 * elsize * width * (resident + 2 * max(c.num_stages - 1, 1) * c.kwargs[inner]) <= SMEM_LIMIT]
        hook = configs[0].pre_hook if configs else None
        return keep or [triton.Config({inner: 16}, num_warps=4, num_stages=1, pre_hook=hook)]

    return prune


@triton.jit
def row_extent(QO, KO, NT, row, HAS_NT: tl.constexpr):
    """Where jagged row ``row`` lies: first query token, query length, first KV token, KV length (token starts
    int64), and ``hist_end``, the KV length less the row's ``NT`` target tokens (the KV length without them)."""
    q_start = tl.load(QO + row).to(tl.int64)
    q_len = (tl.load(QO + row + 1) - q_start).to(tl.int32)
    kv_start = tl.load(KO + row).to(tl.int64)
    kv_len = (tl.load(KO + row + 1) - kv_start).to(tl.int32)
    hist_end = kv_len
    if HAS_NT:
        hist_end = kv_len - tl.load(NT + row).to(tl.int32)
    return q_start, q_len, kv_start, kv_len, hist_end


@triton.jit
def score_scales(scale, ACT: tl.constexpr):
    """(factor of q·k, factor of the bias): softmax runs in base 2 (exp2), pointwise activations in base e."""
    if ACT == 0:
        return scale * LOG2E, LOG2E
    else:
        return scale, 1.0


@triton.jit
def visible(pos_q, pos_k, kv_len, hist_end, window,
            CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Boolean tile: key at ``pos_k`` visible to query at ``pos_q`` (broadcast [M, 1] x [1, N])."""
    ok = (pos_k < kv_len) & (pos_k >= 0)
    if HAS_NT:
        ok = ok & ((pos_k < hist_end) | (pos_k == pos_q))
    if CAUSAL:
        ok = ok & (pos_k <= pos_q)
    if BLOCK_S > 0:
        # Both sides are >= 0 where this can hold, so truncating division is floor division.
        ok = ok & (pos_q >= 0) & ((pos_k // BLOCK_S) == (pos_q // BLOCK_S))
    if HAS_WINDOW:
        ok = ok & (pos_k >= pos_q - window)
        if not CAUSAL:
            ok = ok & (pos_k <= pos_q + window)
    return ok


@triton.jit
def kv_range(pq_lo, pq_hi, kv_len, window,
             CAUSAL: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Half-open key-position range that queries at positions [pq_lo, pq_hi] can see."""
    lo = 0
    hi = kv_len
    if CAUSAL:
        hi = tl.minimum(hi, pq_hi + 1)
    if BLOCK_S > 0:
        lo = tl.maximum(lo, (tl.maximum(pq_lo, 0) // BLOCK_S) * BLOCK_S)
        hi = tl.minimum(hi, (tl.maximum(pq_hi, 0) // BLOCK_S + 1) * BLOCK_S)
    if HAS_WINDOW:
        lo = tl.maximum(lo, pq_lo - window)
        if CAUSAL:
            hi = tl.minimum(hi, pq_hi + 1)
        else:
            hi = tl.minimum(hi, pq_hi + window + 1)
    return lo, hi


@triton.jit
def q_range(pk_lo, pk_hi, q_len, kv_len, window,
            CAUSAL: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Half-open query-index range whose queries can see a key at positions [pk_lo, pk_hi]."""
    shift = kv_len - q_len  # query i sits at position shift + i
    lo = 0
    hi = q_len
    if CAUSAL:
        lo = tl.maximum(lo, pk_lo - shift)
    if BLOCK_S > 0:
        lo = tl.maximum(lo, (pk_lo // BLOCK_S) * BLOCK_S - shift)
        hi = tl.minimum(hi, (pk_hi // BLOCK_S + 1) * BLOCK_S - shift)
    if HAS_WINDOW:
        if CAUSAL:
            lo = tl.maximum(lo, pk_lo - shift)
        else:
            lo = tl.maximum(lo, pk_lo - window - shift)
        hi = tl.minimum(hi, pk_hi + window + 1 - shift)
    return lo, hi


@triton.jit
def unmasked_kv_end(lo, pq_lo, kv_len, hist_end, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, HAS_NT: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """End of the whole KV tiles from ``lo`` that every query at positions >= ``pq_lo`` sees in full.

    Those tiles (strictly below the causal diagonal, inside the history) need neither the visibility
    mask nor key bounds; tiles from the returned position on take the masked path. Block-local and
    window attention return ``lo`` (every tile masked: they are at most a few tiles long).
    """
    end = lo
    if BLOCK_S == 0 and not HAS_WINDOW:
        lim = kv_len
        if CAUSAL:
            lim = tl.minimum(lim, pq_lo + 1)
        if HAS_NT:
            lim = tl.minimum(lim, hist_end)
        end = lo + (tl.maximum(lim - lo, 0) // BLOCK_N) * BLOCK_N
    return end


@triton.jit
def unmasked_q_start(lo, hi, pk_hi, shift, hist_end, BLOCK_M: tl.constexpr,
                     CAUSAL: tl.constexpr, BLOCK_S: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """First query index (``lo`` + a whole number of tiles, at most ``hi``) from which every query sees
    every key of the KV tile ending at position ``pk_hi`` (inclusive); ``hi`` when none does.

    The tile must lie inside the history (``pk_hi < hist_end``, so also inside the row); with ``causal``
    the query must sit at or after ``pk_hi``.
    """
    start = hi
    if BLOCK_S == 0 and not HAS_WINDOW:
        if pk_hi < hist_end:
            first = lo
            if CAUSAL:
                first = tl.maximum(lo, pk_hi - shift)
            start = tl.minimum(lo + tl.cdiv(first - lo, BLOCK_M) * BLOCK_M, hi)
    return start


@triton.jit
def load_rows(ptrs, row_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr):
    """Load a [rows, BLOCK_D] tile, masking rows only when asked and columns only when D is padded."""
    if MASK_ROWS:
        return tl.load(ptrs, mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    elif EVEN_D:
        return tl.load(ptrs)
    else:
        return tl.load(ptrs, mask=d_ok[None, :], other=0.0)


@triton.jit
def stream_tile(DESC, ptrs, row0, col0, row_ok, d_ok, MASK_ROWS: tl.constexpr, EVEN_D: tl.constexpr,
                USE_TMA: tl.constexpr):
    """A [rows, BLOCK_D] tile of an operand streamed through a loop.

    ``USE_TMA``: one bulk tensor copy through ``DESC``, a descriptor over the whole ``[tokens, H*D]``
    tensor (Hopper's copy engine, pipelined by the compiler). Rows past the jagged row then hold the
    next row's tokens (zeros past the tensor): callers mask their scores, as they do on masked tiles.
    Otherwise a pointer load with ``load_rows``.
    """
    if USE_TMA:
        return DESC.load([row0.to(tl.int32), col0])
    else:
        return load_rows(ptrs, row_ok, d_ok, MASK_ROWS, EVEN_D)


@triton.jit
def stream_rows(A, B, AD, BD, TS, row_start, first, end, h, offs_d, d_ok, H: tl.constexpr,
                HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr, MASKED: tl.constexpr, EVEN_D: tl.constexpr,
                USE_TMA: tl.constexpr, HAS_TIME: tl.constexpr):
    """The tile of rows ``first .. first + BLOCK`` of a jagged row starting at token ``row_start``, from
    two ``[tokens, H, D]`` operands streamed together (K and V, or Q and dO) and their timestamps:
    (offsets in the row, offset < ``end``, A tile, B tile, timestamps)."""
    offs = first + tl.arange(0, BLOCK)
    ok = offs < end
    rows = (row_start + offs)[:, None] * (H * HEAD_DIM) + h * HEAD_DIM + offs_d[None, :]
    a = stream_tile(AD, A + rows, row_start + first, h * HEAD_DIM, ok, d_ok, MASKED, EVEN_D, USE_TMA)
    b = stream_tile(BD, B + rows, row_start + first, h * HEAD_DIM, ok, d_ok, MASKED, EVEN_D, USE_TMA)
    return offs, ok, a, b, load_times(TS, row_start, offs, ok, MASKED, HAS_TIME)


@triton.jit
def load_vec(ptrs, ok, other, MASKED: tl.constexpr):
    """A per-token vector (timestamps, log-sum-exp, delta): masked by ``ok`` only when asked."""
    if MASKED:
        return tl.load(ptrs, mask=ok, other=other)
    else:
        return tl.load(ptrs)


@triton.jit
def load_times(TS, start, offs, ok, MASKED: tl.constexpr, HAS_TIME: tl.constexpr):
    """Timestamps of the tokens ``start + offs`` (``offs`` itself when there is no time bias)."""
    if HAS_TIME:
        return load_vec(TS + start + offs, ok, 0, MASKED)
    else:
        return offs


@triton.jit
def softmax_step(s, m_i, l_i, ok, MASKED: tl.constexpr):
    """One tile of the online softmax (base 2): (p, alpha, new max, new sum). ``MASKED``: scores outside
    ``ok`` are dropped, and a query that has seen no key yet keeps a finite reference of 0."""
    if MASKED:
        s = tl.where(ok, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = m_new
    if MASKED:
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_ref[:, None])
    alpha = tl.exp2(m_i - m_ref)
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


@triton.jit
def score_grads(s, dp, lse, delta, ok, inv_n, ACT: tl.constexpr, MASKED: tl.constexpr, FAST: tl.constexpr = False,
                KEY_ROWS: tl.constexpr = False):
    """(p, ds) of a tile: softmax ``p = exp2(s - lse)``, ``ds = p * (dp - delta)``; pointwise
    ``p = act(s) / n``, ``ds = dp * act'(s) / n`` (``FAST``: see ``act_fwd``). ``MASKED``: zero outside
    ``ok`` (where a neighbour row's token may give a non-finite ``dp``, and ``lse`` may be +inf).
    ``KEY_ROWS``: the tile is transposed, [keys, queries] (``lse`` and ``delta`` run along its columns)."""
    if ACT == 0:
        if KEY_ROWS:
            p = tl.exp2(s - lse[None, :])
            ds = p * (dp - delta[None, :])
        else:
            p = tl.exp2(s - lse[:, None])
            ds = p * (dp - delta[:, None])
    else:
        a, da = act_fwd_bwd(s, ACT, FAST)
        p = a * inv_n
        ds = dp * da * inv_n
    if MASKED:
        p = tl.where(ok, p, 0.0)
        ds = tl.where(ok, ds, 0.0)
    return p, ds


# The GPU's one-instruction tanh (``tanh.approx.f32``, max relative error ~2^-11) serves the pointwise
# activations of bf16 inputs, whose products are rounded to 2^-8 anyway: one special-function op per score
# instead of two (exp and reciprocal); fp16/fp32 inputs and the interpreter keep the exact formulas.
FAST_TANH = tl.constexpr(not INTERPRET and torch.version.hip is None)  # a PTX instruction: NVIDIA only


@triton.jit
def fast_act(x):
    """Whether tiles of ``x``'s dtype take the approximate tanh (bf16 on the GPU)."""
    return FAST_TANH and x.dtype == tl.bfloat16


@triton.jit
def tanh_approx(x):
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32, is_pure=True, pack=1)


@triton.jit
def sigmoid(x, FAST: tl.constexpr = False):
    if FAST:
        return 0.5 + 0.5 * tanh_approx(0.5 * x)
    else:
        return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def _gelu_tanh(s, FAST: tl.constexpr):
    u = 0.7978845608028654 * (s + 0.044715 * s * s * s)
    if FAST:
        return tanh_approx(u)
    else:
        return 2.0 * sigmoid(2.0 * u) - 1.0


@triton.jit
def act_fwd(s, ACT: tl.constexpr, FAST: tl.constexpr = False):
    """silu (ACT=1) or tanh-approximated gelu (ACT=2) of a float32 tile; ``FAST`` (``fast_act``): through
    the GPU's approximate tanh."""
    if ACT == 1:
        return s * sigmoid(s, FAST)
    else:
        return 0.5 * s * (1.0 + _gelu_tanh(s, FAST))


@triton.jit
def act_fwd_bwd(s, ACT: tl.constexpr, FAST: tl.constexpr = False):
    """(act(s), act'(s)) for silu (ACT=1) or tanh-approximated gelu (ACT=2)."""
    if ACT == 1:
        sg = sigmoid(s, FAST)
        return s * sg, sg * (1.0 + s * (1.0 - sg))
    else:
        t = _gelu_tanh(s, FAST)
        du = 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * s * s)
        return 0.5 * s * (1.0 + t), 0.5 * (1.0 + t) + 0.5 * s * (1.0 - t * t) * du
