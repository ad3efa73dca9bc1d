"""``-c`` is short for ``--config`` wherever a command takes ``--config`` (as in Trinity-RFT)."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from trinity.cli import cli

QUICKSTART = Path(__file__).resolve().parents[3] / "examples" / "quickstart" / "quickstart.yaml"


def _commands(group: click.Group, ctx: click.Context, prefix: str = ""):
    for name in group.list_commands(ctx):
        try:
            command = group.get_command(ctx, name)
        except click.ClickException:  # a lazy command whose optional dependencies are missing
            continue
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, f"{prefix}{name} ")


def test_every_config_option_has_the_short_form():
    ctx = click.Context(cli)
    checked = []
    for name, command in _commands(cli, ctx):
        for param in command.params:
            if "--config" in getattr(param, "opts", []):
                assert "-c" in param.opts, f"trinity {name}: --config has no -c"
                checked.append(name)
    assert {"run", "log"} <= set(checked)


def test_run_dry_run_with_c_matches_config(tmp_path, monkeypatch):
    # The folders `run.py` makes: the dry run checks that the model and the data are there.
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    for data in ("rl", "practice", "sft"):
        (tmp_path / "data" / data).mkdir(parents=True)
    monkeypatch.setenv("QUICKSTART_DIR", str(tmp_path))
    runner = CliRunner()
    short = runner.invoke(cli, ["run", "-c", str(QUICKSTART), "--dry-run"])
    long = runner.invoke(cli, ["run", "--config", str(QUICKSTART), "--dry-run"])
    assert short.exit_code == 0, short.output
    assert short.stdout == long.stdout
    assert "checkpoint_job_dir:" in short.stdout


def test_run_with_c_reports_a_missing_file(tmp_path):
    result = CliRunner().invoke(cli, ["run", "-c", str(tmp_path / "missing.yaml"), "--dry-run"])
    assert result.exit_code == 2
    assert "does not exist" in result.stderr


def test_help_shows_the_short_form():
    assert "-c, --config" in CliRunner().invoke(cli, ["run", "--help"]).stdout
    assert "-c, --config" in CliRunner().invoke(cli, ["log", "--help"]).stdout
