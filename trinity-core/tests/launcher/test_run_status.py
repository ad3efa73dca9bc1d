"""``run_status.json`` written by two launchers sharing a job dir (a decoupled run)."""

from __future__ import annotations

import os

from trinity import run_status
from trinity.run_status import FILE, read_run_status, write_run_status


def test_a_write_landing_in_the_middle_of_another_loses_nothing(tmp_path, monkeypatch):
    """The train job writes while the explore job's write is between its temporary file and
    its rename (as in tests/e2e/test_decoupled.py): both writes complete, the later rename wins."""
    real_replace = os.replace
    nested = []

    def replace(src, dst):
        if not nested:  # the other job's whole write happens here, once
            nested.append(True)
            write_run_status(tmp_path, "finished")
        real_replace(src, dst)

    monkeypatch.setattr(run_status.os, "replace", replace)
    write_run_status(tmp_path, "running")
    assert nested
    assert read_run_status(tmp_path)["status"] == "running"
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE]  # no temporary file left behind
