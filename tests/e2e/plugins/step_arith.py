"""Test plugin (``--plugin-dir tests/e2e/plugins``): ``step_arith``, a two-turn step-wise workflow.

Turn 1 asks the task's question; turn 2 asks the model to state its final answer. Each model
call becomes its own Experience (``eid.step`` 0 and 1, same run), as a multi-step agent's turns
do, so the trainer sees two-step trajectories. The episode reward (``varied_reward``'s length
class of the last turn's answer, so episodes differ) is on the last step; ``info`` carries GiGPO's ``step_reward`` and an
``env_state_hash`` (the conversation so far), so both step-wise algorithms have their inputs.
"""

from __future__ import annotations

import hashlib

from trinity import hookimpl
from trinity.experience import Experience
from trinity.workflow import Workflow


class StepArith(Workflow):
    def run(self) -> list[Experience]:
        messages = [{"role": "user", "content": self.task.task_desc or ""}]
        args = {"n": 1, "max_tokens": 8, "temperature": 1.0}
        steps = []
        for step, follow_up in enumerate([None, "So the answer is?"]):
            if follow_up:
                messages.append({"role": "user", "content": follow_up})
            exp = self.model.chat(messages, **args)[0]
            state = hashlib.sha1(repr(messages).encode()).hexdigest()[:12]
            messages.append({"role": "assistant", "content": exp.response_text or ""})
            exp.eid.step = step
            exp.info = {**exp.info, "env_state_hash": state}
            steps.append(exp)
        final = (len(steps[-1].response_text or "") % 3) / 2
        for exp in steps:
            last = exp is steps[-1]
            exp.reward = final if last else 0.0
            exp.info["step_reward"] = exp.reward
        return steps


@hookimpl
def register_workflows(register):
    register("step_arith", StepArith)
