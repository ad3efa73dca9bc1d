"""Queue experience storage: the Ray actor, its SQL mirror and priority replay (real Ray)."""

from __future__ import annotations

import time
import uuid

import pytest
import ray

from trinity.buffer.base import BufferExhausted
from trinity.buffer.queue import QueueReader, QueueWriter, get_queue_actor
from trinity.buffer.sql import SQLStorage
from trinity.config import ExperienceBufferConfig

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module", autouse=True)
def ray_cluster():
    ray.init(num_cpus=2, include_dashboard=False, namespace="buffer-tests")
    yield
    ray.shutdown()


def _name() -> str:
    return f"q{uuid.uuid4().hex[:8]}"


def test_write_read_finish(make_experience):
    actor = get_queue_actor(_name(), capacity=100)
    writer, reader = QueueWriter(actor), QueueReader(actor, max_read_timeout=5)
    writer.write([make_experience(i) for i in range(5)])
    assert [e.eid.task for e in reader.read(3)] == [0, 1, 2]
    writer.finish()
    assert [e.eid.task for e in reader.read(10)] == [3, 4]  # writers done: no waiting
    with pytest.raises(BufferExhausted):
        reader.read(1)


def test_same_name_is_the_same_queue(make_experience):
    name = _name()
    QueueWriter(get_queue_actor(name)).write([make_experience(7)])
    got = QueueReader(get_queue_actor(name)).read(1, timeout=5)
    assert got[0].eid.task == 7


def test_max_read_timeout_returns_a_partial_batch(make_experience):
    actor = get_queue_actor(_name())
    QueueWriter(actor).write([make_experience(0)])
    start = time.monotonic()
    got = QueueReader(actor, max_read_timeout=0.5).read(4)
    assert len(got) == 1
    assert 0.4 <= time.monotonic() - start < 5


def test_full_fifo_queue_makes_writers_wait(make_experience):
    actor = get_queue_actor(_name(), capacity=2)
    ref = actor.put.remote(QueueWriter(actor)._layout.rows_for([make_experience(i) for i in range(3)]))
    ready, _ = ray.wait([ref], timeout=0.5)
    assert not ready, "put returned although the queue was full"
    QueueReader(actor).read(1, timeout=5)
    assert ray.get(ref, timeout=10) == {"size": 2, "skipped": 0}


def test_sql_mirror_survives_an_actor_crash(tmp_path, make_experience):
    name, url = _name(), f"sqlite:///{tmp_path / 'backup.db'}"
    actor = get_queue_actor(name, mirror_url=url)
    QueueWriter(actor).write([make_experience(i) for i in range(6)])
    assert [e.eid.task for e in QueueReader(actor).read(2, timeout=5)] == [0, 1]
    ray.kill(actor)
    time.sleep(0.5)
    revived = get_queue_actor(name, mirror_url=url)
    assert [e.eid.task for e in QueueReader(revived).read(10, timeout=0.5)] == [2, 3, 4, 5]
    assert SQLStorage(url, name).counts()["unread"] == 0


def test_sql_mirror_skips_experiences_it_already_holds(tmp_path, make_experience):
    name, url = _name(), f"sqlite:///{tmp_path / 'backup.db'}"
    actor = get_queue_actor(name, mirror_url=url)
    writer = QueueWriter(actor)
    writer.write([make_experience(i) for i in range(4)])
    writer.write([make_experience(i) for i in range(2, 6)])  # 2 and 3 again: a redone step
    assert writer.metrics() == {"buffer/written": 6.0, "buffer/duplicates_skipped": 2.0}
    assert ray.get(actor.stats.remote())["duplicates"] == 2
    assert [e.eid.task for e in QueueReader(actor).read(10, timeout=0.5)] == [0, 1, 2, 3, 4, 5]
    assert SQLStorage(url, name).counts() == {"total": 6, "unread": 0, "writers": 0, "open_writers": 0}


def test_resumed_reader_gets_the_rows_read_after_its_state_again(tmp_path, make_experience):
    name, url = _name(), f"sqlite:///{tmp_path / 'backup.db'}"
    actor = get_queue_actor(name, mirror_url=url)
    QueueWriter(actor).write([make_experience(i) for i in range(12)])
    reader = QueueReader(actor)
    assert [e.eid.task for e in reader.read(3, timeout=1)] == [0, 1, 2]
    saved = reader.state_dict()  # the checkpoint
    assert [e.eid.task for e in reader.read(3, timeout=1)] == [3, 4, 5]
    assert [e.eid.task for e in reader.read(3, timeout=1)] == [6, 7, 8]
    # The trainer crashes; the queue actor dies too and comes back from its mirror (9, 10, 11).
    ray.kill(actor)
    time.sleep(0.5)
    revived = get_queue_actor(name, mirror_url=url)
    resumed = QueueReader(revived)
    resumed.load_state_dict(saved)
    assert resumed.released == 6
    assert [e.eid.task for e in resumed.read(9, timeout=1)] == [3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert SQLStorage(url, name).counts()["unread"] == 0


def test_without_a_mirror_a_resume_says_what_it_cannot_give_back(make_experience, caplog):
    actor = get_queue_actor(_name())
    QueueWriter(actor).write([make_experience(i) for i in range(4)])
    reader = QueueReader(actor)
    saved = reader.state_dict()
    reader.read(2, timeout=1)
    resumed = QueueReader(actor, name="plain")
    with caplog.at_level("WARNING", logger="trinity.buffer.queue"):
        resumed.load_state_dict(saved)
    assert "has no SQL mirror" in caplog.text and resumed.released == 0
    assert [e.eid.task for e in resumed.read(4, timeout=0.2)] == [2, 3]


def test_priority_replay_prefers_new_versions_and_reuses_after_cooldown(make_experience):
    actor = get_queue_actor(
        _name(),
        priority=True,
        priority_fn="linear_decay",
        priority_fn_args={"decay": 2.0},
        reuse_cooldown_time=0.3,
    )
    writer, reader = QueueWriter(actor), QueueReader(actor)
    writer.write([make_experience(i, model_version=v) for i, v in enumerate([1, 5, 3])])
    assert [e.model_version for e in reader.read(2, timeout=1)] == [5, 3]
    # After the cooldown the two come back with one use each (priority 5-2=3 and 3-2=1).
    time.sleep(0.6)
    assert [e.model_version for e in reader.read(3, timeout=1)] == [5, 1, 3]


def test_decay_limit_randomization_replays_each_experience_at_most_use_count_limit_times(make_experience):
    actor = get_queue_actor(
        _name(),
        priority=True,
        priority_fn="decay_limit_randomization",
        priority_fn_args={"decay": 2.0, "use_count_limit": 2},
        reuse_cooldown_time=0.1,
    )
    writer, reader = QueueWriter(actor), QueueReader(actor)
    writer.write([make_experience(0, model_version=5)])
    uses = []
    for _ in range(4):
        uses.extend(e.model_version for e in reader.read(1, timeout=0.5))
        time.sleep(0.3)  # past the cooldown
    assert uses == [5, 5], "used once, replayed once (use_count_limit 2), then retired"
    assert ray.get(actor.stats.remote())["retired"] == 1


def test_decay_limit_randomization_noise_is_seeded():
    from trinity.buffer.queue import resolve_priority_fn

    fns = [resolve_priority_fn("decay_limit_randomization", {"sigma": 1.0}) for _ in range(2)]
    draws = [[fn(3, 1) for _ in range(3)] for fn in fns]
    assert draws[0] == draws[1] and len(set(draws[0])) == 3  # noisy, and the same every run
    assert resolve_priority_fn("decay_limit_randomization", {"sigma": 0.0})(3, 1) == 1.0


def test_priority_queue_drops_the_lowest_when_full(make_experience):
    actor = get_queue_actor(_name(), capacity=2, priority=True)
    QueueWriter(actor).write([make_experience(i, model_version=v) for i, v in enumerate([4, 1, 9])])
    assert ray.get(actor.stats.remote())["dropped"] == 1
    assert [e.model_version for e in QueueReader(actor).read(2, timeout=1)] == [9, 4]


def test_factory_builds_queue_reader_and_writer_from_config(make_experience):
    from trinity.buffer import get_buffer_reader, get_buffer_writer

    config = ExperienceBufferConfig(name=_name(), storage_type="queue", max_read_timeout=2)
    get_buffer_writer(config).write([make_experience(1)])
    assert get_buffer_reader(config).read(1)[0].eid.task == 1
    with pytest.raises(ValueError, match="SQLAlchemy URL"):
        get_buffer_writer(ExperienceBufferConfig(name=_name(), storage_type="queue", path="/tmp/x.jsonl"))
