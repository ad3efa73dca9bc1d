"""``trinity convert``: veRL FSDP checkpoints (real ones, written by torch FSDP on CPU) to Hugging Face."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from trinity.cli import cli
from trinity.testing.tiny_model import create_tiny_model
from trinity.trainer.convert import ConvertError, convert_checkpoint

WRITER = Path(__file__).with_name("_write_fsdp_shards.py")
TEXT = "<|im_start|>user\n2+3=?<|im_end|>\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    return create_tiny_model(tmp_path_factory.mktemp("convert") / "original", hidden_size=32, seed=3)


@pytest.fixture(scope="module")
def fsdp_checkpoints(original, tmp_path_factory) -> Path:
    """``<root>/fsdp1/global_step_1`` and ``<root>/fsdp2/global_step_1``, written by 2 gloo ranks."""
    root = tmp_path_factory.mktemp("verl_ckpt")
    proc = subprocess.run(
        [sys.executable, str(WRITER), str(original), str(root), str(_free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # two ranks share few cores
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _assert_same_model(original: Path, converted: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    want = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()
    got = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    want_sd, got_sd = want.state_dict(), got.state_dict()
    assert set(got_sd) == set(want_sd)
    for key, value in want_sd.items():
        assert torch.equal(got_sd[key], value), key
    tokenizer = AutoTokenizer.from_pretrained(converted)
    ids = tokenizer(TEXT, return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(got(ids).logits, want(ids).logits, rtol=0, atol=0)


def _shard_names(actor: Path) -> list[str]:
    return sorted(p.name for p in actor.glob("model_world_size_*"))


def test_fsdp1_sharded_checkpoint_converts_to_the_same_model(fsdp_checkpoints, original, tmp_path):
    step = fsdp_checkpoints / "fsdp1" / "global_step_1"
    assert _shard_names(step / "actor") == ["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt"]
    shard = torch.load(step / "actor" / "model_world_size_2_rank_0.pt", weights_only=False)
    assert type(shard["model.embed_tokens.weight"]).__name__ == "DTensor"  # really sharded

    message = convert_checkpoint(step, tmp_path / "hf")  # the global_step folder

    assert "merged 2 shards" in message
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    assert (tmp_path / "hf" / "tokenizer.json").is_file()
    _assert_same_model(original, tmp_path / "hf")


def test_fsdp2_checkpoint_through_the_cli(fsdp_checkpoints, original, tmp_path):
    actor = fsdp_checkpoints / "fsdp2" / "global_step_1" / "actor"  # the actor folder

    result = CliRunner().invoke(
        cli, ["convert", "--checkpoint", str(actor), "--output", str(tmp_path / "hf")]
    )

    assert result.exit_code == 0, result.output
    assert "merged 2 shards" in result.stdout
    _assert_same_model(original, tmp_path / "hf")


def test_bfloat16_output(fsdp_checkpoints, tmp_path):
    convert_checkpoint(fsdp_checkpoints / "fsdp1" / "global_step_1", tmp_path / "hf", dtype="bfloat16")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["dtype"] == "bfloat16"


# -- plain-tensor shards (no DTensor: FSDP split on dim 0) and the error messages ----------------


@pytest.fixture
def plain_checkpoint(original, tmp_path) -> Path:
    """A veRL layout whose shards hold plain tensors: dim-0 halves (1-D and 2-D weights)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32)
    actor = tmp_path / "global_step_5" / "actor"
    (actor / "huggingface").mkdir(parents=True)
    shards = [{}, {}]
    for key, value in model.state_dict().items():
        for rank, piece in enumerate(torch.chunk(value, 2, dim=0)):
            shards[rank][key] = piece.clone()
    for rank, shard in enumerate(shards):
        torch.save(shard, actor / f"model_world_size_2_rank_{rank}.pt")
    model.config.save_pretrained(actor / "huggingface")
    AutoTokenizer.from_pretrained(original).save_pretrained(actor / "huggingface")
    (actor / "fsdp_config.json").write_text(json.dumps({"FSDP_version": 1, "world_size": 2}))
    return tmp_path / "global_step_5"


def test_plain_tensor_shards_merge_on_dim_0(plain_checkpoint, original, tmp_path):
    convert_checkpoint(plain_checkpoint, tmp_path / "hf")
    _assert_same_model(original, tmp_path / "hf")


def _error(checkpoint, output) -> str:
    with pytest.raises(ConvertError) as info:
        convert_checkpoint(checkpoint, output)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_shard(plain_checkpoint, tmp_path):
    (plain_checkpoint / "actor" / "model_world_size_2_rank_1.pt").unlink()
    assert "missing shard model_world_size_2_rank_1.pt" in _error(plain_checkpoint, tmp_path / "hf")


def test_unreadable_shard(plain_checkpoint, tmp_path):
    (plain_checkpoint / "actor" / "model_world_size_2_rank_1.pt").write_bytes(b"not a pickle")
    assert _error(plain_checkpoint, tmp_path / "hf").startswith("cannot read ")


def test_world_size_mismatch(plain_checkpoint, tmp_path):
    (plain_checkpoint / "actor" / "fsdp_config.json").write_text(json.dumps({"world_size": 4}))
    message = _error(plain_checkpoint, tmp_path / "hf")
    assert message.startswith("world-size mismatch")
    assert "says 4" in message


def test_shapes_that_do_not_match_the_config(plain_checkpoint, tmp_path):
    config_file = plain_checkpoint / "actor" / "huggingface" / "config.json"
    config = json.loads(config_file.read_text())
    config["intermediate_size"] = 128
    config_file.write_text(json.dumps(config))
    message = _error(plain_checkpoint, tmp_path / "hf")
    assert message.startswith("shape mismatch for model.layers.0.mlp.")
    assert str(config_file) in message


def test_not_a_checkpoint(tmp_path):
    assert "no checkpoint at" in _error(tmp_path / "nope", tmp_path / "hf")
    (tmp_path / "empty").mkdir()
    assert "no veRL FSDP shards" in _error(tmp_path / "empty", tmp_path / "hf")


def test_output_must_be_new(plain_checkpoint, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "x").write_text("")
    assert "not empty" in _error(plain_checkpoint, tmp_path / "hf")


def test_native_hugging_face_checkpoint_is_copied(original, tmp_path):
    step = tmp_path / "global_step_2"
    step.mkdir()
    for path in original.iterdir():
        (step / path.name).write_bytes(path.read_bytes())
    (step / "trainer_state.pt").write_bytes(b"optimizer state")

    result = CliRunner().invoke(cli, ["convert", "--checkpoint", str(step), "--output", str(tmp_path / "hf")])

    assert result.exit_code == 0, result.output
    assert "already a Hugging Face model folder" in result.stdout
    assert not (tmp_path / "hf" / "trainer_state.pt").exists()
    _assert_same_model(original, tmp_path / "hf")


def test_cli_error_is_one_line(tmp_path):
    result = CliRunner().invoke(
        cli, ["convert", "--checkpoint", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]
    )
    assert result.exit_code == 1
    assert result.stderr == f"Error: no checkpoint at {tmp_path / 'nope'}\n"
