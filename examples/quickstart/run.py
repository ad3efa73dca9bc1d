"""The CPU quickstart (provisional: validates the veRL-shaped GRPO example with --dry-run).

The full quickstart (SFT warm-up then GRPO on a tiny local model) replaces this once the
trainer and launcher are wired end to end.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    env = {**os.environ, "HOME": os.environ.get("HOME", str(ROOT))}
    config = ROOT / "examples" / "verl" / "grpo.yaml"
    return subprocess.call(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config), "--dry-run"], env=env
    )


if __name__ == "__main__":
    sys.exit(main())
