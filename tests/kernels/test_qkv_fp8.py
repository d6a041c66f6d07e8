"""The FP8 QKV projection whose e4m3 outputs feed the FP8 attention kernel (``kernels.qkv_fp8``): its codes
against an emulation of the same quantized arithmetic, V's transposed layout, and the attention on the codes
(interpreter) against float64."""

from __future__ import annotations

import pytest
import torch

from kernels import mx
from kernels.attention_fp8_op import fp8_fwd_quantized
from kernels.attention_ref import jagged_attention_ref
from kernels.qkv_fp8 import attention, pow2_scale, qkv_codes, quantize_qkv_weight
from tests.kernels.attention_cases import rel_err

F8 = torch.float8_e4m3fn
FP8_REL_BOUND = 0.08  # as tests/kernels/test_attention_fp8.py: the FP8 forward against float64
LENS = [0, 1, 17, 40, 16, 3]
HEADS, DIM = 2, 32


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    d = HEADS * DIM
    total = sum(LENS)
    offsets = torch.tensor([0, *torch.tensor(LENS).cumsum(0).tolist()])
    x = torch.randn(total, d, generator=g)
    w = torch.randn(3 * d, d, generator=g) / d**0.5
    b = torch.randn(3 * d, generator=g) * 0.3
    exact = (x.double() @ w.double().t() + b.double()).chunk(3, dim=1)
    scales = torch.stack([pow2_scale(t.abs().max() if i < 2 else (t - b.double().chunk(3)[2]).abs().max())
                          for i, t in enumerate(exact)])
    return x, w, b, offsets, exact, scales


def _emulated(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, scales: torch.Tensor) -> list[torch.Tensor]:
    """q, k, v (v without its bias) as dequantized x codes times dequantized weight codes, in fp32, then
    e4m3 codes in units of their scales (saturating); the bias enters in bf16 in those units, as the GEMM's
    epilogue takes it."""
    xs = mx.quantize_tensorwise_ref(x)
    xd = xs.data.float() * xs.scale
    out = []
    for i, (wi, bi) in enumerate(zip(w.chunk(3), b.chunk(3))):
        ws = mx.quantize_tensorwise_ref(wi)
        y = xd @ (ws.data.float() * ws.scale).t() / scales[i]
        if i < 2:
            y = y + (bi / scales[i]).to(torch.bfloat16).float()
        out.append(y.clamp(-448.0, 448.0).to(F8))
    return out


def _close_codes(got: torch.Tensor, want: torch.Tensor) -> None:
    """Equal codes but for the GEMM's summation order: at most one e4m3 step apart (a relative 2^-3, or the
    subnormal step 2^-9 near zero), on few elements."""
    a, b = got.float(), want.float()
    assert torch.all((a - b).abs() <= b.abs() * 2.0**-3 + 2.0**-9 + 1e-6)
    assert (got.view(torch.uint8) != want.view(torch.uint8)).float().mean() < 0.01


def test_codes_match_the_emulated_projection_in_the_kernels_layouts():
    x, w, b, offsets, _, scales = _problem()
    codes = qkv_codes(x, quantize_qkv_weight(w), b, offsets, HEADS, scales)
    eq, ek, ev = _emulated(x, w, b, scales)
    total = x.shape[0]
    _close_codes(codes.q.data.reshape(total, -1), eq)
    _close_codes(codes.k.data.reshape(total, -1), ek)
    # V transposed: row b's tokens from column columns[b] on, every other column zero
    vt, cols = codes.v_transposed.data, codes.v_transposed.offsets.tolist()
    used = torch.zeros(vt.shape[1], dtype=torch.bool)
    for r, n in enumerate(LENS):
        s, c = int(offsets[r]), cols[r]
        assert c % 16 == 0
        _close_codes(vt[:, c:c + n].t(), ev[s:s + n]) if n else None
        used[c:c + n] = True
    assert torch.all(vt[:, ~used].view(torch.uint8) == 0)
    assert torch.equal(codes.v_bias, b.chunk(3)[2].view(HEADS, DIM))
    for t, s in ((codes.q, scales[0]), (codes.k, scales[1]), (codes.v, scales[2])):
        assert torch.all(t.scale == s)  # every scale block holds its tensor's scale


def test_attention_on_the_codes_is_within_the_fp8_bound_of_float64():
    x, w, b, offsets, exact, scales = _problem(1)
    codes = qkv_codes(x, quantize_qkv_weight(w), b, offsets, HEADS, scales)
    out = attention(codes, offsets, max(LENS), out_dtype=torch.float32)
    q, k, v = (t.view(-1, HEADS, DIM) for t in exact)
    ref = jagged_attention_ref(q, k, v, offsets, offsets, causal=True)
    assert rel_err(out.double(), ref) <= FP8_REL_BOUND
    # V's bias is the epilogue's: the same call without it is the output less the bias
    codes.v_bias = None
    assert torch.allclose(attention(codes, offsets, max(LENS), out_dtype=torch.float32) + b.chunk(3)[2].view(HEADS, DIM),
                          out, atol=1e-5)


def test_v_bias_needs_softmax_and_bad_weights_are_named(monkeypatch):
    from kernels import attention_triton_common
    from kernels.qkv_fp8 import projected_attention

    x, w, b, offsets, _, scales = _problem()
    codes = qkv_codes(x, quantize_qkv_weight(w), b, offsets, HEADS, scales)
    q = torch.empty(x.shape[0], HEADS, DIM)
    with pytest.raises(ValueError, match="v_bias needs softmax"):
        fp8_fwd_quantized(q, q, codes.q, codes.k, codes.v, codes.v_transposed, offsets, offsets, None, None, None,
                          None, None, "silu", True, 1.0, 0, -1, 0, 64, 0, codes.block, v_bias=codes.v_bias)
    with pytest.raises(ValueError, match="quantize_qkv_weight"):
        qkv_codes(x, quantize_qkv_weight(w)[:2], b, offsets, HEADS, scales)
    with pytest.raises(ValueError, match="nn.Linear"):
        quantize_qkv_weight(w[:-1])
    with pytest.raises(ValueError, match=r"weight must be \[3d, d\]"):
        projected_attention(x, w[:-1], b, offsets, HEADS)
    monkeypatch.setattr(attention_triton_common, "INTERPRET", False)  # a CPU run without the interpreter
    with pytest.raises(ValueError, match="attention_kernel fp8"):
        projected_attention(x, w, b, offsets, HEADS)


FP8_GRAD_REL_BOUND = 0.12  # as tests/kernels/test_attention_fp8.py: the straight-through backward


@pytest.mark.parametrize("with_tables", [False, True])
def test_projected_attention_trains_against_float64(with_tables):
    """``projected_attention``'s output and gradients (x, W, b, the bias tables) against float64 autograd of
    the same projection and attention."""
    from kernels import RelativeBias
    from kernels.qkv_fp8 import projected_attention

    x, w, b, offsets, _, _ = _problem(2)
    g = torch.Generator().manual_seed(7)
    total = x.shape[0]
    ts = torch.randint(0, 5000, (total,), generator=g).cumsum(0)
    pos = (torch.randn(129, HEADS, generator=g) * 0.5) if with_tables else None
    tim = (torch.randn(32, HEADS, generator=g) * 0.5) if with_tables else None
    dout = torch.randn(total, HEADS, DIM, generator=g)

    def run(dtype, fn):
        leaves = [t.detach().to(dtype).clone().requires_grad_() for t in [x, w, b] + ([pos, tim] if with_tables
                                                                                     else [])]
        out = fn(*leaves)
        out.double().mul(dout.double()).sum().backward()
        return out, [t.grad for t in leaves]

    def ours(xx, ww, bb, *tables):
        kw = dict(pos_weight=tables[0], time_weight=tables[1], timestamps=ts) if tables else {}
        return projected_attention(xx, ww, bb, offsets, HEADS, causal=True, max_len=max(LENS), dtype=torch.float32,
                                   **kw)  # fp32: the interpreter computes bf16 wrongly

    def exact(xx, ww, bb, *tables):
        q, k, v = ((xx @ ww.t() + bb).view(total, 3, HEADS, DIM)).unbind(1)
        bias = RelativeBias(tables[0], tables[1], ts, ts) if tables else None
        return jagged_attention_ref(q, k, v, offsets, offsets, causal=True, bias=bias)

    out, grads = run(torch.float32, ours)
    ref, ref_grads = run(torch.float64, exact)
    assert out.dtype == torch.float32
    assert rel_err(out.double(), ref) <= FP8_REL_BOUND
    for name, a, r in zip(["x", "W", "b", "pos", "time"], grads, ref_grads):
        assert rel_err(a.double(), r) <= FP8_GRAD_REL_BOUND, name


def test_policy_runs_self_attention_through_the_projection_route():
    """``attention_kernel: fp8_qkv``: self-attention runs ``projected_attention`` (the FP8 projection writes the
    attention's operands), within the FP8 bounds of the bf16 layer; non-softmax layers are refused by name."""
    from torch import nn

    from model.attention import SelfAttention
    from model.config import ModelConfig
    from model.embeddings import History
    from train.precision import PrecisionPolicy, apply_precision_policy

    torch.manual_seed(0)
    cfg = ModelConfig.from_dict({"d_model": 64, "num_heads": 2, "sequence_encoder": {"bias": {"time": True}}})
    model = nn.ModuleDict({"layers": nn.ModuleList([SelfAttention(cfg, "full", None, None)])})
    report = apply_precision_policy(model, PrecisionPolicy(attention_kernel="fp8_qkv"))
    assert report.attention == {"layers.0": "fp8_qkv"}
    layer = model["layers"][0]
    with torch.no_grad():  # tables away from zero, so their gradients are not trivially zero
        layer.pos_weight.normal_(0, 0.5)
        layer.time_weight.normal_(0, 0.5)
    offsets = torch.tensor([0, 30, 30, 50, 51])
    hist = History(tokens=torch.randn(51, 64), offsets=offsets, timestamps=torch.arange(51) * 40, max_length=30)
    grads = []
    for precision in ("fp8_qkv", "bf16"):
        layer.attention_precision = precision
        layer.zero_grad()
        x = hist.tokens.clone().requires_grad_()
        y = layer(x, hist)
        y.square().sum().backward()
        grads.append([y.detach(), x.grad] + [p.grad.clone() for p in (layer.qkv.weight, layer.pos_weight,
                                                                       layer.time_weight)])
    (y8, *g8), (y, *g) = grads
    assert 0 < rel_err(y8.double(), y.double()) <= FP8_REL_BOUND
    for name, a, r in zip(["x", "qkv.weight", "pos", "time"], g8, g):
        assert rel_err(a.double(), r.double()) <= FP8_GRAD_REL_BOUND, name
    layer.activation, layer.attention_precision = "silu", "fp8_qkv"
    with pytest.raises(ValueError, match="fp8_qkv needs softmax"):
        layer(hist.tokens, hist)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequantize_reads_both_layouts_exactly(dtype):
    """The backward's dequantize pass: row-major codes, and transposed codes with a gap between rows, against
    torch's conversion (powers-of-two scale: exact), the bias added in fp32."""
    from kernels.qkv_fp8 import dequantize, token_columns

    g = torch.Generator().manual_seed(4)
    lens = [5, 0, 33, 17]
    offsets = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()])
    total, d = sum(lens), 24
    codes = (torch.randn(total, d, generator=g) * 40).to(F8)
    codes.view(torch.uint8)[3, 4] = 0x7F  # a NaN code stays NaN
    scale, bias = torch.tensor(2.0**-5), torch.randn(d, generator=g)
    want = (codes.float() * scale).to(dtype)
    assert torch.equal(dequantize(codes, scale, dtype).nan_to_num(7.0), want.nan_to_num(7.0))
    columns = torch.tensor([0, 16, 16, 64, 96])  # rows at 16-aligned columns, zeros between
    cols = token_columns(offsets, columns, total)
    vt = torch.zeros(d, 96, dtype=F8)
    vt.view(torch.uint8)[:, cols] = codes.view(torch.uint8).t()
    got = dequantize(vt, scale, dtype, cols, bias)
    assert torch.equal(got.nan_to_num(7.0), (codes.float() * scale + bias).to(dtype).nan_to_num(7.0))
