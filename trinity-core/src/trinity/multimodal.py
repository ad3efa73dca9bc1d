"""Images in prompts: reading them from task rows, building chat messages, and turning a chat
with images into model inputs for Qwen-VL-class models (Qwen2-VL, Qwen2.5-VL).

The task format is Trinity-RFT's: a taskset's ``format.image_key`` names the column holding a
row's images (one image or a list); each image may be a file path, a ``data:image/...;base64,``
URI or bare base64 text, raw encoded bytes, a ``{"bytes": ..., "path": ...}`` mapping (how
Hugging Face ``datasets`` stores an ``Image`` column) or a PIL image. ``<image>`` tags in the
prompt place the images; images without a tag go first (:func:`build_mm_message`).

:class:`MultiModalProcessor` replaces Trinity-RFT's use of ``AutoProcessor`` +
``qwen_vl_utils.process_vision_info``: it loads the checkpoint's tokenizer and image processor
separately and expands each image placeholder itself, because in transformers 5 the Qwen2-VL
``AutoProcessor`` cannot be built without ``torchvision`` (its video processor needs it), and
``qwen-vl-utils`` pulls in PyAV/ffmpeg and fetches URLs over the network. The image processor
itself resizes (``min_pixels``/``max_pixels``) as ``qwen_vl_utils`` would.

Pixel inputs (``pixel_values``, ``image_grid_thw``) travel in ``Experience.multi_modal_inputs``
and the images' encoded bytes in ``Experience.images``, so the trainer sees exactly the pixels
the rollout engine saw.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image

#: The placeholder tokens of Qwen-VL chat templates.
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PAD = "<|image_pad|>"
VIDEO_PAD = "<|video_pad|>"

_DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)


class ImageError(ValueError):
    """An image of a task row (or message) could not be read."""


# -- images ------------------------------------------------------------------------------------


def image_list(value: Any) -> list[Any]:
    """A row's image column as a list: ``None`` is no image, a single image is a list of one."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def image_bytes(image: Any) -> bytes:
    """The encoded bytes (PNG, JPEG, ...) of ``image`` in any of the accepted forms (see the
    module docstring); PIL images are encoded as PNG. Raises :class:`ImageError`."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return bytes(image)
    if isinstance(image, dict):
        if image.get("bytes") is not None:
            return image_bytes(image["bytes"])
        if image.get("path"):
            return image_bytes(Path(image["path"]))
        if image.get("image") is not None:  # a message content item {"type": "image", "image": ...}
            return image_bytes(image["image"])
        raise ImageError(f"an image mapping needs 'bytes' or 'path', got keys {sorted(image)}")
    if isinstance(image, Path):
        try:
            return image.read_bytes()
        except OSError as exc:
            raise ImageError(f"cannot read image file {str(image)!r}: {exc.strerror}") from None
    if isinstance(image, str):
        if _DATA_URI.match(image):
            return _b64(image.split(",", 1)[1])
        if image.startswith(("http://", "https://")):
            raise ImageError(
                f"image {image[:80]!r} is a URL: images are read from files or data, never downloaded"
            )
        path = image[len("file://") :] if image.startswith("file://") else image
        if len(path) < 4096 and os.path.isfile(path):
            return image_bytes(Path(path))
        return _b64(image)
    if hasattr(image, "save"):  # a PIL image
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()
    raise ImageError(
        f"an image must be a path, base64 text, bytes or a PIL image, got {type(image).__name__}"
    )


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(f"image {text[:80]!r} is neither an existing file nor base64 data") from None


def load_image(image: Any) -> Image:
    """``image`` (any accepted form) as an RGB PIL image. Raises :class:`ImageError`."""
    from PIL import Image as PILImage
    from PIL import UnidentifiedImageError

    if isinstance(image, PILImage.Image):
        return image.convert("RGB")
    data = image_bytes(image)
    try:
        with PILImage.open(io.BytesIO(data)) as img:
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError) as exc:
        raise ImageError(f"cannot decode image ({len(data)} bytes): {exc}") from None


# -- messages ----------------------------------------------------------------------------------


def build_mm_message(prompt: str, images: Sequence[Any], videos: Sequence[Any] = ()) -> dict[str, Any]:
    """The user message for ``prompt`` with ``images`` and ``videos``, as Trinity-RFT builds it.

    Each ``<image>`` / ``<video>`` tag in ``prompt`` is replaced, in order, by the next image /
    video item; surplus images and videos go first, before the text. A prompt with no media is
    a plain text message. More tags than media is an error.
    """
    content: list[dict[str, Any]] = []
    n_img = n_vid = 0
    for segment in re.split(r"(<image>|<video>)", prompt):
        if segment == "<image>":
            if n_img >= len(images):
                raise ValueError(f"the prompt has more <image> tags than the {len(images)} images given")
            content.append({"type": "image", "image": images[n_img]})
            n_img += 1
        elif segment == "<video>":
            if n_vid >= len(videos):
                raise ValueError(f"the prompt has more <video> tags than the {len(videos)} videos given")
            content.append({"type": "video", "video": videos[n_vid]})
            n_vid += 1
        elif segment:
            content.append({"type": "text", "text": segment})
    surplus = [{"type": "image", "image": im} for im in images[n_img:]]
    surplus += [{"type": "video", "video": v} for v in videos[n_vid:]]
    content = surplus + content
    if len(content) == 1 and content[0]["type"] == "text":
        return {"role": "user", "content": content[0]["text"]}
    return {"role": "user", "content": content}


def has_multi_modal_content(messages: Sequence[dict[str, Any]]) -> bool:
    """Whether any message has a non-text content item (image, video)."""
    for message in messages:
        content = message.get("content")
        if isinstance(content, list) and any(
            isinstance(item, dict) and item.get("type", "text") != "text" for item in content
        ):
            return True
    return False


def message_media(messages: Sequence[dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    """The images and videos of ``messages``, in the order the chat template places them."""
    images: list[Any] = []
    videos: list[Any] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "image" or (kind is None and isinstance(item, dict) and "image" in item):
                images.append(item.get("image", item.get("image_url")))
            elif kind == "image_url":  # OpenAI form: {"type": "image_url", "image_url": {"url": ...}}
                url = item["image_url"]
                images.append(url.get("url") if isinstance(url, dict) else url)
            elif kind == "video":
                videos.append(item.get("video"))
    return images, videos


# -- model inputs ------------------------------------------------------------------------------


def is_vision_model(model_path: str | Path, trust_remote_code: bool = False) -> bool:
    """Whether the checkpoint at ``model_path`` is a vision-language model (has a vision config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    return getattr(config, "vision_config", None) is not None


def auto_model_class(model_path: str | Path, trust_remote_code: bool = False) -> Any:
    """``AutoModelForImageTextToText`` for vision-language checkpoints, else
    ``AutoModelForCausalLM`` (which does not know Qwen2-VL's configuration)."""
    import transformers

    if is_vision_model(model_path, trust_remote_code):
        return transformers.AutoModelForImageTextToText
    return transformers.AutoModelForCausalLM


def mm_token_type_ids(input_ids: torch.Tensor, config: Any) -> torch.Tensor:
    """Per token: 1 for image placeholders, 2 for video placeholders, else 0 (what Qwen-VL
    models need with pixel inputs to place their multimodal rotary positions)."""
    image_id = getattr(config, "image_token_id", None)
    video_id = getattr(config, "video_token_id", None)
    out = (input_ids == image_id).long() if image_id is not None else input_ids.new_zeros(input_ids.shape)
    if video_id is not None:
        out = out + 2 * (input_ids == video_id).long()
    return out


def concat_mm_inputs(rows: Sequence[dict[str, torch.Tensor] | None]) -> dict[str, torch.Tensor]:
    """The pixel inputs of a batch: each key's tensors concatenated over the rows that have
    images, in row order (Qwen-VL models take them flattened this way)."""
    import torch

    keys: list[str] = []
    for row in rows:
        for key in row or {}:
            if key not in keys:
                keys.append(key)
    return {key: torch.cat([row[key] for row in rows if row and key in row], dim=0) for key in keys}


class MultiModalProcessor:
    """A Qwen-VL-class checkpoint's tokenizer and image processor, turning chats with images
    into token ids plus pixel inputs (see the module docstring).

    Args:
        model_path: the checkpoint folder (tokenizer files and ``preprocessor_config.json``).
        tokenizer: the tokenizer already loaded from it, if any.
    """

    def __init__(
        self, model_path: str | Path, tokenizer: Any = None, trust_remote_code: bool = False
    ) -> None:
        from transformers import AutoImageProcessor, AutoTokenizer

        self.tokenizer = tokenizer or AutoTokenizer.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
        try:
            self.image_processor = AutoImageProcessor.from_pretrained(
                model_path, trust_remote_code=trust_remote_code
            )
        except (OSError, ValueError) as exc:
            raise ImageError(f"{model_path}: no image processor to read images with ({exc})") from None
        self.merge_size = getattr(self.image_processor, "merge_size", None)
        if self.merge_size is None:
            raise ImageError(
                f"{model_path}: image processor {type(self.image_processor).__name__} is not a "
                "Qwen-VL one (no merge_size); only Qwen2-VL-class models take images"
            )
        self.image_pad_id = self.tokenizer.convert_tokens_to_ids(IMAGE_PAD)

    def encode(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **template_kwargs: Any,
    ) -> tuple[list[int], dict[str, torch.Tensor], list[bytes], str]:
        """``(token ids, pixel inputs, image bytes, prompt text)`` for a chat with images.

        The chat template writes one ``<|image_pad|>`` per image; each is expanded to the
        number of patches the image processor made of it (after merging), as the model expects.
        A final assistant message is continued rather than followed by a generation prompt.
        """
        images, videos = message_media(messages)
        if videos:
            raise ImageError(
                "videos are not supported by this processor (only images); drop `format.video_key`"
            )
        raw = [image_bytes(im) for im in images]
        kwargs: dict[str, Any] = {"tokenize": False, "chat_template": chat_template, **template_kwargs}
        if messages and messages[-1].get("role") == "assistant" and add_generation_prompt:
            kwargs["continue_final_message"] = True
        else:
            kwargs["add_generation_prompt"] = add_generation_prompt
        text = self.tokenizer.apply_chat_template(list(messages), **kwargs)
        pixel_inputs: dict[str, Any] = {}
        if raw:
            pil = [load_image(b) for b in raw]
            pixel_inputs = dict(self.image_processor(images=pil, return_tensors="pt"))
            text = self._expand(text, pixel_inputs["image_grid_thw"], len(raw))
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids, pixel_inputs, raw, text

    def _expand(self, text: str, grid_thw: torch.Tensor, n_images: int) -> str:
        parts = text.split(IMAGE_PAD)
        if len(parts) - 1 != n_images:
            raise ImageError(
                f"the chat template wrote {len(parts) - 1} {IMAGE_PAD} placeholders for {n_images} "
                "images: use the model's own chat template (it must render image content items)"
            )
        out = [parts[0]]
        for grid, rest in zip(grid_thw, parts[1:]):
            out.append(IMAGE_PAD * (int(grid.prod()) // self.merge_size**2))
            out.append(rest)
        return "".join(out)


class ProcessorFiles:
    """A checkpoint's processor files: the tokenizer and, for vision-language models, the image
    processor, saved together (``save_pretrained``) so a checkpoint of a Qwen2-VL loads like the
    original folder (``AutoImageProcessor`` included).

    Args:
        model_path: the original checkpoint, where the image processor is read from.
        tokenizer: the tokenizer to save.
    """

    def __init__(self, model_path: str | Path, tokenizer: Any) -> None:
        from transformers import AutoImageProcessor

        self.tokenizer = tokenizer
        self.image_processor = AutoImageProcessor.from_pretrained(model_path)

    def save_pretrained(self, path: str | os.PathLike) -> None:
        """Save the tokenizer and the image processor in ``path``."""
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)


__all__ = [
    "IMAGE_PAD",
    "ImageError",
    "MultiModalProcessor",
    "ProcessorFiles",
    "auto_model_class",
    "build_mm_message",
    "concat_mm_inputs",
    "has_multi_modal_content",
    "image_bytes",
    "image_list",
    "is_vision_model",
    "load_image",
    "message_media",
    "mm_token_type_ids",
]
