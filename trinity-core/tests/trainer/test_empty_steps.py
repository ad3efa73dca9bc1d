"""The Trainer when the explorer's steps bring fewer experiences than a batch: an empty step
when a step ended with none, a short batch when it ended with some, ``ExperienceTimeout`` when
nothing came within ``max_read_timeout`` (native trainer on a tiny real model, real SQLite)."""

from __future__ import annotations

import logging
import sqlite3
import time
from dataclasses import replace

import pytest
import torch
from transformers import AutoTokenizer

from trinity.buffer.sql import SQLStorage, SQLWriter
from trinity.experience import EID, Experience
from trinity.trainer.trainer import ExperienceTimeout, Trainer


def _experiences(tok, step: int, n: int) -> list[Experience]:
    out = []
    for i in range(n):
        p, r = tok(f"q{step}.{i // 2}:")["input_ids"], tok("ab" if i % 2 else "xyz")["input_ids"]
        out.append(
            Experience(
                tokens=torch.tensor(p + r),
                prompt_length=len(p),
                reward=float(i % 2),
                eid=EID(batch=step, task=i // 2, run=i % 2),
            )
        )
    return out


@pytest.fixture
def setup(config_factory, tiny_model_path, tmp_path, monkeypatch):
    """``make(max_read_timeout, train_batch_size=None) -> (trainer, writer, calls)``: a trainer
    reading an SQL buffer (2 tasks x 2 rollouts per explorer step, so 4 per batch by default),
    the explorer's writer of that buffer, and the sizes of the batches the backend trained on."""
    db = f"sqlite:///{tmp_path / 'buffer.db'}"

    def make(max_read_timeout: float, train_batch_size: int | None = None):
        exp = {"name": "exp", "storage_type": "sql", "path": db, "max_read_timeout": max_read_timeout}
        buffer = {"batch_size": 2, "trainer_input": {"experience_buffer": exp}}
        if train_batch_size is not None:
            buffer["train_batch_size"] = train_batch_size
        config = config_factory({"algorithm_type": "grpo", "repeat_times": 2}, buffer=buffer)
        writer = SQLWriter(SQLStorage(db, "exp"))
        writer.end_step(0)  # the explorer registers its writer before the trainer reads
        trainer = Trainer(config)
        calls: list[int] = []
        real = trainer.backend.train_step

        def spy(experiences):
            calls.append(len(experiences))
            return real(experiences)

        monkeypatch.setattr(trainer.backend, "train_step", spy)
        return trainer, writer, calls

    make.tok = AutoTokenizer.from_pretrained(tiny_model_path)
    make.db_file = tmp_path / "buffer.db"
    return make


def _weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.backend.state_dict().items()}


def test_an_ended_step_without_experiences_is_an_empty_step_then_a_short_one_trains(setup, caplog):
    trainer, writer, calls = setup(max_read_timeout=30)
    before = _weights(trainer)
    writer.end_step(1)  # every task of explorer step 1 failed
    start = time.monotonic()
    metrics = trainer.train_step()
    assert time.monotonic() - start < 5, "waited for experiences the ended step cannot bring"
    assert metrics["trainer/empty_step"] == 1.0 and metrics["trainer/num_experiences"] == 0.0
    assert trainer.step == 1 and trainer.backend.global_step == 1
    assert calls == [], "an empty step must not call the backend"
    after = _weights(trainer)
    assert all(torch.equal(before[k], after[k]) for k in before), "an empty step changed the weights"

    writer.write(_experiences(setup.tok, 2, 2))  # step 2: one of its two tasks failed
    writer.end_step(2)
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="trinity.trainer.trainer"):
        metrics = trainer.train_step()
    assert time.monotonic() - start < 10
    assert calls == [2]
    assert metrics["trainer/num_experiences"] == 2.0 and metrics["trainer/empty_step"] == 0.0
    assert trainer.step == 2  # the backend's own count goes on from the empty step
    assert "trainer step 2: training on 2 of 4 experiences (step ended" in caplog.text
    with sqlite3.connect(setup.db_file) as con:
        assert con.execute("SELECT consumed_step, count(*) FROM exp GROUP BY 1").fetchall() == [(2, 2)]


def test_nothing_within_max_read_timeout_is_an_error_and_a_late_partial_batch_trains(setup, caplog):
    trainer, writer, calls = setup(max_read_timeout=0.3)
    with pytest.raises(ExperienceTimeout, match=r"trainer step 1: .*max_read_timeout \(0\.3 s\)"):
        trainer.train_step()  # the explorer has not ended step 1 and wrote nothing
    assert trainer.step == 0 and calls == []
    writer.write(_experiences(setup.tok, 1, 1))  # step 1 is still running: no end_step
    with caplog.at_level(logging.WARNING, logger="trinity.trainer.trainer"):
        metrics = trainer.train_step()
    assert calls == [1] and metrics["trainer/num_experiences"] == 1.0 and trainer.step == 1
    assert "training on 1 of 4 experiences (timed out" in caplog.text


def test_a_batch_of_two_explorer_steps_waits_for_the_second_to_end(setup):
    # train_batch_size 8 = two explorer steps of 2 tasks x 2 rollouts: trainer step 1 expects
    # explorer step 2, so explorer step 1 ending (empty) is not enough.
    trainer, writer, calls = setup(max_read_timeout=0.3, train_batch_size=8)
    writer.end_step(1)
    with pytest.raises(ExperienceTimeout):
        trainer.train_step()
    writer.end_step(2)
    trainer.experience_reader.max_read_timeout = 30
    start = time.monotonic()
    metrics = trainer.train_step()
    assert time.monotonic() - start < 5
    assert metrics["trainer/empty_step"] == 1.0 and trainer.step == 1 and calls == []


def test_a_step_wise_step_that_ends_under_the_bound_trains_without_a_warning(setup, caplog):
    # Step-wise algorithms read one explorer step; train_batch_size only bounds it, so ending
    # under it is normal (a timed-out read still warns, as above).
    trainer, writer, calls = setup(max_read_timeout=30, train_batch_size=16)
    trainer.step_wise, trainer.geometry = True, replace(trainer.geometry, step_wise=True)  # multi_step_grpo
    writer.write(_experiences(setup.tok, 1, 6))
    writer.end_step(1)
    with caplog.at_level(logging.WARNING, logger="trinity.trainer.trainer"):
        metrics = trainer.train_step()
    assert calls == [6] and metrics["trainer/num_experiences"] == 6.0
    assert "training on" not in caplog.text, caplog.text


@pytest.mark.parametrize(
    ("step_wise", "sizes"),
    [(True, {1: 6, 2: 5, 3: 7}), (False, {1: 2, 2: 4, 3: 4})],
    ids=["step_wise", "grpo"],
)
def test_an_explorer_running_ahead_never_splits_a_step_between_training_steps(
    setup, monkeypatch, step_wise, sizes
):
    # The explorer wrote three steps before the trainer's first read (sync_offset, a slow
    # trainer, or a decoupled explorer). Each training step takes exactly its explorer step:
    # a step-wise batch under its bound is not topped up with the next step's turns, and a
    # GRPO step that lost a group is not completed with part of the next step's groups.
    trainer, writer, _ = setup(max_read_timeout=30, train_batch_size=16 if step_wise else None)
    if step_wise:
        trainer.step_wise, trainer.geometry = (
            True,
            replace(trainer.geometry, step_wise=True),
        )  # multi_step_grpo
    for step, size in sizes.items():
        writer.write(_experiences(setup.tok, step, size))
        writer.end_step(step)
    batches: list[list[int]] = []
    real = trainer.backend.train_step

    def spy(experiences):
        batches.append([e.eid.batch for e in experiences])
        return real(experiences)

    monkeypatch.setattr(trainer.backend, "train_step", spy)
    for _ in sizes:
        trainer.train_step()
    assert batches == [[step] * size for step, size in sizes.items()]
