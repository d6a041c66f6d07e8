"""docs/commands.md is the CLI's own --help: this fails when a command or an option changes without it."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _gen():
    spec = importlib.util.spec_from_file_location("gen_commands", REPO / "docs" / "gen_commands.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_commands_md_matches_the_cli():
    gen = _gen()
    expected = gen.render()
    found = (REPO / "docs" / "commands.md").read_text()
    assert found == expected, "docs/commands.md is out of date with the CLI: run `python docs/gen_commands.py`"


def test_every_command_has_a_section():
    text = (REPO / "docs" / "commands.md").read_text()
    for section in ("## gemtrain report padding", "## gemtrain data from-events", "## gemtrain data inspect"):
        assert section in text
    assert "--quiet" in text and "--json" in text
