"""Chats with images on the ``transformers`` engine (Qwen-VL-class models).

A chat whose messages hold image items (see :mod:`trinity.multimodal`) is encoded by the
model's :class:`~trinity.multimodal.MultiModalProcessor` and sampled with ``model.generate``,
one call per chat (its ``n`` samples together): the engine's own batched loop and lean decoding
step are for text models, whose positions and caches it knows. Each sampled token's logprob is
read from the logits that sampled it at the sampling temperature, over the whole vocabulary, as
for text (the image placeholder tokens are never sampled: see ``suppress_tokens``). The Experiences carry the images' bytes (``images``) and the pixel inputs
(``multi_modal_inputs``), which the trainer's forward pass takes as they are.

Text-only chats go to the engine's usual path unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from trinity.lazy import lazy_import
from trinity.multimodal import MultiModalProcessor, has_multi_modal_content, mm_token_type_ids
from trinity.rollout.base import FINISH_LENGTH, FINISH_STOP, PromptTooLong, whole_sample_stream

if TYPE_CHECKING:
    import torch

    from trinity.experience import Experience
    from trinity.rollout.base import SamplingArgs, StreamItem
else:
    torch = lazy_import("torch")


def _placeholder_ids(config: Any) -> list[int]:
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    return [i for i in (getattr(config, n, None) for n in names) if i is not None]


class MultiModalChat:
    """Mixin of :class:`~trinity.rollout.transformers_engine.TransformersEngine`: routes chats
    with images to :meth:`chat_mm` (see the module docstring)."""

    _mm_processor: MultiModalProcessor | None = None

    def multi_modal_processor(self) -> MultiModalProcessor:
        """The model's processor, loaded on first use (text-only models never need one)."""
        if self._mm_processor is None:
            self._mm_processor = MultiModalProcessor(self.model_path, self.tokenizer)  # type: ignore[attr-defined]
        return self._mm_processor

    def chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        if has_multi_modal_content(messages):
            return self.chat_mm(messages, **kwargs)
        return super().chat(messages, **kwargs)  # type: ignore[misc]

    async def chat_async(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[Experience]:
        if has_multi_modal_content(messages):
            return await asyncio.to_thread(self.chat_mm, messages, **kwargs)
        return await super().chat_async(messages, **kwargs)  # type: ignore[misc]

    def chat_stream_async(self, messages: list[dict[str, Any]], **kwargs: Any) -> AsyncIterator[StreamItem]:
        if has_multi_modal_content(messages):  # each sample whole, once sampled
            return whole_sample_stream(lambda: self.chat_async(messages, **kwargs))
        return super().chat_stream_async(messages, **kwargs)  # type: ignore[misc]

    def chat_mm(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        """Sample ``n`` replies to a chat with images (see the module docstring)."""
        if tools:
            raise ValueError("tools are not supported in chats with images")
        args: SamplingArgs = self.sampling_args(**rollout_args)  # type: ignore[attr-defined]
        if args.stop:
            raise ValueError("stop strings are not supported in chats with images")
        template: dict[str, Any] = {}
        if self.enable_thinking is not None:  # type: ignore[attr-defined]
            template["enable_thinking"] = self.enable_thinking  # type: ignore[attr-defined]
        template.update(chat_template_kwargs or {})
        ids, pixels, raw, text = self.multi_modal_processor().encode(
            messages,
            chat_template=self.chat_template,
            **template,  # type: ignore[attr-defined]
        )
        max_tokens = args.max_tokens
        if self.max_model_len is not None:  # type: ignore[attr-defined]
            room = self.max_model_len - len(ids)  # type: ignore[attr-defined]
            if room < 1 or (whole_context and "max_tokens" in rollout_args and room < max_tokens):
                raise PromptTooLong(len(ids), self.max_model_len, max_tokens if room >= 1 else None)  # type: ignore[attr-defined]
            max_tokens = min(max_tokens, room)

        def sample() -> tuple[torch.Tensor, list[torch.Tensor]]:
            model = self.model  # type: ignore[attr-defined]
            input_ids = torch.tensor([ids], dtype=torch.long, device=self.device)  # type: ignore[attr-defined]
            inputs = {k: v.to(self.device) for k, v in pixels.items()}  # type: ignore[attr-defined]
            if "pixel_values" in inputs:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)  # type: ignore[attr-defined]
            greedy = args.temperature == 0
            sampling = {} if greedy else {"temperature": args.temperature, "top_p": args.top_p,
                                          "top_k": args.top_k if args.top_k > 0 else None}  # fmt: skip
            with torch.random.fork_rng(devices=[]):  # the seed shapes this call only
                if args.seed is not None:
                    torch.manual_seed(args.seed)
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    mm_token_type_ids=mm_token_type_ids(input_ids, model.config),
                    **inputs,
                    do_sample=not greedy,
                    **sampling,
                    max_new_tokens=max_tokens,
                    min_new_tokens=min(args.min_tokens, max_tokens) or None,
                    num_return_sequences=args.n,
                    eos_token_id=self.eos_token_ids,  # type: ignore[attr-defined]
                    pad_token_id=self.pad_token_id,  # type: ignore[attr-defined]
                    # A placeholder token in a response would ask the trainer's forward pass for
                    # an image that is not there: never sample one.
                    suppress_tokens=_placeholder_ids(model.config),
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            return out.sequences[:, len(ids) :].cpu(), [step.float().cpu() for step in out.logits]

        with self._lock:  # type: ignore[attr-defined]
            responses, logits = self._on_compute_thread(sample)  # type: ignore[attr-defined]
        scores = torch.stack(logits, dim=1) / args.logprob_temperature
        logprobs = torch.log_softmax(scores, dim=-1).gather(-1, responses[..., None]).squeeze(-1)
        return [
            self._mm_experience(ids, row, logprobs[i], pixels, raw, text, args)
            for i, row in enumerate(responses)
        ]

    def _mm_experience(
        self,
        prompt: list[int],
        response: torch.Tensor,
        logprobs: torch.Tensor,
        pixels: dict[str, torch.Tensor],
        raw: list[bytes],
        prompt_text: str,
        args: SamplingArgs,
    ) -> Experience:
        from trinity.experience import Experience

        eos = set(self.eos_token_ids)  # type: ignore[attr-defined]
        tokens = response.tolist()
        end = next((i + 1 for i, t in enumerate(tokens) if t in eos), len(tokens))
        reason = FINISH_STOP if end <= len(tokens) and tokens[end - 1] in eos else FINISH_LENGTH
        return Experience(
            tokens=torch.tensor(prompt + tokens[:end], dtype=torch.long),
            prompt_length=len(prompt),
            logprobs=logprobs[:end].clone(),
            prompt_text=prompt_text,
            response_text=self.tokenizer.decode(tokens[:end], skip_special_tokens=True),  # type: ignore[attr-defined]
            info={"finish_reason": reason, "rollout_args": dict(args.applied(False))},
            model_version=self.model_version,  # type: ignore[attr-defined]
            multi_modal_inputs={k: v.clone() for k, v in pixels.items()},
            images=list(raw),
        )
