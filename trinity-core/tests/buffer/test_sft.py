"""SFT / DPO datasets tokenised with a locally built chat tokenizer (never downloaded)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from trinity.buffer import get_buffer_reader
from trinity.buffer.base import BufferExhausted
from trinity.config import ExperienceBufferConfig
from trinity.testing.tiny_model import build_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def decode(tokenizer, ids) -> str:
    return tokenizer.decode(list(ids))


def masked_text(tokenizer, exp) -> str:
    response = exp.tokens[exp.prompt_length :]
    return decode(tokenizer, [t for t, m in zip(response.tolist(), exp.action_mask.tolist()) if m])


def config(path: str, schema: str = "sft", **fmt) -> ExperienceBufferConfig:
    return ExperienceBufferConfig(
        name="sft_data", storage_type="file", path=path, schema_type=schema, format=fmt
    )


def test_plaintext_sft_masks_only_the_response(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "sft.jsonl", [{"q": "2+2?", "a": "4"}])
    cfg = config(path, prompt_type="plaintext", prompt_key="q", response_key="a", system_prompt="Be brief.")
    exp = get_buffer_reader(cfg, tokenizer=tokenizer).read(1)[0]
    assert decode(tokenizer, exp.tokens[: exp.prompt_length]).endswith(
        "2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert "Be brief." in decode(tokenizer, exp.tokens[: exp.prompt_length])
    assert masked_text(tokenizer, exp) == "4<|im_end|>\n"
    assert exp.action_mask.sum() == exp.response_length


def test_multi_turn_messages_train_only_assistant_turns(tmp_path, tokenizer):
    convo = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
        {"role": "assistant", "content": "ciao"},
    ]
    path = write_jsonl(tmp_path / "sft.jsonl", [{"message": convo}])
    concat = get_buffer_reader(config(path, enable_concatenated_multi_turn=True), tokenizer=tokenizer).read(
        1
    )[0]
    assert masked_text(tokenizer, concat) == "hello<|im_end|>\nciao<|im_end|>\n"
    assert decode(tokenizer, concat.tokens[: concat.prompt_length]).endswith(
        "user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    last_only = get_buffer_reader(config(path), tokenizer=tokenizer).read(1)[0]
    assert masked_text(tokenizer, last_only) == "ciao<|im_end|>\n"
    assert "hello" in decode(tokenizer, last_only.tokens[: last_only.prompt_length])


def test_dpo_rows_give_chosen_and_rejected_tokens(tmp_path, tokenizer):
    rows = [{"prompt": "pick", "chosen": "good", "rejected": "bad"}]
    cfg = config(write_jsonl(tmp_path / "dpo.jsonl", rows), "dpo", prompt_type="plaintext")
    exp = get_buffer_reader(cfg, tokenizer=tokenizer).read(1)[0]
    assert decode(tokenizer, exp.tokens).endswith("pick<|im_end|>\n<|im_start|>assistant\n")
    assert exp.prompt_length == len(exp.tokens)
    assert decode(tokenizer, exp.chosen) == "good<|im_end|>\n"
    assert decode(tokenizer, exp.rejected) == "bad<|im_end|>\n"


def test_bad_sft_rows_are_skipped_and_counted(tmp_path, tokenizer, caplog):
    rows = [
        {"message": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
        {"message": [{"role": "user", "content": "no reply"}]},
        {"message": "text"},
        {"other": 1},
    ]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger="trinity.buffer.sft"):
        reader = get_buffer_reader(config(path), tokenizer=tokenizer)
    assert reader.metrics() == {"buffer/sft_data/rows": 1, "buffer/sft_data/skipped_rows": 3}
    assert f"{path}:2: the conversation must end with an assistant message" in caplog.text
    assert f"{path}:3: 'message' must be a list of messages" in caplog.text


def test_epochs_and_resume(tmp_path, tokenizer):
    rows = [
        {"message": [{"role": "user", "content": str(i)}, {"role": "assistant", "content": "x"}]}
        for i in range(3)
    ]
    cfg = config(write_jsonl(tmp_path / "sft.jsonl", rows))
    cfg.total_epochs = 2
    reader = get_buffer_reader(cfg, tokenizer=tokenizer)
    reader.read(4)
    state = reader.state_dict()
    assert [e.prompt_text for e in reader.read(4)] == ["1", "2"]
    with pytest.raises(BufferExhausted):
        reader.read(1)
    again = get_buffer_reader(cfg, tokenizer=tokenizer)
    again.load_state_dict(state)
    assert [e.prompt_text for e in again.read(4)] == ["1", "2"]


def test_tokenizer_loaded_from_tokenizer_path(tmp_path, tokenizer):
    tokenizer.save_pretrained(tmp_path / "tok")
    rows = [{"message": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}]
    cfg = config(write_jsonl(tmp_path / "sft.jsonl", rows))
    cfg.tokenizer_path = str(tmp_path / "tok")
    assert masked_text(tokenizer, get_buffer_reader(cfg).read(1)[0]) == "b<|im_end|>\n"


def test_cpt_rows_are_raw_text_with_every_token_after_the_first_trained(tmp_path, tokenizer):
    rows = [{"text": "2 plus 2 is 4."}, {"text": "   "}, {"body": "no text key"}, "a bare string row"]
    path = write_jsonl(tmp_path / "corpus.jsonl", rows)
    reader = get_buffer_reader(config(path, schema="cpt"), tokenizer=tokenizer)
    first, second = reader.read(2)
    ids = tokenizer("2 plus 2 is 4.")["input_ids"] + [tokenizer.eos_token_id]
    assert first.tokens.tolist() == ids and first.prompt_length == 1
    assert first.action_mask is None  # every response token counts
    assert decode(tokenizer, second.tokens[second.prompt_length - 1 :]).startswith("a bare string row")
    # The blank row and the row without the text column are skipped and counted, not trained on.
    assert reader.metrics()["buffer/sft_data/skipped_rows"] == 2


def test_cpt_text_key_is_configurable(tmp_path, tokenizer):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"body": "hello world"}])
    exp = get_buffer_reader(config(path, schema="cpt", text_key="body"), tokenizer=tokenizer).read(1)[0]
    assert decode(tokenizer, exp.tokens).startswith("hello world")
