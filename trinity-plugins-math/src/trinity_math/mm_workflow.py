"""``simple_mm_workflow``: ``simple_workflow`` with the task row's images in the user turn.

Trinity-RFT's multimodal workflow (its ``grpo_vlm`` and ``mix_vlm`` examples): the row's images
(``format.image_key``; one image or a list, as a file path, base64 text, bytes or a
``{"bytes", "path"}`` mapping) and videos (``format.video_key``) join the prompt
(``format.prompt_key``) in one user message, each ``<image>`` tag in the prompt replaced by the
next image and the others placed first (:func:`trinity.multimodal.build_mm_message`). The system
prompt defaults to a "reason, then answer in ``\\boxed{}``" one (``format.system_prompt``
replaces it); the taskset's reward function scores each answer, as in ``simple_workflow``.

The model must be a vision-language one (a Qwen2-VL-class checkpoint): the rollout engine turns
the images into pixel inputs, which travel with each Experience to the trainer.
"""

from __future__ import annotations

from typing import Any, ClassVar

from trinity.multimodal import ImageError, build_mm_message, image_bytes, image_list
from trinity.workflow import Task
from trinity_math.workflows import BOXED_THINK_SYSTEM_PROMPT, SimpleWorkflow


def task_media(task: Task) -> tuple[list[Any], list[Any]]:
    """The images and videos of ``task``'s row (``format.image_key`` / ``format.video_key``)."""
    fmt = task.format_args
    images = image_list(task.raw_task.get(fmt.image_key)) if fmt.image_key else []
    videos = image_list(task.raw_task.get(fmt.video_key)) if fmt.video_key else []
    return images, videos


class SimpleMMWorkflow(SimpleWorkflow):
    """Image(s) + prompt → ``repeat_times`` answers (one ``model.chat(n=...)``) → reward each."""

    default_system_prompt: ClassVar[str | None] = BOXED_THINK_SYSTEM_PROMPT

    def reset(self, task: Task) -> None:
        """Point this instance at ``task`` and read its images."""
        super().reset(task)
        self.images, self.videos = task_media(task)

    def format_messages(self) -> list[dict[str, Any]]:
        """System prompt, the user turn with the images, and ``format.reply_prefix``."""
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append(build_mm_message(self.task_desc, self.images, self.videos))
        if self.reply_prefix:
            messages.append({"role": "assistant", "content": self.reply_prefix})
        return messages

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """The prompt checks of ``simple_workflow``, then: every image of the row can be read
        and there are no more ``<image>`` tags than images."""
        problem = super().row_problem(row, format_args)
        if problem is not None:
            return problem
        key = format_args.image_key
        images = image_list(row.get(key)) if key else []
        for i, image in enumerate(images):
            try:
                image_bytes(image)
            except ImageError as exc:
                return f"image {i} of column {key!r}: {exc}"
        tags = str(row.get(format_args.prompt_key, "")).count("<image>")
        if tags > len(images):
            return f"the prompt has {tags} <image> tags but column {key!r} has {len(images)} images"
        return None


class AsyncSimpleMMWorkflow(SimpleMMWorkflow):
    """``simple_mm_workflow`` run by awaiting ``model.chat_async``."""

    is_async: ClassVar[bool] = True
