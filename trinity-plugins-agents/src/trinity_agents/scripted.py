"""A scripted rollout engine, for testing agentic workflows without a model.

:class:`ScriptedEngine` is a real :class:`~trinity.rollout.base.RolloutEngine` whose
replies come from a Python *policy* ``policy(messages) -> str`` (or ``async``): prompts are built
with the chat template and tokenised as a real engine does, replies are tokenised and closed with
the end-of-turn token, cut at ``max_tokens`` (``finish_reason`` ``"length"``), and log-probs are
zeros. Wrapped in the real :class:`~trinity.explorer.model_wrapper.ModelWrapper`
(:func:`scripted_model`), a workflow sees exactly the API it gets in a run, including
``convert_messages_to_experience``::

    model = scripted_model(lambda messages: "```Up```")
    experiences = FrozenLakeWorkflow(task=task, model=model).run()

The default tokenizer is :func:`trinity.testing.tiny_model.build_tokenizer` (one token per
character, ChatML template): nothing is downloaded.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from trinity.rollout.base import FINISH_LENGTH, FINISH_STOP, RolloutEngine, SamplingArgs, refuses_max_tokens

if TYPE_CHECKING:
    import torch

    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper

Policy = Callable[[list[dict[str, Any]]], Any]


class ScriptedEngine(RolloutEngine):
    """Answers :meth:`chat` / :meth:`chat_async` with ``policy(messages)``; ``calls`` records
    each call's messages and sampling arguments."""

    def __init__(
        self,
        policy: Policy,
        tokenizer: Any = None,
        *,
        chat_template: str | None = None,
        default_args: SamplingArgs | None = None,
        max_prompt_tokens: int | None = None,
        max_model_len: int | None = None,
    ) -> None:
        if tokenizer is None:
            from trinity.testing.tiny_model import build_tokenizer

            tokenizer = build_tokenizer()
        super().__init__(
            tokenizer,
            chat_template=chat_template,
            max_prompt_tokens=max_prompt_tokens,
            max_model_len=max_model_len,
            default_args=default_args or SamplingArgs(max_tokens=1024),
        )
        self.policy = policy
        self.calls: list[dict[str, Any]] = []
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.end_of_turn = (
            end if isinstance(end, int) and end != tokenizer.unk_token_id else tokenizer.eos_token_id
        )

    def _experience(self, prompt: list[int], reply: str, args: SamplingArgs) -> Experience:
        import torch

        from trinity.experience import Experience

        ids = self.tokenizer(str(reply), add_special_tokens=False)["input_ids"] + [self.end_of_turn]
        reason = FINISH_STOP
        if len(ids) > args.max_tokens:
            ids, reason = ids[: args.max_tokens], FINISH_LENGTH
        return Experience(
            tokens=torch.tensor(prompt + ids, dtype=torch.long),
            prompt_length=len(prompt),
            logprobs=torch.zeros(len(ids)),
            prompt_text=self.tokenizer.decode(prompt),
            response_text=self.tokenizer.decode(ids, skip_special_tokens=True),
            info={"finish_reason": reason},
            model_version=self.model_version,
        )

    def _start(
        self,
        messages: list[dict[str, Any]],
        template: dict[str, Any],
        rollout_args: dict[str, Any],
        whole_context: bool,
    ) -> tuple[list[int], SamplingArgs | None]:
        """The prompt's ids and the call's arguments within the engine's limits (``None``: the
        prompt is over ``max_prompt_tokens`` and is answered with masked placeholders)."""
        args = self.sampling_args(**rollout_args)
        self.calls.append({"messages": [dict(m) for m in messages], "args": args, **template})
        # ``tools`` / ``chat_template_kwargs`` go to the template only when given.
        prompt = (
            self.apply_chat_template(messages, **template) if template else self.apply_chat_template(messages)
        )
        ids = self.encode(prompt)
        strict = refuses_max_tokens(whole_context, rollout_args)
        runs, masked = self.plan([ids], args, whole_context=whole_context, strict_max_tokens=strict)
        if masked:
            return ids, None
        (cap,) = runs
        return ids, self._capped(args, cap)

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        prompt, args = self._start(
            messages, _template(tools, chat_template_kwargs), rollout_args, whole_context
        )
        if args is None:
            return self.masked_experiences(prompt, self.sampling_args(**rollout_args).n)
        replies = [self.policy(messages) for _ in range(args.n)]
        if any(inspect.isawaitable(r) for r in replies):
            for r in replies:
                if inspect.iscoroutine(r):
                    r.close()
            raise TypeError("ScriptedEngine.chat: the policy is async; call chat_async")
        return [self._experience(prompt, r, args) for r in replies]

    async def chat_async(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        whole_context: bool = False,
        **rollout_args: Any,
    ) -> list[Experience]:
        prompt, args = self._start(
            messages, _template(tools, chat_template_kwargs), rollout_args, whole_context
        )
        if args is None:
            return self.masked_experiences(prompt, self.sampling_args(**rollout_args).n)
        replies = []
        for _ in range(args.n):
            reply = self.policy(messages)
            replies.append(await reply if inspect.isawaitable(reply) else reply)
        return [self._experience(prompt, r, args) for r in replies]

    def generate_tokens(self, prompts: list[list[int]], args: SamplingArgs) -> list[list[Experience]]:
        raise NotImplementedError("ScriptedEngine answers chat() only: its policy reads messages")

    def logprobs(self, tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
        import torch

        return torch.zeros(max(0, len(tokens) - 1))

    def update_weights(self, state_dict: Mapping[str, Any], version: int) -> None:
        self._model_version = version

    def load_checkpoint(self, path: str, version: int) -> None:
        self._model_version = version


def _template(tools: Any, chat_template_kwargs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if tools:
        out["tools"] = tools
    if chat_template_kwargs:
        out["chat_template_kwargs"] = chat_template_kwargs
    return out


def scripted_model(
    policy: Policy,
    tokenizer: Any = None,
    *,
    wrapper_kwargs: Mapping[str, Any] | None = None,
    **engine_kwargs: Any,
) -> ModelWrapper:
    """The real :class:`~trinity.explorer.model_wrapper.ModelWrapper` over a :class:`ScriptedEngine`.

    ``wrapper_kwargs`` go to the wrapper: e.g. ``{"enable_history": True, "tool_call_parser":
    "hermes", "enable_auto_tool_choice": True}`` for agents that talk to the OpenAI API
    (:func:`scripted_openai_model`); call ``close()`` on the wrapper to stop its server.
    """
    from trinity.explorer.model_wrapper import ModelWrapper

    return ModelWrapper(ScriptedEngine(policy, tokenizer, **engine_kwargs), **dict(wrapper_kwargs or {}))


def scripted_openai_model(policy: Policy, tokenizer: Any = None, **engine_kwargs: Any) -> ModelWrapper:
    """:func:`scripted_model` configured as Trinity-RFT's agent examples configure the rollout
    model: history recorded, ``tool_call_parser: hermes``, ``enable_auto_tool_choice``. Its
    OpenAI API starts on first use (``get_openai_async_client()``); ``close()`` stops it."""
    return scripted_model(
        policy,
        tokenizer,
        wrapper_kwargs={
            "enable_history": True,
            "tool_call_parser": "hermes",
            "enable_auto_tool_choice": True,
        },
        **engine_kwargs,
    )


__all__ = ["Policy", "ScriptedEngine", "scripted_model", "scripted_openai_model"]
