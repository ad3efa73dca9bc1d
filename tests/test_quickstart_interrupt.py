"""``examples/quickstart/run.py`` through Ctrl-C: the terminal's SIGINT reaches the whole process
group, so the wrapper waits for ``trinity run`` to finish its own clean shutdown and exits with
its code (one line, no traceback); a SIGTERM sent to the wrapper alone is passed on.

A stand-in child plays ``trinity run`` (it takes a second to shut down, as the launcher does while
it stops its actors and Ray); ``tests/e2e/test_failures.py`` does the same with the real job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

RUN_PY = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "run.py"

CHILD = """
import signal, sys, time

def stop(sig, _frame):
    time.sleep(1.0)  # stopping actors and Ray takes a while
    print(f"child: stopped by {signal.Signals(sig).name}, cleaned up", flush=True)
    sys.exit(128 + sig)

signal.signal(signal.SIGINT, stop)
signal.signal(signal.SIGTERM, stop)
print("child: running", flush=True)
time.sleep(60)
print("child: not stopped", flush=True)
"""

# The wrapper as run.py's main() uses it, on the stand-in child.
PARENT = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("quickstart_run", {run_py!r})
run = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run)
code = run.run_to_the_end([sys.executable, {child!r}], dict(os.environ))
print(f"parent: child exited {{code}}", flush=True)
sys.exit(code)
"""


def _start(tmp_path: Path) -> subprocess.Popen:
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent(CHILD))
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT.format(run_py=str(RUN_PY), child=str(child)))
    # A session of its own: os.killpg below is what a terminal's Ctrl-C does to the foreground group.
    proc = subprocess.Popen(
        [sys.executable, str(parent)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout.readline().strip() == "child: running"
    return proc


@pytest.mark.parametrize(
    ("send", "code", "name"),
    [
        (lambda proc: os.killpg(proc.pid, signal.SIGINT), 130, "SIGINT"),  # Ctrl-C in a terminal
        (lambda proc: proc.send_signal(signal.SIGTERM), 143, "SIGTERM"),  # `kill <run.py pid>`
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_the_quickstart_wrapper_waits_for_trinity_to_stop_and_exits_with_its_code(tmp_path, send, code, name):
    proc = _start(tmp_path)
    try:
        send(proc)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out
    # The child shut down in its own time (it got the signal once), then the wrapper ended.
    assert out.splitlines() == [f"child: stopped by {name}, cleaned up", f"parent: child exited {code}"], out
    assert proc.returncode == code
