"""The launcher's side of weight sync: it opens the stage's transport (logging what it chose),
syncs and closes through :func:`trinity.sync.stage_weights.sync_or_fail`, which turns a transport's
:class:`WeightSyncFailed` (naming every side's error; see tests/sync/test_transport.py) into a
:class:`JobFailed` with the same message."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from trinity.job import JobFailed
from trinity.sync.stage_weights import open_weight_sync, sync_or_fail
from trinity.sync.transport import WeightSyncFailed


def test_the_launcher_fails_the_job_with_the_transports_message():
    def broken():
        raise WeightSyncFailed("weight sync (broadcast of version 2): WeightSyncError('rank 1 refused')")

    with pytest.raises(JobFailed, match=r"^weight sync \(broadcast of version 2\): WeightSyncError"):
        sync_or_fail(broken)
    assert sync_or_fail(lambda version: version, 7) == 7


class _Transport:
    method = "nccl"

    def __init__(self, chosen="", fail=None):
        self.chosen, self.fail = chosen, fail

    def open(self):
        if self.fail:
            raise WeightSyncFailed(self.fail)
        return self.chosen


def _config(method="nccl"):
    return SimpleNamespace(synchronizer=SimpleNamespace(sync_method=method, sync_timeout=60))


def test_a_stage_opens_one_transport_and_logs_what_it_chose(monkeypatch, caplog):
    made = []

    def make(method, ray, explorer, trainer, timeout_s):
        made.append((method, explorer, trainer, timeout_s))
        return _Transport("no CUDA device, broadcasting over gloo to 2 rank(s)")

    monkeypatch.setattr("trinity.sync.make_transport", make)
    assert open_weight_sync(None, _config(), None, "trainer") is None  # nothing to sync to
    assert open_weight_sync(None, _config(), "explorer", None) is None
    with caplog.at_level(logging.INFO, logger="trinity.launcher"):
        transport = open_weight_sync(None, _config(), "explorer", "trainer")
    assert made == [("nccl", "explorer", "trainer", 60)] and isinstance(transport, _Transport)
    assert [r.getMessage() for r in caplog.records if r.name == "trinity.launcher"] == [
        "sync_method nccl: no CUDA device, broadcasting over gloo to 2 rank(s)"
    ]
    monkeypatch.setattr(
        "trinity.sync.make_transport", lambda *a: _Transport(fail="weight sync set-up: no GPU for nccl")
    )
    with pytest.raises(JobFailed, match=r"^weight sync set-up: no GPU for nccl$"):
        open_weight_sync(None, _config(), "explorer", "trainer")
