"""jsonl experience files, the SQL factory, and ``trinity buffer show``."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

from trinity.buffer import get_buffer_reader, get_buffer_writer
from trinity.buffer.base import BufferExhausted
from trinity.buffer.cli import buffer_group
from trinity.config import ExperienceBufferConfig


def test_file_roundtrip_and_resume(tmp_path, make_experience):
    cfg = ExperienceBufferConfig(name="out", storage_type="file", path=str(tmp_path / "exp"))
    writer = get_buffer_writer(cfg)
    writer.write([make_experience(i) for i in range(3)])
    writer.write([make_experience(3)])
    assert (tmp_path / "exp" / "out.jsonl").read_text().count("\n") == 4
    reader = get_buffer_reader(cfg)
    first = reader.read(2)
    assert torch.equal(first[1].logprobs, make_experience(1).logprobs)
    resumed = get_buffer_reader(cfg)
    resumed.load_state_dict(reader.state_dict())
    assert [e.eid.task for e in resumed.read(5)] == [2, 3]
    with pytest.raises(BufferExhausted):
        resumed.read(1)


def test_file_reader_names_the_broken_line(tmp_path, make_experience):
    path = tmp_path / "x.jsonl"
    get_buffer_writer(ExperienceBufferConfig(storage_type="file", path=str(path))).write([make_experience(0)])
    with path.open("a") as fh:
        fh.write('{"tokens": [1]}\n')
    reader = get_buffer_reader(ExperienceBufferConfig(storage_type="file", path=str(path)))
    reader.read(1)
    with pytest.raises(ValueError, match=r"x.jsonl:2: not a valid experience"):
        reader.read(1)


def test_sql_factory_needs_a_path(tmp_path):
    with pytest.raises(ValueError, match="storage_type sql needs a path"):
        get_buffer_writer(ExperienceBufferConfig(name="b", storage_type="sql"))
    writer = get_buffer_writer(ExperienceBufferConfig(name="b", storage_type="sql"), cache_dir=str(tmp_path))
    writer.finish()
    assert (tmp_path / "b.db").exists()


def test_buffer_show_prints_prompt_response_reward_version(tmp_path, make_experience):
    url = f"sqlite:///{tmp_path / 'buf.db'}"
    cfg = ExperienceBufferConfig(name="countdown", storage_type="sql", path=url)
    get_buffer_writer(cfg).write([make_experience(i, model_version=7) for i in range(5)])
    reader = get_buffer_reader(cfg)
    reader.set_step(4)
    reader.read(2, timeout=0)
    result = CliRunner().invoke(buffer_group, ["show", "--path", url, "--limit", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.count("step 4") == 2  # the trainer step that read the row
    assert "countdown: 5 experiences, 3 unread" in result.output
    assert "prompt 2" in result.output and "response 2" in result.output
    assert "prompt 3" not in result.output
    unread = CliRunner().invoke(buffer_group, ["show", "--path", url, "--unread", "--limit", "1"])
    assert "prompt 2" in unread.output and "prompt 1" not in unread.output
    missing = CliRunner().invoke(buffer_group, ["show", "--path", f"sqlite:///{tmp_path / 'nope.db'}"])
    assert missing.exit_code != 0 and "no database" in missing.output
    wrong = CliRunner().invoke(buffer_group, ["show", "--path", url, "--name", "other"])
    assert "no buffer 'other'" in wrong.output and "countdown" in wrong.output
