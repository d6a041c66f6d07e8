"""The CLI as a user runs it (subprocesses): schema check, data synth, data validate, --help, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, SCHEMAS

DEMO = str(SCHEMAS / "demo.yaml")


def _env(**extra: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), **extra)
    env.pop("PYTHONHASHSEED", None)
    return env


def gemtrain(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "train.cli", *args], cwd=REPO, env=env or _env(),
                          capture_output=True, text=True, timeout=120)


def _no_traceback(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr


def test_help_on_every_command(capsys):
    """In-process (one interpreter for all); the subprocess tests below cover the real entry point."""
    from train.cli import _commands, main

    argvs = [["--help"]] + [[c.name, "--help"] if c.group is None else [c.group, c.name, "--help"]
                            for c in _commands()]
    argvs += [[g, "--help"] for g in sorted({c.group for c in _commands() if c.group})]
    for argv in argvs:
        with pytest.raises(SystemExit) as info:
            main(argv)
        out = capsys.readouterr().out
        assert info.value.code == 0, argv
        assert out.startswith("usage: gemtrain"), (argv, out)
    assert {"schema check", "data synth", "data validate"} <= {" ".join(a[:-1]) for a in argvs}


def test_schema_check_exit_codes(tmp_path):
    ok = gemtrain("schema", "check", DEMO)
    assert ok.returncode == 0 and "ok: schema 'demo'" in ok.stdout, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("tables:\n  item: {num_embeddings: -1, dim: 4}\nlabels: {click: {}}\n")
    r = gemtrain("schema", "check", str(bad))
    assert r.returncode == 1
    assert f"{bad}:2: tables.item.num_embeddings: must be >= 1" in r.stderr
    _no_traceback(r)
    usage = gemtrain("schema", "check")  # missing FILE
    assert usage.returncode == 2 and "usage:" in usage.stderr


def test_synth_then_validate_local(tmp_path):
    out = tmp_path / "data"
    r = gemtrain("data", "synth", "--schema", DEMO, "--out", str(out), "--rows", "3000", "--files", "3",
                 "--row-group-rows", "400", "--report-rows", "3000", "--threads", "2")
    assert r.returncode == 0, r.stderr
    assert "wrote 3000 rows" in r.stdout and "oracle NE" in r.stdout and "no-history NE" in r.stdout
    assert sorted(p.name for p in out.iterdir()) == [f"part-0000{i}.parquet" for i in range(3)]

    v = gemtrain("data", "validate", str(out), "--schema", DEMO, "--deep")
    assert v.returncode == 0, v.stdout + v.stderr
    assert "(values checked too)" in v.stdout
    assert "3 files, 3000 rows, 9 row groups" in v.stdout and "history lengths: mean" in v.stdout
    assert "all files match schema 'demo'" in v.stdout

    # a file with another schema and a file that is not Parquet: both named, with reasons, exit 1
    import pyarrow.parquet as pq

    t = pq.read_table(out / "part-00000.parquet").drop_columns(["ad_bid"])
    pq.write_table(t, out / "part-00003.parquet")
    (out / "part-00004.parquet").write_bytes(b"PAR1 truncated")
    v = gemtrain("data", "validate", f"file://{out}", "--schema", DEMO)
    assert v.returncode == 1
    assert "FAIL  file://" in v.stdout and "part-00003.parquet" in v.stdout
    assert "column 'ad_bid' is missing" in v.stdout
    assert "part-00004.parquet:\n        cannot read" in v.stdout
    assert "2 of 5 files do not match" in v.stdout
    _no_traceback(v)


def test_user_errors_exit_1_usage_errors_exit_2(tmp_path):
    r = gemtrain("data", "validate", str(tmp_path / "missing"), "--schema", DEMO)
    assert r.returncode == 1 and "no such file or folder" in r.stderr
    _no_traceback(r)
    r = gemtrain("data", "synth", "--schema", DEMO, "--out", str(tmp_path), "--rows", "10",
                 "--storage-option", "novalue")
    assert r.returncode == 1 and "expected key=value" in r.stderr
    _no_traceback(r)
    r = gemtrain("data", "synth", "--schema", DEMO, "--out", str(tmp_path))  # --rows missing
    assert r.returncode == 2 and "--rows" in r.stderr


def test_object_store_urls(s3_server, capsys):
    """synth to s3:// with --storage-option (in-process, to save an interpreter start), then
    validate in a subprocess configured by the usual environment variable only."""
    import s3fs

    from train.cli import main

    endpoint = s3_server["client_kwargs"]["endpoint_url"]
    s3fs.S3FileSystem(**s3_server).mkdir("cli-test")
    assert main(["data", "synth", "--schema", DEMO, "--out", "s3://cli-test/demo", "--rows", "800",
                 "--files", "2", "--report-rows", "0", "--storage-option",
                 f"client_kwargs.endpoint_url={endpoint}", "--storage-option", "skip_instance_cache=true"]) == 0
    assert "s3://cli-test/demo/part-00001.parquet" in capsys.readouterr().out
    v = gemtrain("data", "validate", "s3://cli-test/demo", "--schema", DEMO, env=_env(AWS_ENDPOINT_URL=endpoint))
    assert v.returncode == 0, v.stdout + v.stderr
    assert "ok    s3://cli-test/demo/part-00000.parquet: 400 rows" in v.stdout


def test_parse_storage_options():
    from train.commands.data_cmd import parse_storage_options

    assert parse_storage_options(["anon=false", "client_kwargs.region_name=eu-west-1", "block_size=1024",
                                  "key=a=b"]) == {"anon": False, "client_kwargs": {"region_name": "eu-west-1"},
                                                  "block_size": 1024, "key": "a=b"}
    from features import GemtrainError

    with pytest.raises(GemtrainError):
        parse_storage_options(["a=1", "a.b=2"])
