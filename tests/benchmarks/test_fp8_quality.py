"""benchmarks/fp8_quality.py in its tiny CPU mode: every variant trains through the trainer, the table
compares held-out NE against bf16, and a repeat of the baseline is bit-for-bit the same on CPU."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest

from benchmarks import quality_stats as stats
from tests.conftest import REPO


def _load():
    spec = importlib.util.spec_from_file_location("fp8_quality", REPO / "benchmarks" / "fp8_quality.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.timeout(120)
def test_fp8_quality_cpu_mode(tmp_path, capsys):
    mod = _load()
    out = tmp_path / "q.json"
    names = "bf16,bf16 (repeat),tensorwise,tensorwise delayed,fp8 attention kernel,fp8 attention kernel fwd+bwd"
    rc = mod.main(["--cpu", "--steps", "3", "--variants", names, "--run-root", str(tmp_path / "runs"),
                   "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert list(res) == names.split(",")
    for name, s in res.items():
        assert s["steps"] == 3 and s["eval_rows"] > 0, name
        assert all(math.isfinite(s["eval"][t][m]) for t in ("click", "conversion")
                   for m in ("ne", "ne_recalibrated", "ne_expected")), name
    diffs = stats.max_rel_diff(res)
    assert diffs["bf16 (repeat)"] == 0.0  # same seed, data and steps: CPU runs are deterministic
    assert 0.0 < diffs["tensorwise"] < 0.05  # emulated FP8 changes the numbers, not the model
    assert 0.0 < diffs["fp8 attention kernel"] < 0.05
    # the same forward, the emulated FP8 backward: other gradients, so another trajectory after the first step
    assert 0.0 < diffs["fp8 attention kernel fwd+bwd"] < 0.05
    assert res["fp8 attention kernel fwd+bwd"]["eval"] != res["fp8 attention kernel"]["eval"]
    table = capsys.readouterr().out
    assert "| tensorwise |" in table and "rel. diff" in table and "FAILED" not in table
    assert "click recalibrated NE" in table and "conversion expected NE" in table
    # only the delayed-scaling run has amax rings to check: one row, its casts counted
    sat = table[table.index("## Delayed scaling: casts saturated"):].splitlines()
    assert sat[3].startswith("| tensorwise delayed | 1 | ") and not any(r.startswith("|") for r in sat[4:])
    assert res["tensorwise delayed"]["fp8_saturation"]["checked_casts"] > 0
    # all, x and dY casts as "N of M (P%)": each ring checked, the rings' counts summing to the run's
    checked = [int(c.split(" of ")[1].split()[0]) for c in sat[3].strip("| ").split(" | ")[2:5]]
    assert checked[0] == res["tensorwise delayed"]["fp8_saturation"]["checked_casts"] == checked[1] + checked[2]
    assert min(checked[1:]) > 0
    assert res["tensorwise"]["fp8_saturation"] is None


def test_saturation_table_reads_per_ring_counts_over_the_runs_that_kept_them():
    mod = _load()
    older = {"checked_casts": 10, "saturated_casts": 1, "max_amax_over_range": 2.0}  # totals only
    newer = {"checked_casts": 20, "saturated_casts": 4, "checked_x": 10, "saturated_x": 1, "checked_dy": 10,
             "saturated_dy": 3, "max_amax_over_range": 5.0}
    mixed = {"fast seed=1": {"fp8_saturation": older}, "fast seed=2": {"fp8_saturation": newer}}
    row = mod.saturation_table([mixed])[2]
    assert row == "| fast | 2 | 5 of 30 (16.67%) | 1 of 10 (10.00%); 1 of 2 runs | 3 of 10 (30.00%); 1 of 2 runs | 5 |"
    row = mod.saturation_table([{"fast seed=1": {"fp8_saturation": older}}])[2]
    assert row == "| fast | 1 | 1 of 10 (10.00%) | not kept | not kept | 2 |"


def test_variant_overrides_put_the_policy_in_the_precision_section():
    mod = _load()
    ov = mod.variant_overrides("blockwise wgrad=bf16", 7, None, cpu=True, extra=["--train.seed=3"])
    assert "--train.steps=7" in ov and "--train.seed=3" in ov
    assert {"--precision.mlp=blockwise", "--precision.wgrad=bf16", "--precision.emulate=true"} <= set(ov)
    assert not any(o.startswith("--precision.") for o in mod.variant_overrides("bf16", 7, None, True, []))
    with pytest.raises(mod.QualityError, match="unknown variant"):
        mod.variant_overrides("fp4", 7, None, True, [])


def test_pick_gpu_keeps_one_run_per_gpu_and_waits_for_a_gpu_held_by_a_benchmark(tmp_path):
    mod = _load()
    done = tmp_path / "bench.done"
    after = {"1": done}
    assert mod.pick_gpu(["0", "1"], [], 1, after) == "0"
    assert mod.pick_gpu(["0", "1"], ["0"], 1, after) is False  # GPU 1 still held, GPU 0 full
    done.touch()
    assert mod.pick_gpu(["0", "1"], ["0"], 1, after) == "1"
    assert mod.pick_gpu(["0", "1"], ["0", "1"], 1, after) is False
    assert mod.pick_gpu(["0", "1"], ["0", "1", "0"], 2, after) == "1"  # fewest runs first
    assert mod.pick_gpu([None], [], 1, {}) is None  # no --gpus: the default device
    with pytest.raises(mod.QualityError, match="GPU:FILE"):
        mod._parse_after("1")


def test_seeded_runs_compare_against_the_bf16_run_of_their_own_seed():
    mod = _load()
    run = stats.with_seed("blockwise wgrad=bf16", 2)
    assert stats.split_seed(run) == ("blockwise wgrad=bf16", 2) and stats.split_seed("bf16") == ("bf16", None)
    assert mod.variant_overrides(run, 5, None, cpu=True, extra=[])[-1] == "--train.seed=2"

    def summary(click, conv):  # recalibrated NE: half the NE (the seeded tables read either metric)
        return {"eval": {"click": {"ne": click, "ne_recalibrated": click / 2},
                         "conversion": {"ne": conv, "ne_recalibrated": conv / 2}}, "steps": 5}

    res = {"bf16 seed=0": summary(0.80, 1.00), "tensorwise seed=0": summary(0.808, 0.99),
           "bf16 seed=1": summary(0.90, 1.00), "tensorwise seed=1": summary(0.891, 1.01),
           "bf16 seed=2": summary(0.85, 1.00), "tensorwise seed=2": {"error": "stopped"}}
    # Paired: seed 0 against 0.80, not against another seed's baseline.
    assert math.isclose(stats.rel_diff(res, "tensorwise seed=0", "click"), 1.0)
    assert math.isclose(stats.rel_diff(res, "tensorwise seed=1", "click"), -1.0)
    assert math.isnan(stats.rel_diff(res, "tensorwise seed=2", "click"))
    assert math.isclose(stats.max_rel_diff(res)["tensorwise seed=1"], 0.01)
    rows = {r.split(" | ")[0].strip("| "): r for r in stats.seed_table(res)}
    tw = rows["tensorwise"].split(" | ")
    assert tw[1] == "2"  # the failed seed-2 run is left out
    assert tw[2] == "+0.000%" and tw[3] == "1.414%"  # mean of +1% and -1%, sample sd
    assert tw[5] == "+0.000%"  # conversion: -1% and +1%
    assert rows["bf16 (spread across seeds)"].split(" | ")[2] == "12.500%"  # 0.90 / 0.80 - 1
    recal = {r.split(" | ")[0].strip("| "): r for r in stats.seed_table(res, metric="ne_recalibrated")}
    assert recal["tensorwise"].split(" | ")[2] == "+0.000%"  # the same relative differences, other values
    assert recal["bf16 (spread across seeds)"].split(" | ")[2] == "12.500%"
    assert math.isclose(stats.rel_diff(res, "tensorwise seed=0", "click", metric="ne_recalibrated"), 1.0)
    assert math.isclose(stats.ne_of(res["bf16 seed=0"], "click", "ne_recalibrated"), 0.40)


def _write_sets(folder, **sets) -> list[str]:
    """Each result set as NAME.json in folder (a kept --json file); their paths, in the given order."""
    for name, res in sets.items():
        (folder / f"{name}.json").write_text(json.dumps(res))
    return [str(folder / f"{name}.json") for name in sets]


def test_pooled_files_pair_each_run_with_the_bf16_run_of_its_own_file(tmp_path, capsys):
    mod = _load()
    ev = lambda click: {"eval": {"click": {"ne": click}, "conversion": {"ne": 1.0}}, "steps": 5}
    # Both files hold seed 0; pooled, file a's FP8 run (+1%) must still meet file a's baseline, not file b's.
    a = {"bf16 seed=0": ev(0.80), "tensorwise seed=0": ev(0.808)}
    b = {"bf16 seed=0": ev(0.90), "tensorwise seed=0": ev(0.882), "bf16 seed=3": ev(0.70), "tensorwise seed=3": ev(0.70)}
    pooled, borrowed = stats.pool([a, b])
    assert borrowed == []
    assert sorted(pooled) == sorted(stats.with_seed(n, s) for n in ("bf16", "tensorwise") for s in (0, 1, 2))
    diffs = sorted(stats.rel_diff(pooled, stats.with_seed("tensorwise", s), "click") for s in (0, 1, 2))
    assert [round(d, 9) for d in diffs] == [-2.0, 0.0, 1.0]
    assert mod.main(["--pool", *_write_sets(tmp_path, a=a, b=b)]) == 0
    out = capsys.readouterr().out
    row = next(ln for ln in out.splitlines() if ln.startswith("| tensorwise |"))
    assert row.split(" | ")[1:3] == ["3", "-0.333%"]  # three pairs: +1%, -2%, 0%
    with pytest.raises(mod.QualityError, match="seeds"):
        stats.pool([{"bf16": ev(0.8)}])


def test_a_file_without_bf16_runs_borrows_them_from_a_file_of_the_same_setup_in_rows_of_their_own(tmp_path, capsys):
    mod = _load()
    ev = lambda click, steps=5: {"eval": {"click": {"ne": click}, "conversion": {"ne": 1.0}}, "steps": steps,
                                 "name": "gem_medium", "eval_rows": 64, "examples": 160}
    kept = {"bf16 seed=4": ev(0.80), "tensorwise seed=4": ev(0.80), "bf16 seed=5": ev(0.90),
            "bf16 seed=7": ev(0.70), "fast seed=7": ev(0.77)}  # a pair of one call: +10%
    other_setup = {"bf16 seed=6": ev(0.50, steps=9)}  # same seed as below, other steps: never a partner
    new = {"fast seed=4": ev(0.808), "fast seed=5": ev(0.891), "fast seed=6": ev(0.6)}
    pooled, borrowed = stats.pool([kept, other_setup, new])
    assert borrowed == [(2, "4,5", 0)]
    crossed = "fast" + stats.CROSS_CALL
    fast = sorted(r for r in pooled if stats.split_seed(r)[0] == crossed)
    diffs = sorted(stats.rel_diff(pooled, r, "click") for r in fast)
    assert [round(d, 9) for d in diffs] == [-1.0, 1.0]  # the borrowed pairs, apart from the kept file's own
    assert [stats.rel_diff(pooled, r, "click") for r in pooled if stats.split_seed(r)[0] == "fast"] == \
        pytest.approx([10.0, math.nan], nan_ok=True)  # seed 6 found no bf16 run: unpaired, under its own name
    # the kept file's own pair is untouched, and its bf16 runs still count once in the baseline's spread
    assert stats.rel_diff(pooled, "tensorwise seed=0", "click") == 0.0
    base_row = next(r for r in stats.seed_table(pooled) if r.startswith("| bf16 (spread across seeds)"))
    assert base_row.split(" | ")[1] == "4"  # kept's three and other's one; the lent copies are not counted again
    assert mod.main(["--pool", *_write_sets(tmp_path, kept=kept, other=other_setup, new=new)]) == 0
    out = capsys.readouterr().out
    assert "4 bf16 runs" in out and "new.json: seeds 4,5 paired with the bf16 runs of kept.json" in out
    row = next(ln for ln in out.splitlines() if ln.startswith(f"| {crossed} |"))
    assert row.split(" | ")[1:3] == ["2", "+0.000%"]
    row = next(ln for ln in out.splitlines() if ln.startswith("| fast |"))
    assert row.split(" | ")[1:3] == ["1", "+10.000%"]


def test_pool_refuses_pairs_of_different_setups(tmp_path):
    mod = _load()
    ev = lambda click, steps: {"eval": {"click": {"ne": click}, "conversion": {"ne": 1.0}}, "steps": steps,
                               "name": "gem_medium", "eval_rows": 64, "examples": 160}
    short = {"bf16 seed=0": ev(0.80, 600), "fast seed=0": ev(0.81, 600)}
    long = {"bf16 seed=1": ev(0.70, 1500), "fast seed=1": ev(0.69, 1500)}
    lender = {"bf16 seed=2": ev(0.75, 1500)}  # bf16 runs alone may be of another setup: nothing of theirs is pooled
    with pytest.raises(mod.QualityError, match=r"differ in steps \(steps=600: short.json; steps=1500: long.json\)"):
        mod.main(["--pool", *_write_sets(tmp_path, short=short, long=long)])
    assert mod.main(["--pool", *_write_sets(tmp_path, short=short, lender=lender)]) == 0


def test_kept_quality_runs_pool():
    """Each kept setup pools on its own (600 and 1500 steps); pooled together they are refused."""
    kept = REPO / "benchmarks" / "quality"
    longer = sorted(kept.glob("*-1500-*.json"))
    assert longer and any(r.startswith("| tensorwise delayed fast accum | ") for r in stats.pooled_tables(longer))
    with pytest.raises(stats.QualityError, match="differ in steps"):
        stats.pooled_tables(sorted(kept.glob("*.json")))
    files = sorted(kept.glob("*-600-*.json"))
    assert files
    rows = stats.pooled_tables(files)
    tw = [r for r in rows if r.startswith("| tensorwise delayed | ") and r.split(" | ")[1].isdigit()]
    assert len(tw) == len(stats.METRICS) and all(int(r.split(" | ")[1]) >= 10 for r in tw)
    verdict = [r for r in rows if r.startswith("| tensorwise delayed | click |")]
    assert len(verdict) == 1 and verdict[0].count("%") >= 3


def test_t_quantile_matches_tables():
    for dof, q in ((1, 12.7062), (4, 2.7764), (19, 2.0930), (50, 2.0086)):
        assert math.isclose(stats.t_quantile(0.975, dof), q, abs_tol=2e-4), dof


def test_target_table_reads_intervals_against_the_bound():
    ev = lambda click, conv: {"eval": {"click": {"ne": click}, "conversion": {"ne": conv}}}
    res = {}
    # click: pairs +0.02%, -0.02%, +0.04%, 0% -> inside ±0.1%; conversion: -0.5%, -0.3%, -0.4%, -0.6% -> better,
    # outside ±0.1% but a loss above 0.1% excluded.
    for s, (dc, dv) in enumerate(((0.02, -0.5), (-0.02, -0.3), (0.04, -0.4), (0.0, -0.6))):
        res[f"bf16 seed={s}"] = ev(1.0, 1.0)
        res[f"tensorwise seed={s}"] = ev(1.0 + dc / 100, 1.0 + dv / 100)
    rows = {r.split(" | ")[1]: r.strip("| ").split(" | ") for r in stats.target_table(res) if "tensorwise" in r}
    click, conv = rows["click"], rows["conversion"]
    assert click[2:4] == ["4", "+0.010%"] and click[5:7] == ["yes", "yes"]
    half = stats.t_quantile(0.975, 3) * stats.mean_std([0.02, -0.02, 0.04, 0.0])[1] / 2
    assert click[4] == f"{0.01 - half:+.3f}% to {0.01 + half:+.3f}%"
    assert conv[3] == "-0.450%" and conv[5:7] == ["no", "yes"]
    assert int(conv[7]) == math.ceil((1.96 * stats.mean_std([-0.5, -0.3, -0.4, -0.6])[1] / 0.1) ** 2)
    # a variant worse by 0.5% on every seed: the loss is not excluded
    worse = {k.replace("tensorwise", "rowwise"): ev(1.005, 1.005) for k in res if k.startswith("tensorwise")}
    rows = [r for r in stats.target_table({**res, **worse}) if r.startswith("| rowwise | click")]
    assert rows[0].strip("| ").split(" | ")[5:7] == ["no", "no"]


def test_mps_needs_the_control_program_and_a_gpu_run(tmp_path):
    mod = _load()
    env = mod.mps_env(tmp_path)
    assert env == {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipe"),
                   "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log")}
    with pytest.raises(mod.QualityError, match="nvidia-cuda-mps-control was not found"):
        with mod.mps_daemon(tmp_path, search=str(tmp_path / "empty")):
            pass
    with pytest.raises(mod.QualityError, match="--mps is for GPU runs"):
        mod.main(["--cpu", "--mps", "--steps", "1", "--run-root", str(tmp_path / "runs")])


def test_run_table_shows_where_each_run_spent_its_wall_time():
    ev = {"click": {"ne": 0.8}, "conversion": {"ne": 0.9}}
    run = dict(eval=ev, steps=5, wall_seconds=20.0, setup_seconds=2.5, train_seconds=12.0, first_step_seconds=4.0,
               data_wait_seconds=3.0, log_seconds=0.5, eval_seconds=1.5)
    res = {"bf16": run, "tensorwise": {**run, "data_wait_seconds": None}, "rowwise": None,
           "rowwise fast": {k: v for k, v in run.items() if k != "setup_seconds"}}  # a summary from before setup_s
    header, rule, *rows = stats.table(res)
    cols = [c.strip() for c in header.strip("|").split("|")]
    assert len(cols) == rule.count("|---") and len(rows) == 4
    cells = {r.split(" | ")[0].strip("| "): [c.strip() for c in r.strip("|").split("|")] for r in rows}
    secs = ("wall s", "setup s", "train s", "first step s", "data wait s", "log s", "eval s")
    at = {name: cols.index(name) for name in (*secs, "status")}
    assert [cells["bf16"][at[k]] for k in secs] == ["20.0", "2.5", "12.0", "4.0", "3.0", "0.5", "1.5"]
    assert cells["tensorwise"][at["data wait s"]] == ""  # not measured (a distributed run)
    assert cells["rowwise fast"][at["setup s"]] == "" and cells["rowwise fast"][at["status"]] == "ok"
    assert cells["rowwise"][at["status"]].startswith("FAILED")


@pytest.mark.timeout(300)
def test_runs_in_processes_of_their_own_and_reports_each(tmp_path):
    # The GPU path's machinery (one process per run, collected summaries) on CPU with --parallel 2.
    mod = _load()
    out = tmp_path / "q.json"
    rc = mod.main(["--cpu", "--steps", "2", "--variants", "bf16,tensorwise", "--parallel", "2",
                   "--run-root", str(tmp_path / "runs"), "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert sorted(res) == ["bf16", "tensorwise"]
    for name, s in res.items():
        assert "error" not in s and s["steps"] == 2, (name, s)
        assert (tmp_path / "runs" / mod._dir_name(name) / "summary.json").is_file()


def test_the_same_runs_in_two_calls_measure_the_shift_between_calls(tmp_path, capsys):
    mod = _load()
    ev = lambda click, steps=5: {"eval": {"click": {"ne": click}, "conversion": {"ne": 1.0}}, "steps": steps}
    first = {"bf16 seed=0": ev(0.80), "fast seed=0": ev(0.80), "bf16 seed=1": ev(0.90)}
    second = {"bf16 seed=0": ev(0.808), "fast seed=0": ev(0.824), "bf16 seed=2": ev(0.5)}  # +1%, +3%; seed 2 unshared
    other_setup = {"bf16 seed=0": ev(0.1, steps=9)}  # another setup: never compared
    rows = stats.across_calls([first, second, other_setup], ["first", "second", "other"])
    assert len(rows) == 3
    cells = rows[2].strip("| ").split(" | ")
    assert cells[:5] == ["second", "first", "2", "+2.000%", "1.000%"] and cells[5] == "+0.000%"
    assert cells[-1] == "not recorded"
    sw = lambda rev: {"torch": "2.11", "revision": rev, "env": {"GEMTRAIN_ATTN_AUTOTUNE": "0"}}
    first["bf16 seed=0"]["software"], second["bf16 seed=0"]["software"] = sw("a"), sw("a")
    first["fast seed=0"]["software"], second["fast seed=0"]["software"] = sw("a"), sw("b")
    second["fast seed=0"]["software"]["env"] = {}
    cells = stats.across_calls([first, second], ["first", "second"])[2].strip("| ").split(" | ")
    assert cells[-1] == "nothing; env GEMTRAIN_ATTN_AUTOTUNE, revision"
    assert len(stats.across_calls([first, other_setup], ["first", "other"])) == 2  # header only
    assert mod.main(["--pool", *_write_sets(tmp_path, first=first, second=second)]) == 0
    out = capsys.readouterr().out
    assert "the shift between calls" in out and "| second.json | first.json | 2 | +2.000% |" in out


def test_two_variants_of_one_call_compare_seed_by_seed_without_the_baseline(tmp_path, capsys):
    mod = _load()
    ev = lambda click, conv=1.0: {"eval": {"click": {"ne": click}, "conversion": {"ne": conv}}, "steps": 5}
    first = {"bf16 seed=0": ev(0.5), "slow seed=0": ev(0.80), "fast seed=0": ev(0.808),
             "bf16 seed=1": ev(0.6), "slow seed=1": ev(0.90), "fast seed=1": ev(0.927)}  # +1%, +3%
    second = {"slow seed=0": ev(0.70), "fast seed=0": ev(0.707, 1.01),  # FP8 runs alone: +1%
              "fast seed=1": ev(0.8), "slow seed=1": {"error": "out of memory"}}  # a failed run pairs with nothing
    rows = stats.between_variants([first, second])
    assert len(rows) == 3
    cells = rows[2].strip("| ").split(" | ")
    assert cells[:6] == ["fast", "slow", "3", "+1.667%", "1.155%", "0.667%"]
    assert cells[6:] == ["+0.333%", "0.577%", "0.333%"]
    assert len(stats.between_variants([{"bf16 seed=0": ev(0.5), "slow seed=0": ev(0.8)}])) == 2  # header only
    assert mod.main(["--pool", *_write_sets(tmp_path, first=first, second=second)]) == 0
    assert "| fast | slow | 3 | +1.667% |" in capsys.readouterr().out


def test_pairs_by_call_say_whether_the_calls_agree(tmp_path, capsys):
    mod = _load()
    ev = lambda click, conv=1.0: {"eval": {"click": {"ne": click}, "conversion": {"ne": conv}}, "steps": 5}
    # F by hand: call means 1 and 3 (grand 2), between = 2 * (1 + 1) / 1 = 4, within = (4 * 1) / 2 = 2
    assert stats.between_calls_f([[0.0, 2.0], [2.0, 4.0]]) == pytest.approx(2.0)
    assert math.isnan(stats.between_calls_f([[1.0, 2.0]]))
    # calls that share a shift: every deal at random spreads the means less, so p is as small as the deals allow
    shifted = [[10.0 + d for d in (-0.1, 0.0, 0.1)], [-10.0 + d for d in (-0.1, 0.0, 0.1)], [d for d in (-0.1, 0.0, 0.1)]]
    assert stats.permutation_p(shifted, shuffles=200) < 0.05
    alike = [[-1.0, 1.0, 0.5], [0.9, -0.8, -0.4], [1.1, -1.2, 0.2]]
    assert stats.permutation_p(alike, shuffles=200) > 0.2
    # clusters: mean 0; each call's summed deviation (+3, -3) counts once: s.e. sqrt(2/1 * 18) / 6 = 1
    m, se, lo, hi = stats.clustered_interval([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    assert (m, se) == pytest.approx((0.0, 1.0)) and hi == pytest.approx(stats.t_quantile(0.975, 1))
    first = {f"bf16 seed={s}": ev(1.0) for s in range(3)} | {f"fast seed={s}": ev(1.0 + x)
                                                             for s, x in enumerate((0.01, 0.012, 0.014))}
    second = {f"bf16 seed={s}": ev(1.0) for s in range(3)} | {f"fast seed={s}": ev(1.0 - x)
                                                              for s, x in enumerate((0.01, 0.012, 0.014))}
    rows = stats.by_call([first, second], ["first", "second"])
    assert rows[2].split(" | ")[1:5] == ["first", "3", "+1.200%", "0.115%"]
    assert rows[3].split(" | ")[1:5] == ["second", "3", "-1.200%", "0.115%"]
    assert rows[-1].startswith("- fast, 2 calls of two pairs or more: click F = ")
    assert "with the calls as clusters +0.000%" in rows[-1]
    assert mod.main(["--pool", *_write_sets(tmp_path, first=first, second=second)]) == 0
    out = capsys.readouterr().out
    assert "do the calls agree?" in out and "Pairs by card" not in out  # no call recorded its card
    # calls on one card pool into one row; a table by card appears once the files name two cards
    third = {f"bf16 seed={s}": ev(1.0) for s in range(3, 5)} | {f"fast seed={s}": ev(1.03) for s in range(3, 5)}
    card = lambda results, name: {run: {**summary, "software": {"device_name": name}} for run, summary in results.items()}
    sets = [card(first, "H100"), card(second, "H200"), card(third, "H100")]
    assert stats.card_of(sets[0]) == "H100" and stats.card_of(first) == "not recorded"
    rows = stats.by_call(sets, [stats.card_of(s) for s in sets], group="card")
    assert rows[0].startswith("| variant | card | pairs |")
    assert rows[2].split(" | ")[1:4] == ["H100", "5", "+1.920%"]  # (1.0 + 1.2 + 1.4 + 3 + 3) / 5
    assert rows[3].split(" | ")[1:4] == ["H200", "3", "-1.200%"]
    assert rows[-1].startswith("- fast, 2 cards of two pairs or more: ") and "the cards as clusters" in rows[-1]
    assert mod.main(["--pool", *_write_sets(tmp_path, first=sets[0], second=sets[1], third=sets[2])]) == 0
    assert "### Pairs by card (NE)" in capsys.readouterr().out
