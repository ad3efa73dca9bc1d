"""The Synchronizer policy: when the explorer runs, waits or syncs."""

from __future__ import annotations

import pytest

from trinity.config import SynchronizerConfig
from trinity.sync import SyncDecision, Synchronizer


def _simulate(sync: Synchronizer, explore_steps: int, trainer_speed: int = 1):
    """Interleave a fast explorer with a trainer that trains one available batch per tick.

    Returns the version used for each explored batch and the explorer's maximum lead.
    """
    e = t = version = 0
    versions, max_lead = [], 0
    while e < explore_steps:
        d = sync.explorer_decision(e, t, version)
        if d.action == "sync":
            assert d.version <= t
            version = d.version
        if d.action in ("run", "sync"):
            e += 1
            versions.append(version)
        else:  # wait: the trainer catches up on produced batches
            assert t < d.version <= e
            t = min(e, t + trainer_speed)
        max_lead = max(max_lead, e - t)
    return versions, max_lead


def test_on_policy_interval_1_offset_0():
    versions, lead = _simulate(Synchronizer(1, 0), 4)
    assert versions == [0, 1, 2, 3] and lead == 1


def test_interval_2_offset_1():
    sync = Synchronizer(2, 1)
    assert [e for e in range(1, 10) if sync.is_sync_step(e)] == [3, 5, 7, 9]
    assert sync.explorer_decision(3, 1, 0).action == "wait"
    assert sync.explorer_decision(3, 2, 0) == sync.explorer_decision(3, 5, 0)
    assert sync.explorer_decision(3, 2, 0).version == 2
    versions, lead = _simulate(sync, 7)
    # Batches 1-3 come from the initial model, 4-5 from version 2, 6-7 from version 4.
    assert versions == [0, 0, 0, 2, 2, 4, 4]
    assert lead <= sync.max_lead == 3
    assert [s for s in range(1, 7) if sync.published_version(s) == s] == [2, 4, 6]


def test_dynamic_loads_newest_and_bounds_lead():
    sync = Synchronizer(2, 1, "dynamic")
    assert sync.explorer_decision(5, 3, 0) == sync.explorer_decision(5, 3, 0)
    d = sync.explorer_decision(5, 3, 0)
    assert (d.action, d.version) == ("sync", 2)
    assert sync.explorer_decision(2, 0, 0).action == "run"
    assert sync.explorer_decision(3, 0, 0).action == "wait"  # 4 - 0 > offset + interval
    assert sync.explorer_decision(3, 1, 0).action == "run"
    versions, lead = _simulate(sync, 8)
    assert lead <= sync.max_lead and versions == sorted(versions) and versions[-1] > 0


def test_from_config_and_validation():
    sync = Synchronizer.from_config(SynchronizerConfig(sync_interval=3, sync_offset=2, sync_style="dynamic"))
    assert (sync.sync_interval, sync.sync_offset, sync.sync_style) == (3, 2, "fully_async")
    assert sync.trainer_sync_interval == 3
    sync = Synchronizer.from_config(
        SynchronizerConfig(sync_interval=3, trainer_sync_interval=2, sync_style="dynamic_by_trainer")
    )
    assert (sync.sync_style, sync.trainer_sync_interval, sync.published_version(5)) == (
        "trainer_driven",
        2,
        4,
    )
    with pytest.raises(ValueError, match="sync_interval"):
        Synchronizer(0)
    with pytest.raises(ValueError, match="sync_style"):
        Synchronizer(1, 0, "sometimes")


def test_fixed_waits_for_a_busy_trainer_to_end_its_step():
    sync = Synchronizer(1, 0)
    assert sync.explorer_decision(1, 1, 0, trainer_busy=True) == sync.explorer_decision(1, 1, 0, True)
    d = sync.explorer_decision(1, 1, 0, trainer_busy=True)
    assert (d.action, d.version) == ("wait", 2)
    assert sync.explorer_decision(1, 1, 0).action == "sync"
    assert sync.explorer_decision(1, 1, 1, trainer_busy=True).action == "run"  # holds what it needs


def test_explorer_driven_takes_what_the_trainer_has_at_sync_points_only():
    sync = Synchronizer(2, 0, "explorer_driven")
    assert sync.explorer_decision(1, 1, 0).action == "run"  # not a sync point: newer weights wait
    d = sync.explorer_decision(2, 1, 0)
    assert (d.action, d.version) == ("sync", 1)  # fixed would wait for version 2
    assert Synchronizer(2, 0).explorer_decision(2, 1, 0).action == "wait"
    assert sync.explorer_decision(2, 1, 0, trainer_busy=True).version == 2  # the step in flight
    assert sync.explorer_decision(2, 1, 1).action == "run"
    assert sync.explorer_decision(3, 0, 0).action == "wait"  # 4 - 0 > max lead 2


def test_trainer_driven_publishes_and_holds_until_loaded():
    sync = Synchronizer(2, 0, "trainer_driven")
    assert [t for t in range(6) if sync.is_publish_step(t)] == [2, 4]
    assert sync.explorer_decision(1, 1, 0).action == "run"  # version 1 is not published
    assert sync.explorer_decision(1, 2, 0) == sync.explorer_decision(3, 2, 0)  # any step boundary
    assert (sync.explorer_decision(1, 2, 0).action, sync.explorer_decision(1, 2, 0).version) == ("sync", 2)
    assert sync.explorer_decision(1, 2, 0, trainer_busy=True).action == "run"
    assert sync.trainer_holds(2, 0) and not sync.trainer_holds(2, 2) and not sync.trainer_holds(3, 2)
    assert not Synchronizer(2, 0, "fully_async").trainer_holds(2, 0)
    assert not Synchronizer(2, 0, "fixed").trainer_holds(2, 0)


def test_fully_async_never_waits_within_the_lead():
    sync = Synchronizer(1, 1, "fully_async")
    assert sync.max_lead == 2
    for e, t in [(0, 0), (1, 0), (2, 1), (5, 4)]:
        assert sync.explorer_decision(e, t, t, trainer_busy=True).action == "run"
    assert sync.explorer_decision(2, 0, 0, trainer_busy=True).action == "wait"
    assert sync.explorer_decision(3, 2, 1).action == "sync"


def test_checkpoint_decision_of_explore_only_jobs():
    fixed = Synchronizer(2, 0)
    assert fixed.checkpoint_decision(1, 5, 0).action == "run"  # not a sync step
    assert fixed.checkpoint_decision(2, 1, 0) == fixed.checkpoint_decision(2, 1, 0)
    assert (fixed.checkpoint_decision(2, 1, 0).action, fixed.checkpoint_decision(2, 1, 0).version) == (
        "wait",
        2,
    )
    assert (fixed.checkpoint_decision(2, 3, 0).action, fixed.checkpoint_decision(2, 3, 0).version) == (
        "sync",
        3,
    )
    driven = Synchronizer(2, 0, "explorer_driven")
    assert driven.checkpoint_decision(2, 1, 0).action == "sync"  # whatever is there
    assert driven.checkpoint_decision(1, 1, 0).action == "run"
    for style in ("trainer_driven", "fully_async"):
        sync = Synchronizer(2, 0, style)
        assert sync.checkpoint_decision(1, 1, 0).action == "sync"
        assert sync.checkpoint_decision(9, 1, 1).action == "run"  # never waits, no lead bound


@pytest.mark.parametrize(
    ("interval", "offset", "steps", "expected"),
    [
        (2, 0, range(0, 7), [0, 0, 2, 2, 4, 4, 6]),
        (1, 0, range(0, 4), [0, 1, 2, 3]),
        (2, 1, range(0, 8), [0, 0, 0, 3, 3, 5, 5, 7]),
    ],
)
def test_last_sync_step_is_the_newest_sync_point_reached(interval, offset, steps, expected):
    sync = Synchronizer(interval, offset)
    assert [sync.last_sync_step(e) for e in steps] == expected
    assert all(sync.is_sync_step(s) for s in set(expected) - {0})


def test_a_resumed_explore_job_catches_up_on_its_last_sync_point():
    """Restarted at step 3 (interval 2) with the initial weights, a fixed explorer needs version
    2, as it had after step 2; unresumed, step 3 is no sync point."""
    fixed = Synchronizer(2, 0)
    assert fixed.checkpoint_decision(3, 2, 0).action == "run"
    assert fixed.checkpoint_decision(3, 2, 0, resumed=True) == fixed.checkpoint_decision(2, 2, 0)
    assert fixed.checkpoint_decision(3, 2, 0, resumed=True).action == "sync"
    assert (
        fixed.checkpoint_decision(3, 0, 0, resumed=True).action,
        fixed.checkpoint_decision(3, 0, 0, resumed=True).version,
    ) == ("wait", 2)
    assert fixed.checkpoint_decision(3, 2, 2, resumed=True).action == "run"  # holds it already
    assert fixed.checkpoint_decision(1, 0, 0, resumed=True).action == "run"  # before the first sync point
    driven = Synchronizer(2, 0, "explorer_driven")
    assert driven.checkpoint_decision(3, 2, 0, resumed=True).action == "sync"
    assert driven.checkpoint_decision(3, 0, 0, resumed=True).action == "run"  # never waits


def test_once_the_trainer_is_done_the_explorer_loads_its_last_version_and_never_waits():
    for style in ("fixed", "explorer_driven", "trainer_driven", "fully_async"):
        sync = Synchronizer(2, 0, style)
        # Step 2 is a sync point and 5 is past the lead: without trainer_done, fixed would wait.
        assert sync.explorer_decision(2, 3, 0, trainer_done=True) == SyncDecision(
            "sync", 3, "the trainer finished"
        )
        assert sync.explorer_decision(5, 3, 3, trainer_done=True).action == "run"
    assert Synchronizer(2, 0).explorer_decision(5, 3, 3).action == "wait"


def test_broadcast_decision_of_explore_only_jobs():
    """An explore job whose train job broadcasts into it only ever waits in ``fixed`` style, at a
    sync step, for the version that step needs."""
    fixed = Synchronizer(2, 1)
    assert fixed.broadcast_decision(2, 0).action == "run"  # not a sync step
    assert fixed.broadcast_decision(3, 0) == SyncDecision("wait", 2, "sync step: needs version 2")
    assert fixed.broadcast_decision(3, 2).action == "run"  # holds it
    assert fixed.broadcast_decision(3, 4).action == "run"  # holds a newer one
    for style in ("explorer_driven", "trainer_driven", "fully_async"):
        assert Synchronizer(2, 1, style).broadcast_decision(3, 0).action == "run"
