"""`gemtrain data ...` commands (synth, validate)."""

from __future__ import annotations

COMMANDS: list = []
