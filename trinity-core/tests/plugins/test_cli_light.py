"""The CLI stays light: --help, --version and `plugins` import no torch, ray or transformers."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "ray", "transformers", "vllm", "verl")

PROBE = f"""
import sys
HEAVY = {HEAVY!r}
from click.testing import CliRunner
from trinity.cli import cli
runner = CliRunner()
for args in (["--help"], ["--version"], ["plugins"], ["plugins", "--json"], ["run", "--help"]):
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, (args, result.output)
print(" ".join(m for m in HEAVY if m in sys.modules))
"""


def test_cli_commands_import_nothing_heavy():
    # A fresh interpreter: the test process itself has torch loaded by other tests.
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"heavy modules imported by the CLI: {proc.stdout.strip()}"


def test_help_lists_every_command():
    from click.testing import CliRunner

    from trinity.cli import cli

    out = CliRunner().invoke(cli, ["--help"]).output
    for command in ("run", "plugins", "debug", "buffer"):
        assert f"  {command} " in out


def test_missing_config_file_exits_2(tmp_path):
    from click.testing import CliRunner

    from trinity.cli import cli

    result = CliRunner().invoke(cli, ["run", "--config", str(tmp_path / "missing.yaml"), "--dry-run"])
    assert result.exit_code == 2
    assert "does not exist" in result.output
