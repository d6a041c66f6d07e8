"""`gemtrain model summary CONFIG`."""

from __future__ import annotations

from train.cli import main


def test_model_summary_prints_parameters_and_flops(capsys, repo_root):
    rc = main(["model", "summary", str(repo_root / "configs/demo.yaml"), "--rows", "16",
               "--model.sequence_encoder.attention=block", "--model.sequence_encoder.num_layers=1"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "sparse (torchrec tables)" in out and "dense total" in out
    sparse = int(next(line for line in out.splitlines() if line.startswith("sparse")).split()[-1].replace(",", ""))
    assert sparse == 20000 * 32 + 100 * 32 + 8 * 32 + 10000 * 16 + 5000 * 32 + 64 * 8 + 500 * 16  # demo tables
    assert "encoder layers ['block:64']" in out
    assert "encoder_attention_core" in out and "at max L (128)" in out


def test_model_summary_bad_model_key_exits_1(capsys, repo_root):
    rc = main(["model", "summary", str(repo_root / "configs/demo.yaml"), "--model.d_modl=3"])
    assert rc == 1
    assert "unknown key 'd_modl'" in capsys.readouterr().err
