"""benchmarks/fp8_linear.py's layer table on CPU: with ``rounds`` the baseline and every variant are timed in
turn each round, the table holds each one's median and its per-round ratio to the same round's baseline, and a
variant that cannot be built is reported with its error instead of stopping the table. The timer is replaced
by a scripted one (the timings themselves are the GPU's); the layers run for real (emulated FP8 recipe)."""

from __future__ import annotations

import statistics

from benchmarks import fp8_linear as bench


def test_rounds_alternate_and_report_medians_and_per_round_ratios(monkeypatch):
    # round r: baseline 2+r ms, the FP8 variant 1+r ms (so per-round ratios (2+r)/(1+r))
    script = iter([2.0, 1.0, 3.0, 2.0, 4.0, 3.0])
    order = []

    def fake_bench(fn, rep=100):
        fn()  # the step runs: forward, backward and the optimizer hook
        t = next(script)
        order.append(t)
        return t

    monkeypatch.setattr(bench, "bench", fake_bench)
    variants = [("tensorwise delayed", dict(recipe="tensorwise", scaling="delayed", emulate=True)),
                ("broken", dict(recipe="fp4"))]
    rows = {r["variant"]: r for r in bench.time_linears("cpu", [("t", 64, 32, 48)], variants, rounds=3)}
    assert order == [2.0, 1.0, 3.0, 2.0, 4.0, 3.0]  # baseline, variant, baseline, variant, ...
    base, fp8 = rows["bf16 nn.Linear"], rows["tensorwise delayed"]
    assert base["ms"] == 3.0 and base["rounds"] == [2.0, 3.0, 4.0]
    assert fp8["ms"] == statistics.median([1.0, 2.0, 3.0]) and fp8["ratio"] == 3.0 / 2.0
    assert fp8["ratios"] == [2.0, 1.5, 4.0 / 3.0]
    assert "fp4" in rows["broken"]["error"] and rows["broken"]["ms"] != rows["broken"]["ms"]  # NaN time


def test_mlp_target_line_reads_the_best_recipe_over_both_large_shapes():
    row = lambda shape, variant, ratio, **kw: dict(shape=shape, variant=variant, ratio=ratio, **kw)
    up, down = "mlp up 65536x1024->4096", "mlp down 65536x4096->1024"
    rows = [row(up, "bf16 nn.Linear", 1.0), row(down, "bf16 nn.Linear", 1.0),
            row(up, "a", 1.50), row(down, "a", 1.38),  # fastest on up, short on down
            row(up, "b", 1.44), row(down, "b", 1.41),
            row(up, "c", 1.60), row(down, "c", float("nan"), error="failed"),  # not timed on both: left out
            row("interaction 4096x512->512", "d", 3.0)]
    line = bench.mlp_target_line(rows)
    assert line.endswith(f"b, 1.41x ({up} 1.44x, {down} 1.41x): met"), line
    assert bench.mlp_target_line(rows, target=1.45).endswith("not met")
    assert "no variant" in bench.mlp_target_line([row(up, "bf16 nn.Linear", 1.0)])
