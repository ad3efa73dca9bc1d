"""SFT and DPO datasets: rows tokenised with the model's chat template into Experiences.

SFT (``schema_type: sft``): ``tokens`` = the whole conversation, ``prompt_length`` = the tokens
before the first trained assistant turn, ``action_mask`` = 1 on assistant tokens only. With
``enable_concatenated_multi_turn`` every assistant turn is trained (the user/tool turns between
them are masked out); otherwise only the last assistant message is the response.

DPO (``schema_type: dpo``): ``tokens`` = the prompt (with the generation prompt), and ``chosen`` /
``rejected`` = the tokens of each reply as the template renders it after that prompt.

SFT rows with images (``format.image_key``, Trinity-RFT's multimodal SFT, e.g. ``mix_vlm``'s expert
data): the prompt and the row's images make the user turn (:func:`trinity.multimodal.build_mm_message`;
with ``prompt_type: messages`` the messages' own image items), the model's
:class:`~trinity.multimodal.MultiModalProcessor` tokenises the conversation, and the Experience
carries the images and their pixel inputs; only the last assistant message is trained.

CPT (``schema_type: cpt``, continued pre-training): ``tokens`` = the raw text of the
``format.text_key`` column (no chat template), tokenised with the tokenizer's special tokens and
an EOS; every token after the first is trained (the first has nothing to be predicted from).

Token boundaries come from rendering growing prefixes of the conversation, so any chat template
works (no ``{% generation %}`` markers needed), as long as a prefix renders as a prefix.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import BufferExhausted, ReaderBase
from trinity.buffer.dataset import DatasetError, load_rows
from trinity.buffer.rows import check_messages
from trinity.buffer.selector import make_selector

if TYPE_CHECKING:
    from trinity.config import ExperienceBufferConfig, FormatConfig
    from trinity.experience import Experience

logger = logging.getLogger(__name__)


class SFTDataError(ValueError):
    """A row cannot be turned into an SFT/DPO sample (skipped and counted by the reader)."""


def load_tokenizer(path: str, chat_template: str | None = None) -> Any:
    """``AutoTokenizer`` from a local folder; ``chat_template`` overrides the saved one."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    if chat_template:
        tokenizer.chat_template = chat_template
    if not tokenizer.chat_template:
        raise ValueError(
            f"tokenizer at {path} has no chat template; set format.chat_template or model.custom_chat_template"
        )
    return tokenizer


class ChatTokenizer:
    """Renders conversations with a tokenizer's chat template and finds turn boundaries."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def ids(self, messages: list[dict], *, generation_prompt: bool, tools: Any = None) -> list[int]:
        """Token ids of ``messages`` rendered by the chat template."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
        )
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prefix_ok(self, prefix: list[int], full: list[int], what: str) -> None:
        if full[: len(prefix)] != prefix:
            raise SFTDataError(
                f"the chat template does not render {what} as a prefix of the conversation; "
                "use a template whose turns only append tokens"
            )


def _plain_messages(row: dict, fmt: FormatConfig, response: Any) -> list[dict]:
    system = row.get(fmt.system_prompt_key) if fmt.system_prompt_key else None
    system = system or fmt.system_prompt
    prompt = row.get(fmt.prompt_key)
    if not isinstance(prompt, str) or not prompt.strip():
        raise SFTDataError(f"prompt {fmt.prompt_key!r} must be a non-empty string")
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    if response is not None:
        if not isinstance(response, str):
            raise SFTDataError(f"response must be a string, got {type(response).__name__}")
        messages.append({"role": "assistant", "content": (fmt.reply_prefix or "") + response})
    return messages


def cpt_experience(row: Any, fmt: FormatConfig, chat: ChatTokenizer) -> Experience:
    """One continued-pre-training :class:`~trinity.experience.Experience`: the raw text of
    ``fmt.text_key`` (a plain string row works too), every token after the first trained."""
    from trinity.experience import Experience

    text = row.get(fmt.text_key) if isinstance(row, dict) else row
    if isinstance(row, dict) and fmt.text_key not in row:
        raise SFTDataError(f"missing text key {fmt.text_key!r}")
    if not isinstance(text, str) or not text.strip():
        raise SFTDataError(f"text {fmt.text_key!r} must be a non-empty string")
    tokenizer = chat.tokenizer
    ids = list(tokenizer(text)["input_ids"])
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        ids.append(eos)
    if len(ids) < 2:
        raise SFTDataError("the text renders to fewer than two tokens; there is nothing to predict")
    return Experience(tokens=ids, prompt_length=1, prompt_text="", response_text=text)


def _conversation(row: Any, fmt: FormatConfig) -> list[dict[str, Any]]:
    """The conversation an SFT row holds: its ``messages_key`` column (checked), or its prompt
    and ``response_key`` as plain turns."""
    if not isinstance(row, dict):
        raise SFTDataError(f"row must be a JSON object, got {type(row).__name__}")
    if fmt.prompt_type == "messages":
        messages = row.get(fmt.messages_key)
        problem = check_messages(messages, fmt.messages_key)
        if problem:
            raise SFTDataError(problem)
        return messages
    if fmt.response_key not in row:
        raise SFTDataError(f"missing response key {fmt.response_key!r}")
    return _plain_messages(row, fmt, row[fmt.response_key])


def sft_experience(row: Any, fmt: FormatConfig, chat: ChatTokenizer) -> Experience:
    """One SFT :class:`~trinity.experience.Experience` from a dataset row."""
    from trinity.experience import Experience

    messages = _conversation(row, fmt)
    tools = row.get(fmt.tools_key) if fmt.tools_key else None
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant or assistant[-1] != len(messages) - 1:
        raise SFTDataError("the conversation must end with an assistant message")
    trained = assistant if fmt.enable_concatenated_multi_turn else assistant[-1:]
    full = chat.ids(messages, generation_prompt=False, tools=tools)
    mask = [0] * len(full)
    prompt_length = None
    for i in trained:
        start_ids = chat.ids(messages[:i], generation_prompt=True, tools=tools)
        end_ids = chat.ids(messages[: i + 1], generation_prompt=False, tools=tools)
        chat.prefix_ok(start_ids, full, f"the turns before message {i}")
        chat.prefix_ok(end_ids, full, f"the turns up to message {i}")
        if prompt_length is None:
            prompt_length = len(start_ids)
        for t in range(len(start_ids), len(end_ids)):
            mask[t] = 1
    assert prompt_length is not None
    if prompt_length >= len(full):
        raise SFTDataError("the response renders to no tokens")
    return Experience(
        tokens=full,
        prompt_length=prompt_length,
        action_mask=mask[prompt_length:],
        prompt_text=str(messages[trained[0] - 1].get("content")) if trained[0] > 0 else "",
        response_text=str(messages[trained[-1]].get("content")),
        messages=messages,
    )


def mm_sft_experience(row: Any, fmt: FormatConfig, processor: Any) -> Experience:
    """One SFT :class:`~trinity.experience.Experience` from a row with images (see the module
    docstring); ``processor`` is a :class:`~trinity.multimodal.MultiModalProcessor`."""
    from trinity.experience import Experience
    from trinity.multimodal import ImageError, build_mm_message, image_list

    messages = _conversation(row, fmt)
    if fmt.enable_concatenated_multi_turn:
        raise SFTDataError("enable_concatenated_multi_turn is not supported for rows with images")
    if fmt.prompt_type != "messages":
        images = image_list(row.get(fmt.image_key)) if fmt.image_key else []
        videos = image_list(row.get(fmt.video_key)) if fmt.video_key else []
        try:
            messages[-2] = build_mm_message(messages[-2]["content"], images, videos)
        except ValueError as exc:
            raise SFTDataError(str(exc)) from None
    if messages[-1]["role"] != "assistant":
        raise SFTDataError("the conversation must end with an assistant message")
    try:
        full, pixels, raw, _ = processor.encode(messages, add_generation_prompt=False)
        prompt, _, _, prompt_text = processor.encode(messages[:-1], add_generation_prompt=True)
    except ImageError as exc:
        raise SFTDataError(str(exc)) from None
    if full[: len(prompt)] != prompt:
        raise SFTDataError("the chat template does not render the prompt as a prefix of the conversation")
    if len(full) == len(prompt):
        raise SFTDataError("the response renders to no tokens")
    return Experience(
        tokens=full,
        prompt_length=len(prompt),
        prompt_text=prompt_text,
        response_text=str(messages[-1].get("content")),
        messages=messages,
        multi_modal_inputs=pixels or None,
        images=raw or None,
    )


def dpo_experience(row: Any, fmt: FormatConfig, chat: ChatTokenizer) -> Experience:
    """One DPO :class:`~trinity.experience.Experience` (``chosen`` / ``rejected`` tensors)."""
    from trinity.experience import Experience

    if not isinstance(row, dict):
        raise SFTDataError(f"row must be a JSON object, got {type(row).__name__}")
    if fmt.prompt_type == "messages":
        prompt = row.get(fmt.messages_key)
        problem = check_messages(prompt, fmt.messages_key)
        if problem:
            raise SFTDataError(problem)
    else:
        prompt = _plain_messages(row, fmt, None)
    replies = {}
    for key in (fmt.chosen_key, fmt.rejected_key):
        if key not in row or row[key] is None:
            raise SFTDataError(f"missing {key!r}")
        value = row[key]
        if isinstance(value, str):
            value = [{"role": "assistant", "content": (fmt.reply_prefix or "") + value}]
        problem = check_messages(value, key)
        if problem:
            raise SFTDataError(problem)
        replies[key] = value
    prompt_ids = chat.ids(prompt, generation_prompt=True)
    tensors = {}
    for key, reply in replies.items():
        full = chat.ids(prompt + reply, generation_prompt=False)
        chat.prefix_ok(prompt_ids, full, "the prompt")
        if len(full) == len(prompt_ids):
            raise SFTDataError(f"{key!r} renders to no tokens")
        tensors[key] = full[len(prompt_ids) :]
    return Experience(
        tokens=prompt_ids,
        prompt_length=len(prompt_ids),
        chosen=tensors[fmt.chosen_key],
        rejected=tensors[fmt.rejected_key],
        prompt_text=str(prompt[-1].get("content")),
        response_text=str(replies[fmt.chosen_key][-1].get("content")),
    )


class SFTDatasetReader(ReaderBase):
    """:class:`~trinity.buffer.base.BufferReader` over an SFT or DPO dataset (file storage).

    Rows are tokenised once at construction; unusable rows are skipped, logged with their file
    and row number and counted (``buffer/<name>/skipped_rows``). Reads cycle through
    ``total_epochs`` epochs in the ``data_selector`` order; the position is the state.

    Args:
        config: the buffer's :class:`~trinity.config.ExperienceBufferConfig`
            (``schema_type`` ``sft`` or ``dpo``).
        tokenizer: a tokenizer object, or ``None`` to load one from ``config.tokenizer_path``.
    """

    def __init__(self, config: ExperienceBufferConfig, tokenizer: Any = None) -> None:
        self.config = config
        self.name = config.name or "sft"
        schema = config.schema_type or "sft"
        if schema not in ("sft", "dpo", "cpt"):
            raise ValueError(
                f"buffer {self.name!r}: schema_type must be 'sft', 'dpo' or 'cpt', got {schema!r}"
            )
        fmt = config.format
        if tokenizer is None:
            if not config.tokenizer_path:
                raise ValueError(
                    f"buffer {self.name!r}: no tokenizer; set model.model_path (or tokenizer_path)"
                )
            if schema == "cpt":  # raw text: no chat template needed
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path)
            else:
                tokenizer = load_tokenizer(config.tokenizer_path, fmt.chat_template)
        elif fmt.chat_template:
            tokenizer.chat_template = fmt.chat_template
        chat: Any = ChatTokenizer(tokenizer)
        build = {"dpo": dpo_experience, "cpt": cpt_experience}.get(schema, sft_experience)
        if schema == "sft" and (fmt.image_key or fmt.video_key):
            from trinity.multimodal import MultiModalProcessor

            chat, build = MultiModalProcessor(config.tokenizer_path, tokenizer), mm_sft_experience
        try:
            raw = load_rows(config.path, split=config.split, subset_name=config.subset_name)
        except DatasetError as exc:
            raise ValueError(f"buffer {self.name!r}: {exc}") from None
        self.skipped: Counter[str] = Counter()
        self.samples: list[Experience] = []
        for r in raw:
            try:
                if r.error:
                    raise SFTDataError(r.error)
                self.samples.append(build(r.value, fmt, chat))
            except SFTDataError as exc:
                self.skipped[str(exc).split(" (")[0]] += 1
                if sum(self.skipped.values()) <= 20:
                    logger.warning("buffer %r: skipping %s: %s", self.name, r.where, exc)
        if not self.samples:
            raise ValueError(f"buffer {self.name!r}: none of the {len(raw)} rows of {config.path} is usable")
        sel = config.data_selector
        self.selector = make_selector(sel.selector_type, len(self.samples), seed=sel.seed)
        self.total_epochs = config.total_epochs or 1
        self.total_steps = config.total_steps
        self.position = int(config.index or 0)
        self.steps = 0

    def read(self, batch_size: int | None = None, timeout: float | None = None) -> list[Experience]:
        """The next batch; :class:`BufferExhausted` after the last epoch or step."""
        if self.total_steps is not None and self.steps >= self.total_steps:
            raise BufferExhausted(f"buffer {self.name!r}: total_steps ({self.total_steps}) reached")
        count = batch_size or self.config.batch_size or 1
        if self.total_steps is None:
            count = min(count, self.total_epochs * len(self.samples) - self.position)
        if count <= 0:
            raise BufferExhausted(f"buffer {self.name!r}: {self.total_epochs} epoch(s) done")
        batch = [self.samples[i] for i in self.selector.indices(self.position, count)]
        self.position += count
        self.steps += 1
        return batch

    def state_dict(self) -> dict[str, Any]:
        """``{"position", "steps"}``."""
        return {"position": self.position, "steps": self.steps}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved position."""
        self.position = int(state.get("position", 0))
        self.steps = int(state.get("steps", 0))

    def metrics(self) -> dict[str, float]:
        """``buffer/<name>/rows`` and ``buffer/<name>/skipped_rows``."""
        return {
            f"buffer/{self.name}/rows": len(self.samples),
            f"buffer/{self.name}/skipped_rows": sum(self.skipped.values()),
        }
