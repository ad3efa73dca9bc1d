"""The explore/train/sync schedule (pure logic)."""

from __future__ import annotations

from trinity.sync.schedule import SyncSchedule


def _required(schedule: SyncSchedule, steps: int, trainer_step: int = 0) -> list[int | None]:
    return [schedule.version_before_explore(e, trainer_step) for e in range(steps)]


def test_fixed_on_policy_every_step():
    s = SyncSchedule(sync_interval=1, sync_offset=0)
    # Before explore step e+1 the explorer needs the weights after trainer step e.
    assert _required(s, 4) == [None, 1, 2, 3]


def test_fixed_interval_two_offset_one():
    s = SyncSchedule(sync_interval=2, sync_offset=1)
    assert _required(s, 7) == [None, None, 1, None, 3, None, 5]


def test_fixed_offset_larger_than_first_interval_skips_the_first_sync():
    s = SyncSchedule(sync_interval=1, sync_offset=2)
    assert _required(s, 5) == [None, None, None, 1, 2]


def test_dynamic_waits_only_when_too_far_ahead_and_takes_the_latest():
    s = SyncSchedule(sync_interval=2, sync_offset=1, sync_style="dynamic")
    # At e=4 the explorer may be up to offset+interval=3 steps ahead: needs version >= 1.
    assert s.version_before_explore(4, trainer_step=0) == 1
    # If the trainer is further along, it syncs to what the trainer has, without waiting.
    assert s.version_before_explore(4, trainer_step=3) == 3
    assert s.version_before_explore(3, trainer_step=3) is None


def test_eval_due():
    s = SyncSchedule(eval_interval=3)
    assert [e for e in range(10) if s.eval_due(e)] == [3, 6, 9]
    assert not any(SyncSchedule(eval_interval=0).eval_due(e) for e in range(5))
