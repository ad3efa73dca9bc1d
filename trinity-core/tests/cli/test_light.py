"""``trinity log`` and ``trinity convert --help`` import no torch, ray or transformers."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("torch", "ray", "transformers", "vllm", "verl")

PROBE = """
import sys
from click.testing import CliRunner
from trinity.cli import cli
runner = CliRunner()
log_dir = sys.argv[1]
for args, code in (
    (["log", "--help"], 0),
    (["convert", "--help"], 0),
    (["log", "--job-dir", log_dir], 0),
    (["log", "--job-dir", log_dir + "/missing"], 1),
):
    result = runner.invoke(cli, args)
    assert result.exit_code == code, (args, result.output)
print(" ".join(m for m in HEAVY if m in sys.modules))
"""


def test_log_and_convert_help_import_nothing_heavy(tmp_path):
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "trainer.log").write_text("2026-01-02 03:04:05,200 INFO trinity.trainer: hi\n")
    # A fresh interpreter: the test process itself has torch loaded by other tests.
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"heavy modules imported: {proc.stdout.strip()}"
