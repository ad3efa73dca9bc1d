"""The Trainer role resumed from a checkpoint trains again on exactly the experiences the lost
steps had consumed from the SQL buffer (real tiny model, real SQLite file)."""

from __future__ import annotations

import sqlite3

import torch
from transformers import AutoTokenizer

from trinity.buffer.sql import SQLStorage, SQLWriter
from trinity.experience import EID, Experience
from trinity.trainer.trainer import Trainer

from .conftest import make_config


def _config(model: str, tmp_path, db: str, **top):
    buffer = {
        "batch_size": 2,
        "trainer_input": {
            "experience_buffer": {"name": "exp", "storage_type": "sql", "path": db, "max_read_timeout": 5}
        },
    }
    return make_config(
        model,
        str(tmp_path / "ckpt"),
        {"algorithm_type": "grpo", "repeat_times": 2},
        buffer=buffer,
        trainer={"save_interval": 3},
        **top,
    )


def _consumed(db_file) -> dict[int, list[str]]:
    with sqlite3.connect(db_file) as con:
        rows = con.execute("SELECT consumed_step, uid FROM exp WHERE consumed = 1 ORDER BY id").fetchall()
    out: dict[int, list[str]] = {}
    for step, uid in rows:
        out.setdefault(step, []).append(uid)
    return out


def test_resumed_trainer_retrains_the_lost_steps_on_the_same_experiences(tiny_model_path, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny_model_path)
    db_file = tmp_path / "buffer.db"
    db = f"sqlite:///{db_file}"
    exps = []
    for step in range(1, 7):  # six explorer steps: 2 tasks x 2 rollouts each
        for task in range(2):
            for run in range(2):
                p, r = tok(f"q{step}.{task}:")["input_ids"], tok("ab" if run else "xyz")["input_ids"]
                exps.append(
                    Experience(
                        tokens=torch.tensor(p + r),
                        prompt_length=len(p),
                        reward=float(run),
                        eid=EID(batch=step, task=task, run=run),
                    )
                )
    SQLWriter(SQLStorage(db, "exp")).write(exps)

    trainer = Trainer(_config(tiny_model_path, tmp_path, db))
    for _ in range(5):
        assert trainer.train_step() is not None
    before = _consumed(db_file)
    assert sorted(before) == [1, 2, 3, 4, 5] and all(len(v) == 4 for v in before.values())
    del trainer  # crash after step 5: the checkpoint of step 3 is the latest

    resumed = Trainer(_config(tiny_model_path, tmp_path, db, continue_from_checkpoint=True))
    assert resumed.step == 3
    assert resumed.experience_reader.released == 8  # steps 4 and 5 gave their rows back
    for _ in range(3):
        assert resumed.train_step() is not None
    after = _consumed(db_file)
    assert {s: after[s] for s in (1, 2, 3, 4, 5)} == before, "steps 4-5 must see the same batches"
    assert after[6] == [f"6/{t}/{r}/0" for t in range(2) for r in range(2)]
    assert sum(len(v) for v in after.values()) == 24  # every experience consumed exactly once
