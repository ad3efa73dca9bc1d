"""Images end to end in the core: reading them, the messages they make, the buffers keeping them
exactly, and the tiny Qwen2-VL on the transformers engine and the native trainer."""

from __future__ import annotations

import base64
import io

import pytest
import torch
from PIL import Image

from trinity.buffer.file import experience_from_json, experience_to_json
from trinity.buffer.sql import SQLReader, SQLStorage, SQLWriter
from trinity.experience import EID, Experience
from trinity.multimodal import (
    IMAGE_PAD,
    ImageError,
    MultiModalProcessor,
    build_mm_message,
    has_multi_modal_content,
    image_bytes,
    load_image,
)


def png(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    out = io.BytesIO()
    img = Image.new("RGB", size, colour)
    img.putpixel((3, 4), (1, 2, 3))  # not a flat colour: decoding must keep every pixel
    img.save(out, format="PNG")
    return out.getvalue()


def test_every_accepted_form_reads_the_same_image(tmp_path):
    data = png((200, 10, 10))
    (tmp_path / "a.png").write_bytes(data)
    b64 = base64.b64encode(data).decode()
    forms = [
        data,
        str(tmp_path / "a.png"),
        f"file://{tmp_path / 'a.png'}",
        f"data:image/png;base64,{b64}",
        b64,
        {"bytes": data, "path": None},
        {"bytes": None, "path": str(tmp_path / "a.png")},
        Image.open(io.BytesIO(data)),
    ]
    want = load_image(data).tobytes()
    for form in forms:
        assert load_image(form).tobytes() == want, type(form)
    assert image_bytes(str(tmp_path / "a.png")) == data == image_bytes(b64)


@pytest.mark.parametrize(
    ("image", "message"),
    [
        ("https://example.com/cat.png", "is a URL"),
        ("no/such/file.png", "neither an existing file nor base64"),
        (12, "must be a path, base64 text, bytes or a PIL image"),
        (b"not an image", "cannot decode image"),
    ],
)
def test_unreadable_images_say_why_in_one_line(image, message):
    with pytest.raises(ImageError, match=message) as info:
        load_image(image)
    assert "\n" not in str(info.value)


def test_mm_message_places_tagged_images_and_puts_the_others_first():
    msg = build_mm_message("Compare <image> with <image>.", ["a", "b", "c"])
    assert msg == {
        "role": "user",
        "content": [
            {"type": "image", "image": "c"},
            {"type": "text", "text": "Compare "},
            {"type": "image", "image": "a"},
            {"type": "text", "text": " with "},
            {"type": "image", "image": "b"},
            {"type": "text", "text": "."},
        ],
    }
    assert build_mm_message("plain", []) == {"role": "user", "content": "plain"}
    assert has_multi_modal_content([msg]) and not has_multi_modal_content([{"role": "user", "content": "x"}])
    with pytest.raises(ValueError, match="more <image> tags than the 1 images"):
        build_mm_message("<image><image>", ["a"])


def image_experience(i: int) -> Experience:
    """An experience with two images and pixel inputs of awkward values (NaN-free, but every
    float32 bit pattern matters)."""
    gen = torch.Generator().manual_seed(i)
    return Experience(
        tokens=torch.arange(12),
        prompt_length=8,
        logprobs=torch.full((4,), -0.25),
        reward=float(i),
        eid=EID(batch=0, task=i),
        images=[png((i, 2, 3)), png((4, 5, i), size=(17, 9))],
        multi_modal_inputs={
            "pixel_values": torch.randn(32, 1176, generator=gen) * 1e3,
            "image_grid_thw": torch.tensor([[1, 4, 4], [1, 2, 8]], dtype=torch.long),
        },
    )


def assert_same_images(got: Experience, want: Experience) -> None:
    assert got.images == want.images
    assert got.multi_modal_inputs.keys() == want.multi_modal_inputs.keys()
    for key, value in want.multi_modal_inputs.items():
        assert got.multi_modal_inputs[key].dtype == value.dtype, key
        assert torch.equal(got.multi_modal_inputs[key], value), key


def test_sql_buffer_round_trips_images_exactly(tmp_path):
    storage = SQLStorage(f"sqlite:///{tmp_path / 'buffer.db'}", "exp")
    want = [image_experience(i) for i in range(3)]
    SQLWriter(storage).write(want)
    got = SQLReader(storage, max_read_timeout=0).read(3)
    assert [e.eid.task for e in got] == [0, 1, 2]
    for g, w in zip(got, want):
        assert_same_images(g, w)


def test_queue_blobs_and_file_lines_round_trip_images_exactly():
    want = image_experience(5)
    assert_same_images(Experience.deserialize(want.serialize()), want)  # what the queue moves
    assert_same_images(experience_from_json(experience_to_json(want)), want)


# -- the tiny Qwen2-VL ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vlm_path(tmp_path_factory):
    from trinity.testing.tiny_model import create_tiny_vlm

    return create_tiny_vlm(tmp_path_factory.mktemp("vlm") / "model")


def test_processor_gives_each_image_one_token_per_merged_patch(vlm_path):
    proc = MultiModalProcessor(vlm_path)
    msg = build_mm_message("<image> and <image>?", [png((1, 1, 1), (56, 56)), png((9, 9, 9), (112, 56))])
    ids, pixels, raw, text = proc.encode([msg])
    grids = pixels["image_grid_thw"]
    per_image = [int(g.prod()) // proc.merge_size**2 for g in grids]
    assert per_image[0] != per_image[1]  # the sizes differ, so the counts must
    assert ids.count(proc.image_pad_id) == sum(per_image) == text.count(IMAGE_PAD)
    assert pixels["pixel_values"].shape[0] == int(grids.prod(dim=1).sum())
    assert raw == [image_bytes(item["image"]) for item in msg["content"] if item["type"] == "image"]


@pytest.mark.slow
def test_engine_samples_from_images_and_the_trainer_steps_on_them(vlm_path, tmp_path):
    from transformers import AutoImageProcessor

    from trinity.config import resolve_config
    from trinity.config.validation import validate_config
    from trinity.rollout.transformers_engine import TransformersEngine
    from trinity.trainer.batch import build_batch, to_device
    from trinity.trainer.forward import forward_logprobs
    from trinity.trainer.native import NativeTrainer

    engine = TransformersEngine(vlm_path, device="cpu", dtype="float32")
    image = png((0, 0, 250), (64, 40))
    chat = [build_mm_message("<image>How many?", [image])]
    exps = engine.chat(chat, n=4, max_tokens=6, temperature=1.0, seed=3)
    assert len(exps) == 4
    want = AutoImageProcessor.from_pretrained(vlm_path)(images=[load_image(image)], return_tensors="pt")
    for run, exp in enumerate(exps):
        assert exp.images == [image]
        assert torch.equal(exp.multi_modal_inputs["pixel_values"], want["pixel_values"])
        assert torch.equal(exp.multi_modal_inputs["image_grid_thw"], want["image_grid_thw"])
        assert exp.logprobs.shape == (exp.response_length,)
        exp.reward, exp.eid = float(run % 2), EID(batch=0, task=0, run=run)
    # The image is read: the same chat with another image gives other logprobs.
    other = [build_mm_message("<image>How many?", [png((250, 250, 0), (64, 40))])]
    assert (
        engine.chat(other, n=1, max_tokens=6, temperature=1.0, seed=3)[0].logprobs[0] != exps[0].logprobs[0]
    )

    config = resolve_config(
        validate_config(
            {
                "mode": "train",
                "checkpoint_root_dir": str(tmp_path / "ckpt"),
                "model": {"model_path": str(vlm_path), "max_prompt_tokens": 64, "max_response_tokens": 8},
                "algorithm": {"algorithm_type": "grpo", "repeat_times": 4, "optimizer": {"lr": 1e-2}},
                "buffer": {
                    "batch_size": 1,
                    "trainer_input": {
                        "experience_buffer": {
                            "name": "exp",
                            "storage_type": "sql",
                            "path": "sqlite:///unused.db",
                        }
                    },
                },
                "trainer": {"trainer_type": "native", "use_dynamic_bsz": False},
            }
        )
    )
    trainer = NativeTrainer(config)
    batch = to_device(build_batch(exps, trainer.pad_token_id), trainer.device)
    with torch.no_grad():
        logprob, _ = forward_logprobs(trainer.model, batch)
    for i, exp in enumerate(exps):  # same weights: the trainer scores what the engine sampled
        assert torch.allclose(logprob[i, : exp.response_length], exp.logprobs, atol=1e-4)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train_step(exps)
    changed = {k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])}
    assert any(k.startswith("model.visual.") for k in changed)  # the gradient reached the vision tower
    assert any(k.startswith("model.language_model.") for k in changed)
    # A checkpoint loads like the original folder: weights, tokenizer and image processor.
    saved = trainer.save_checkpoint()
    ids, pixels, _, _ = MultiModalProcessor(saved).encode(chat)
    assert ids == exps[0].tokens[: exps[0].prompt_length].tolist()
    assert torch.equal(pixels["pixel_values"], exps[0].multi_modal_inputs["pixel_values"])
    engine.load_checkpoint(saved, 1)  # checkpoint sync: the engine now holds the trained weights
    trained = trainer.model.state_dict()
    assert all(torch.equal(v, trained[k]) for k, v in engine.model.state_dict().items())


def test_sft_rows_with_images_carry_them_and_their_pixels(vlm_path, tmp_path):
    """Multimodal SFT rows (mix_vlm's expert data): the image joins the user turn, the
    Experience carries its bytes and pixel inputs, and only the answer is the response."""
    import json

    from trinity.buffer.sft import SFTDatasetReader
    from trinity.config import ExperienceBufferConfig

    image = png((0, 200, 0), (56, 84))
    (tmp_path / "g.png").write_bytes(image)
    rows = [
        {"problem": "<image>Colour?", "response": "green", "images": [str(tmp_path / "g.png")]},
        {"problem": "<image>Colour?", "response": "green", "images": [str(tmp_path / "gone.png")]},
    ]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = ExperienceBufferConfig(
        name="sft",
        storage_type="file",
        schema_type="sft",
        path=str(tmp_path / "sft.jsonl"),
        tokenizer_path=str(vlm_path),
        format={
            "prompt_type": "plaintext",
            "prompt_key": "problem",
            "response_key": "response",
            "image_key": "images",
        },
    )
    reader = SFTDatasetReader(config)
    assert sum(reader.skipped.values()) == 1  # the row whose image is gone
    [exp] = reader.read(1)
    proc = MultiModalProcessor(vlm_path)
    messages = [build_mm_message("<image>Colour?", [image]), {"role": "assistant", "content": "green"}]
    ids, pixels, _, _ = proc.encode(messages, add_generation_prompt=False)
    assert exp.tokens.tolist() == ids and exp.images == [image]
    assert torch.equal(exp.multi_modal_inputs["pixel_values"], pixels["pixel_values"])
    assert proc.image_pad_id in exp.tokens[: exp.prompt_length].tolist()
    assert proc.tokenizer.decode(exp.tokens[exp.prompt_length :].tolist()).startswith("green")


def test_engines_without_image_support_refuse_chats_with_images():
    from trinity.rollout.base import RolloutEngine
    from trinity.testing.tiny_model import build_tokenizer

    class TextEngine(RolloutEngine):  # what the vLLM engine is to a chat: the base class's path
        def generate_tokens(self, prompts, args):
            raise AssertionError("never sampled")

        logprobs = update_weights = load_checkpoint = generate_tokens

    engine = TextEngine(build_tokenizer())
    with pytest.raises(ValueError, match="TextEngine does not take images") as info:
        engine.chat([build_mm_message("<image>n?", [png((1, 1, 1))])])
    assert "engine_type: transformers" in str(info.value) and "\n" not in str(info.value)
    assert engine.apply_chat_template([{"role": "user", "content": "hi"}]).endswith("assistant\n")
