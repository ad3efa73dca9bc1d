"""Hook implementations of trinity-plugins-math (entry point `trinity` → `trinity_math.hooks`).

Importing this module must stay light (no torch, transformers or math-verify at import time):
`trinity plugins` loads it. The reward and workflow modules import their heavy dependencies on
first use.
"""

from __future__ import annotations

from trinity import hookimpl
from trinity.hookspecs import Register
from trinity_math import bots, dapo, distill, mm_workflow, reward_model, rewards, rubric, ruler, workflows

WORKFLOWS = {
    "math_rm_workflow": reward_model.MathRMWorkflow,
    "async_math_rm_workflow": reward_model.AsyncMathRMWorkflow,
    "bots_math_boxed_workflow": bots.BOTSMathBoxedWorkflow,
    bots.UPSTREAM_CLASS_PATH: bots.BOTSMathBoxedWorkflow,
    "bots_ref_eval_collect_math_boxed_workflow": bots.BOTSRefEvalCollectMathBoxedWorkflow,
    "simple_workflow": workflows.SimpleWorkflow,
    "async_simple_workflow": workflows.AsyncSimpleWorkflow,
    "math_workflow": workflows.MathWorkflow,
    "async_math_workflow": workflows.AsyncMathWorkflow,
    "math_boxed_workflow": workflows.MathBoxedWorkflow,
    "simple_mm_workflow": mm_workflow.SimpleMMWorkflow,
    "async_simple_mm_workflow": mm_workflow.AsyncSimpleMMWorkflow,
    "on_policy_distill_workflow": distill.OnPolicyDistillWorkflow,
    "on_policy_distill_math_workflow": distill.OnPolicyDistillMathWorkflow,
    "math_ruler_workflow": ruler.MathRULERWorkflow,
    "math_trainable_ruler_workflow": ruler.MathTrainableRULERWorkflow,
    "rubric_judge_workflow": rubric.RubricJudgeWorkflow,
    "rubric_judge_openai_workflow": rubric.RubricJudgeOpenAIWorkflow,
}

REWARD_FNS = {
    "rm_gallery_reward": reward_model.RMGalleryRewardFn,
    "math_reward": rewards.MathRewardFn,
    "math_boxed_reward": rewards.MathBoxedRewardFn,
    "math_dapo_reward": dapo.MathDAPORewardFn,
    "countdown_reward": rewards.CountdownRewardFn,
    "accuracy_reward": rewards.AccuracyReward,
    "format_reward": rewards.FormatReward,
}


@hookimpl
def register_workflows(register: Register) -> None:
    """Register the math, on-policy distillation and judge (RULER, rubric) workflows."""
    for name, cls in WORKFLOWS.items():
        register(name, cls)


@hookimpl
def register_reward_fns(register: Register) -> None:
    """Register the math and countdown reward functions."""
    for name, cls in REWARD_FNS.items():
        register(name, cls)
