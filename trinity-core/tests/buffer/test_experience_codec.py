"""Experience.serialize / deserialize: the binary format the SQL and queue buffers store."""

from __future__ import annotations

import pickle
import struct

import pytest
import torch

from trinity.experience import EID, Experience
from trinity.experience_codec import MAGIC


def _assert_same(a: Experience, b: Experience) -> None:
    for name in ("tokens", "logprobs", "action_mask", "advantages", "returns", "token_level_reward",
                 "chosen", "rejected"):  # fmt: skip
        x, y = getattr(a, name), getattr(b, name)
        if x is None:
            assert y is None, name
        else:
            assert y.dtype == x.dtype and y.shape == x.shape, name
            assert torch.equal(y, x), name
    for name in ("prompt_length", "reward", "info", "metrics", "prompt_text", "response_text",
                 "eid", "model_version", "messages"):  # fmt: skip
        assert getattr(b, name) == getattr(a, name), name


def test_roundtrip_keeps_every_field_dtype_and_value():
    exp = Experience(
        tokens=torch.tensor([1, 2**40, -3, 7]),  # does not fit int32: must stay exact
        prompt_length=1,
        logprobs=torch.tensor([-0.5, -1.25, -2.0]),
        reward=0.75,
        action_mask=torch.tensor([True, False, True]),
        advantages=torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64),
        returns=torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16),
        token_level_reward=torch.tensor([0.0, 0.0, 1.0], dtype=torch.float16),
        info={"taskset": "gsm8k", "nested": {"a": [1, 2]}},
        metrics={"accuracy": 1.0},
        prompt_text="Q?",
        response_text="A.",
        eid=EID(batch="explore", task=3, run=2, step=1, suffix="x"),
        model_version=9,
        messages=[{"role": "user", "content": "Q?"}],
    )
    back = Experience.deserialize(exp.serialize())
    _assert_same(exp, back)
    assert back.eid.uid == "explore/3/2/1/x"


def test_token_ids_that_fit_int32_are_stored_narrow_and_come_back_int64():
    exp = Experience(tokens=torch.arange(512), prompt_length=256, logprobs=torch.zeros(256))
    blob = exp.serialize()
    back = Experience.deserialize(blob)
    assert back.tokens.dtype == torch.int64 and torch.equal(back.tokens, exp.tokens)
    assert len(blob) < 512 * 4 + 256 * 4 + 512, "tokens were not narrowed to int32"


def test_dpo_empty_noncontiguous_and_grad_tensors_roundtrip():
    base = torch.arange(20).reshape(4, 5)
    exp = Experience(
        tokens=base[:, 0],  # a strided view
        prompt_length=4,
        chosen=torch.tensor([5, 6]),
        rejected=torch.zeros(0, dtype=torch.long),
        logprobs=torch.zeros(0, requires_grad=True),
    )
    back = Experience.deserialize(exp.serialize())
    assert torch.equal(back.tokens, torch.tensor([0, 5, 10, 15]))
    assert back.rejected.shape == (0,) and back.rejected.dtype == torch.int64
    assert back.logprobs.shape == (0,) and not back.logprobs.requires_grad


def test_multi_dimensional_and_transposed_tensors_keep_their_values():
    exp = Experience(tokens=torch.arange(4), prompt_length=2)
    exp.chosen = torch.arange(12).reshape(3, 4).t()  # Fortran-ordered int64 (narrowed to int32)
    exp.rejected = torch.rand(2, 3, dtype=torch.float64).t()
    back = Experience.deserialize(exp.serialize())
    assert torch.equal(back.chosen, exp.chosen) and back.chosen.shape == (4, 3)
    assert torch.equal(back.rejected, exp.rejected)


def test_deserialized_tensors_are_writable_and_independent():
    blob = Experience(tokens=torch.arange(4), prompt_length=2, logprobs=torch.zeros(2)).serialize()
    a, b = Experience.deserialize(blob), Experience.deserialize(blob)
    a.logprobs += 1  # the trainer edits tensors in place
    assert torch.equal(b.logprobs, torch.zeros(2))
    assert Experience.deserialize(blob).logprobs.sum() == 0


def test_blobs_in_the_older_pickle_format_still_load():
    exp = Experience(tokens=torch.arange(6), prompt_length=3, reward=1.0, eid=EID(batch=1, task=2))
    legacy = pickle.dumps(exp.to_dict(), protocol=5)
    _assert_same(exp, Experience.deserialize(legacy))


def test_a_blob_from_a_newer_format_fails_with_a_message():
    blob = bytearray(Experience(tokens=torch.arange(2), prompt_length=1).serialize())
    struct.pack_into("<B", blob, len(MAGIC), 99)
    with pytest.raises(ValueError, match=r"version 99 is newer.*upgrade trinity-core"):
        Experience.deserialize(bytes(blob))


def test_an_unknown_field_in_a_blob_is_named():
    from trinity import experience_codec

    exp = Experience(tokens=torch.arange(2), prompt_length=1)
    exp.not_a_field = 1  # as if written by a newer Experience with one more field
    blob = experience_codec.encode(exp, ("tokens",), ("prompt_length", "eid", "not_a_field"))
    with pytest.raises(ValueError, match="not_a_field"):
        Experience.deserialize(blob)
