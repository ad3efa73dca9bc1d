"""The multi-turn base class on a toy environment, through the real ModelWrapper over a scripted
engine: concatenated vs step-wise output, max turns, turn timeouts, truncation by max_model_len."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import torch

from trinity.experience import Experience
from trinity.explorer.runner import WorkflowRunner
from trinity.testing import check_component
from trinity.workflow import Task
from trinity_agents.multi_turn import MultiTurnWorkflow, StepResult
from trinity_agents.scripted import scripted_model

END = "<|im_end|>"  # the tiny tokenizer's end of turn


class Counter(MultiTurnWorkflow):
    """Walk from 0 to the task's ``target`` by replying ``+1``; each step forward earns 0.25,
    reaching the target ends the episode (reward 1 in all: see ``episode_reward``)."""

    def reset(self, task):
        super().reset(task)
        self.target = int(task.raw_task["target"])

    def system_prompt(self):
        return "Reply +1 to step forward."

    def reset_env(self):
        self.position = 0
        return f"at {self.position} of {self.target}"

    def step_env(self, response_text):
        moved = response_text.strip() == "+1"
        self.position += moved
        return (
            f"at {self.position} of {self.target}",
            0.25 * moved,
            self.position == self.target,
            {"moved": moved},
        )

    def episode_reward(self, episode):
        return 1.0 if episode.done else 0.0


class AsyncCounter(Counter):
    async def reset_env(self):
        await asyncio.sleep(0)
        return super().reset_env()

    async def step_env(self, response_text):
        await asyncio.sleep(0)
        return StepResult(*super().step_env(response_text))


def task(target=3, **workflow_args):
    return Task(workflow=Counter, raw_task={"target": target}, workflow_args=workflow_args, repeat_times=1)


def plus_one(messages):
    return "+1"


def play(workflow_cls=Counter, policy=plus_one, target=3, **workflow_args):
    model = scripted_model(policy)
    workflow = workflow_cls(task=task(target, **workflow_args), model=model)
    return workflow, model, asyncio.run(workflow.run_async())


def check_shapes(exp):
    response = exp.tokens.shape[0] - exp.prompt_length
    assert exp.prompt_length > 0 and response > 0
    assert exp.action_mask.dtype == torch.bool and exp.action_mask.shape == (response,)
    assert exp.logprobs.shape == (response,)


def test_base_class_conforms():
    check_component("workflow", Counter)
    assert Counter.is_async and Counter.can_reset and not Counter.can_repeat


def test_concatenated_episode_is_one_experience_masking_the_assistant_turns():
    _workflow, model, [exp] = play(target=3)
    tokenizer = model.tokenizer
    check_shapes(exp)
    assert exp.eid.step == 0 and exp.eid.run == 0
    assert exp.reward == 1.0
    assert exp.info["step_rewards"] == [0.25, 0.25, 0.5]  # the residual lands on the last step
    assert exp.info | {"step_rewards": None} == exp.info | {
        "env_steps": 3,
        "env_done": 1,
        "truncated": False,
        "terminate_reason": "done",
        "episode_reward": 1.0,
        "step_rewards": None,
    }
    assert exp.metrics["env_steps"] == 3.0 and exp.metrics["truncated"] == 0.0
    response = exp.tokens[exp.prompt_length :]
    assert tokenizer.decode(response[exp.action_mask].tolist()) == ("+1" + END) * 3
    unmasked = tokenizer.decode(response[~exp.action_mask].tolist())
    assert unmasked.count("at 1 of 3") == 1 and unmasked.count("at 2 of 3") == 1
    prompt = tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
    assert prompt.startswith("<|im_start|>system\nReply +1") and prompt.endswith("<|im_start|>assistant\n")
    assert "at 0 of 3" in prompt
    # the conversation ends with the model's last turn: the final observation is not shown
    assert tokenizer.decode(exp.tokens.tolist()).rstrip("\n").endswith("+1" + END)


def test_step_wise_episode_is_one_experience_per_model_call():
    _workflow, model, exps = play(target=3, step_wise=True)
    assert [e.eid.step for e in exps] == [0, 1, 2]
    assert {e.eid.run for e in exps} == {0} and {e.eid.tid for e in exps} == {exps[0].eid.tid}
    assert [e.reward for e in exps] == [1.0, 1.0, 1.0]  # the episode reward, on every step
    assert [e.info["step_reward"] for e in exps] == [0.25, 0.25, 0.5]
    assert sum(e.info["step_reward"] for e in exps) == exps[-1].info["episode_reward"]
    assert len({e.info["env_state_hash"] for e in exps}) == 3
    assert [e.info["moved"] for e in exps] == [True, True, True]
    # episode-level info and metrics once per episode, on the last step
    assert "terminate_reason" not in exps[0].info and exps[-1].info["terminate_reason"] == "done"
    assert "env_steps" not in exps[0].metrics and exps[-1].metrics["env_steps"] == 3.0
    tokenizer = model.tokenizer
    for i, exp in enumerate(exps):
        check_shapes(exp)
        assert bool(exp.action_mask.all())
        assert exp.response_text == "+1"
        assert tokenizer.decode(exp.tokens[exp.prompt_length :].tolist()) == "+1" + END
        prompt = tokenizer.decode(exp.tokens[: exp.prompt_length].tolist())
        assert prompt.count("<|im_start|>user") == i + 1 and f"at {i} of 3" in prompt
    # each call's prompt extends the previous call's whole sequence (same conversation)
    for before, after in itertools.pairwise(exps):
        assert after.tokens[: before.tokens.shape[0]].tolist() == before.tokens.tolist()


def test_state_hash_is_the_observation_so_equal_states_match_across_episodes():
    _, _, first = play(target=3, step_wise=True)
    _, _, second = play(target=2, step_wise=True)
    assert first[0].info["env_state_hash"] != second[0].info["env_state_hash"]  # "of 3" vs "of 2"
    _, _, again = play(target=3, step_wise=True)
    assert [e.info["env_state_hash"] for e in again] == [e.info["env_state_hash"] for e in first]


def test_async_environment_and_tuple_or_step_result():
    _, _, [exp] = play(AsyncCounter, target=2)
    assert exp.reward == 1.0 and exp.info["env_steps"] == 2


def test_max_turns_truncates_the_episode():
    _, model, [exp] = play(target=10, max_turns=4)
    assert exp.info["env_steps"] == 4 and exp.info["terminate_reason"] == "max_turns"
    assert exp.info["truncated"] is True and exp.reward == 0.0
    assert exp.metrics["max_turns_reached"] == 1.0
    assert len(model.engine.calls) == 4
    _, _, exps = play(target=10, max_env_steps=2, step_wise=True)  # Trinity-RFT's name
    assert [e.eid.step for e in exps] == [0, 1] and exps[-1].info["terminate_reason"] == "max_turns"
    _, _, exps = play(target=30, step_wise=True)
    assert len(exps) == Counter.default_max_turns


def test_a_slow_turn_ends_the_episode_after_turn_timeout():
    async def slow_third_reply(messages):
        turn = sum(m["role"] == "user" for m in messages)
        await asyncio.sleep(10 if turn == 3 else 0)
        return "+1"

    _workflow, model, [exp] = play(policy=slow_third_reply, target=5, turn_timeout=1.0)
    assert exp.info["env_steps"] == 2 and exp.info["terminate_reason"] == "turn_timeout"
    assert exp.metrics["turn_timeout"] == 1.0 and exp.reward == 0.0
    text = model.tokenizer.decode(exp.tokens.tolist())
    assert "at 2 of 5" not in text  # the unanswered observation is dropped
    assert text.rstrip("\n").endswith("+1" + END)

    _, _, exps = play(policy=slow_third_reply, target=5, turn_timeout=1.0, step_wise=True)
    assert [e.eid.step for e in exps] == [0, 1] and exps[-1].info["terminate_reason"] == "turn_timeout"


def test_a_timeout_on_the_first_turn_fails_the_run():
    async def stuck(messages):
        await asyncio.sleep(10)
        return "+1"

    with pytest.raises(TimeoutError, match="first turn"):
        play(policy=stuck, turn_timeout=0.5)


def test_truncation_by_max_model_len():
    # Measure the conversation first, then allow room for exactly two full turns.
    _, model, [full] = play(target=3)
    calls = model.engine.calls
    tokenizer = model.tokenizer
    prompt_lengths = [
        len(model.engine.encode(model.engine.apply_chat_template(c["messages"]))) for c in calls
    ]
    reply = len(tokenizer("+1")["input_ids"]) + 1  # and <|im_end|>
    limit = prompt_lengths[2] + reply - 1  # turn 3's prompt fits, its reply does not: it is cut

    _, model, exps = play(target=3, step_wise=True, max_model_len=limit)
    assert [e.eid.step for e in exps] == [0, 1, 2]
    assert all(e.tokens.shape[0] <= limit for e in exps)
    # every call may generate up to the room left in max_model_len
    assert [c["args"].max_tokens for c in model.engine.calls] == [limit - n for n in prompt_lengths]
    assert model.engine.calls[2]["args"].max_tokens == reply - 1
    assert exps[-1].info["finish_reason"] == "length" and exps[-1].response_text == "+1"

    # One token less: turn 3 has room for no reply, so the episode ends after two turns.
    _, model, [exp] = play(target=3, max_model_len=prompt_lengths[2])
    assert exp.info["env_steps"] == 2 and exp.info["terminate_reason"] == "max_model_len"
    assert exp.metrics["max_model_len_reached"] == 1.0 and exp.info["truncated"] is True
    assert exp.tokens.shape[0] <= prompt_lengths[2]
    assert len(model.engine.calls) == 2
    check_shapes(exp)
    assert tokenizer.decode(exp.tokens[exp.prompt_length :][exp.action_mask].tolist()) == ("+1" + END) * 2

    # min_turn_tokens: a turn needs room for that many reply tokens
    _, _, [exp] = play(target=3, max_model_len=limit, min_turn_tokens=reply)
    assert exp.info["env_steps"] == 2 and exp.info["terminate_reason"] == "max_model_len"
    assert full.info["env_steps"] == 3


def test_a_first_prompt_longer_than_max_model_len_is_an_error():
    with pytest.raises(ValueError, match="first prompt takes"):
        play(max_model_len=10)


def test_max_model_len_without_a_tokenizer_is_checked_on_returned_tokens():
    class Bare:
        """A model double with only the protocol's methods (no tokenizer, no engine)."""

        def __init__(self):
            self.inner = scripted_model(plus_one)

        async def chat_async(self, messages, **args):
            assert "max_tokens" not in args  # nothing to budget with
            return await self.inner.chat_async(messages, **args)

        def convert_messages_to_experience(self, messages):
            return self.inner.convert_messages_to_experience(messages)

    model = Bare()
    first = asyncio.run(Counter(task=task(9), model=model).run_async())[0]
    assert first.info["env_steps"] == 9
    prompt_1 = len(
        model.inner.engine.encode(
            model.inner.engine.apply_chat_template(model.inner.engine.calls[1]["messages"])
        )
    )
    [exp] = asyncio.run(Counter(task=task(9, max_model_len=prompt_1), model=model).run_async())
    assert exp.info["env_steps"] == 2 and exp.info["terminate_reason"] == "max_model_len"


def test_the_model_wrappers_max_model_len_is_the_default():
    model = scripted_model(plus_one, max_model_len=10)  # the rollout model's limit, as configured
    assert model.max_model_len == 10
    with pytest.raises(ValueError, match="max_model_len 10"):
        asyncio.run(Counter(task=task(), model=model).run_async())
    workflow = Counter(task=task(max_model_len=99), model=model)
    assert workflow.resolve_max_model_len() == 99


def test_a_conversation_past_max_prompt_tokens_ends_as_the_engine_would_mask_the_next_turn():
    _, probe, _ = play(target=3)
    engine = probe.engine
    lengths = [len(engine.encode(engine.apply_chat_template(c["messages"]))) for c in engine.calls]
    # Room for the first two prompts only: the third turn's prompt is over max_prompt_tokens.
    model = scripted_model(plus_one, max_prompt_tokens=lengths[1], max_model_len=lengths[1] + 50)
    [exp] = asyncio.run(Counter(task=task(3), model=model).run_async())
    assert exp.info["env_steps"] == 2 and exp.info["terminate_reason"] == "max_model_len"
    assert len(model.engine.calls) == 2 and exp.tokens.shape[0] <= lengths[1] + 50
    # Without enable_prompt_truncation the engine samples such a prompt: the episode runs on.
    model.engine.enable_prompt_truncation = False
    [exp] = asyncio.run(Counter(task=task(3), model=model).run_async())
    assert exp.info["env_steps"] == 3 and exp.info["terminate_reason"] == "done"


def test_sync_run_and_reset_reuse_the_instance():
    model = scripted_model(plus_one)
    workflow = Counter(task=task(2), model=model)
    [exp] = workflow.run()
    assert exp.info["env_steps"] == 2
    workflow.reset(task(4, step_wise=True))
    exps = workflow.run()
    assert [e.eid.step for e in exps] == [0, 1, 2, 3]

    async def inside_a_loop():
        workflow.run()

    with pytest.raises(RuntimeError, match="await run_async"):
        asyncio.run(inside_a_loop())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"max_turns": 0}, "max_turns must be an integer >= 1"),
        ({"max_env_steps": "x"}, "max_env_steps must be an integer >= 1"),
        ({"turn_timeout": -1}, "turn_timeout must be a positive number"),
        ({"max_model_len": "long"}, "max_model_len must be a positive number"),
        ({"step_wise": "maybe"}, "step_wise must be true or false"),
    ],
)
def test_bad_workflow_args_are_reported(args, message):
    with pytest.raises(ValueError, match=message):
        Counter(task=task(**args), model=scripted_model(plus_one))


def test_step_env_must_return_a_step_result():
    class Broken(Counter):
        def step_env(self, response_text):
            return "nope"

    with pytest.raises(TypeError, match="StepResult or a tuple"):
        play(Broken)


def test_the_runner_numbers_runs_and_keeps_steps():
    model = scripted_model(plus_one)
    runner = WorkflowRunner(model, max_timeout=30, max_retry_times=0)
    t = task(2, step_wise=True)
    t.repeat_times = 3
    result = asyncio.run(runner.run_task(t))
    assert result.ok and len(result.experiences) == 6
    assert [(e.eid.run, e.eid.step) for e in result.experiences] == [
        (r, s) for r in range(3) for s in range(2)
    ]
    assert all(isinstance(e, Experience) for e in result.experiences)

    t = task(2)
    t.repeat_times = 2
    result = asyncio.run(runner.run_task(t))
    assert [(e.eid.run, e.eid.step) for e in result.experiences] == [(0, 0), (1, 0)]


def test_the_reply_cap_is_the_smaller_of_max_tokens_and_the_room_left():
    from trinity.config import GenerationConfig

    t = task(2, max_model_len=4096)
    t.rollout_args = GenerationConfig(max_tokens=7, temperature=0.5)
    model = scripted_model(plus_one)
    Counter(task=t, model=model).run()
    assert [(c["args"].max_tokens, c["args"].temperature, c["args"].n) for c in model.engine.calls] == [
        (7, 0.5, 1)
    ] * 2


def test_close_env_runs_after_every_episode_even_a_failed_one():
    closed = []

    class Closing(Counter):
        def close_env(self):
            closed.append(self.position)

    class Failing(Closing):
        def step_env(self, response_text):
            raise RuntimeError("the environment broke")

    play(Closing, target=2)
    assert closed == [2]
    with pytest.raises(RuntimeError, match="environment broke"):
        play(Failing, target=2)
    assert closed == [2, 0]
