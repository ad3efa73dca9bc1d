"""Asynchronous RL against its synchronous baseline, and long-tail control, in the same run.

The same tiny CPU GRPO job (the math plugin's arithmetic taskset and tiny model, real Ray,
native trainer, memory weight sync) runs four times:

1. ``sync_offset 0`` (strictly on-policy: explore, train, sync, ...) against ``sync_offset 1``
   (the explorer explores step ``n + 1`` while the trainer trains step ``n``);
2. with a long tail (one task in five sleeps ``--slow-s`` seconds before its rollouts; a
   workflow wrapper from a ``--plugin-dir`` written by this script), ``over_rollout`` off
   against on (``ratio 0.2``: a step goes on once four tasks of five finished, and drops the
   slow one). Both with ``sync_style: explorer_driven`` (over_rollout needs a dynamic style);
3. over_rollout on with partial rollouts (``partial_rollout: true``, ``max_staleness: 4``): the
   slow task is carried over the following steps and finishes in one of them under newer weights
   instead of being dropped (dropped for staleness only past 4 versions).

Times are the launcher's step loop only (actor start-up and model loading excluded).

    python benchmarks/async.py [--steps 8] [--slow-s 2]

Prints, per run, trainer steps/s and experiences/s (tasks dropped and, with partial rollouts,
resumed and dropped for staleness), and the ratios offset 1 / offset 0, over_rollout on / off and partial rollouts /
dropping.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
import time
from pathlib import Path

PLUGIN = '''
"""Benchmark plugin: ``slow_math``, the math workflow with a long tail (every fifth task sleeps)."""
import os
import time

from trinity import hookimpl
from trinity_math.workflows import MathWorkflow


class SlowMath(MathWorkflow):
    def run(self):
        if self.task.index % 5 == 0:
            time.sleep(float(os.environ["TRINITY_BENCH_SLOW_S"]))
        return super().run()


@hookimpl
def register_workflows(register):
    register("slow_math", SlowMath)
'''

CONFIG = """
project: bench
name: {name}
mode: both
checkpoint_root_dir: {root}/ckpt
algorithm: {{algorithm_type: grpo, repeat_times: 4, optimizer: {{lr: 1.0e-4}}}}
model: {{model_path: {root}/model, max_prompt_tokens: 128, max_response_tokens: 48}}
buffer:
  total_steps: {steps}
  batch_size: 5
  explorer_input:
    taskset:
      name: arith
      path: {root}/data
      split: train
      format: {{prompt_key: question, response_key: answer, system_prompt: ""}}
    default_workflow_type: {workflow}
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer: {{name: exp_{name}, storage_type: queue}}
explorer:
  eval_interval: 1000
  eval_on_startup: false
  runner_per_model: 5
  over_rollout: {{ratio: {ratio}, wait_after_min: 0, partial_rollout: {partial}, max_staleness: 4}}
  rollout_model: {{engine_type: transformers, engine_num: 1, dtype: float32, seed: 1}}
synchronizer: {{sync_method: memory, sync_style: {style}, sync_interval: 1, sync_offset: {offset}}}
trainer: {{trainer_type: native, save_interval: 0, dtype: float32}}
monitor: {{monitor_type: tensorboard}}
"""


def run_job(root: Path, name: str, steps: int, **params: object) -> dict[str, float]:
    """Run one job; steps/s and experiences/s of its step loop."""
    from trinity import launcher
    from trinity.config import load_config
    from trinity.step_loop import StepLoop

    path = root / f"{name}.yaml"
    path.write_text(textwrap.dedent(CONFIG.format(root=root, name=name, steps=steps, **params)))
    config = load_config(path)
    seen: dict[str, float] = {"experiences": 0.0}
    loop_cls = StepLoop
    run, explored = loop_cls.run, loop_cls.explored

    def timed_run(self):
        start = time.monotonic()
        result = run(self)
        seen["seconds"] = time.monotonic() - start
        seen["train_steps"] = float(self.trainer_step)
        return result

    def counting(self, result):
        metrics = result.metrics
        seen["experiences"] += float(metrics.get("rollout/num_experiences", 0.0))
        seen["dropped"] = seen.get("dropped", 0.0) + float(
            metrics.get("rollout/over_rollout/dropped_tasks", 0.0)
        )
        for key, name in (("resumed_tasks", "resumed"), ("stale_dropped_tasks", "stale")):
            seen[name] = seen.get(name, 0.0) + float(metrics.get(f"rollout/partial_rollout/{key}", 0.0))
        return explored(self, result)

    loop_cls.run, loop_cls.explored = timed_run, counting
    try:
        code = launcher.run(config)
    finally:
        loop_cls.run, loop_cls.explored = run, explored
    if code != 0:
        raise SystemExit(f"job {name} failed (exit {code})")
    seconds = seen["seconds"]
    return {
        "steps_per_s": seen["train_steps"] / seconds,
        "exps_per_s": seen["experiences"] / seconds,
        "seconds": seconds,
        "dropped": seen.get("dropped", 0.0),
        "resumed": seen.get("resumed", 0.0),
        "stale": seen.get("stale", 0.0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--slow-s", type=float, default=2.0)
    args = parser.parse_args()

    from trinity_math.tasks import main as make_tasks
    from trinity_math.tiny import create_math_model

    root = Path(tempfile.mkdtemp(prefix="trinity_bench_async_"))
    make_tasks(["arithmetic", "--out", str(root / "data"), "--train", "90", "--test", "4"])
    create_math_model(root / "model", seed=0)
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "slow_math.py").write_text(PLUGIN)
    # The launcher passes TRINITY_* variables to the Ray actors, which load the plugin dir.
    os.environ["TRINITY_PLUGIN_DIRS"] = str(plugins)
    os.environ["TRINITY_BENCH_SLOW_S"] = str(args.slow_s)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.pop("RAY_ADDRESS", None)

    plain = {"workflow": "math_workflow", "ratio": 0.0, "style": "fixed", "partial": "false"}
    tail = {"workflow": "slow_math", "style": "explorer_driven", "offset": 1}
    runs = {
        "offset0": run_job(root, "offset0", args.steps, offset=0, **plain),
        "offset1": run_job(root, "offset1", args.steps, offset=1, **plain),
        "tail_over_off": run_job(root, "tail_over_off", args.steps, ratio=0.0, partial="false", **tail),
        "tail_over_on": run_job(root, "tail_over_on", args.steps, ratio=0.2, partial="false", **tail),
        "tail_partial": run_job(root, "tail_partial", args.steps, ratio=0.2, partial="true", **tail),
    }
    print()
    print(f"{'run':<16}{'loop s':>9}{'steps/s':>10}{'exps/s':>10}{'dropped':>9}{'resumed':>9}{'stale':>7}")
    for name, r in runs.items():
        print(
            f"{name:<16}{r['seconds']:>9.1f}{r['steps_per_s']:>10.3f}{r['exps_per_s']:>10.2f}{r['dropped']:>9.0f}"
            f"{r['resumed']:>9.0f}{r['stale']:>7.0f}"
        )
    print()
    ratio = runs["offset1"]["steps_per_s"] / runs["offset0"]["steps_per_s"]
    print(f"sync_offset 1 / sync_offset 0 (steps/s, fixed style):            {ratio:.2f}x")
    on, off = runs["tail_over_on"], runs["tail_over_off"]
    print(
        f"over_rollout on / off, 20% long tail ({args.slow_s:g}s): steps/s {on['steps_per_s'] / off['steps_per_s']:.2f}x, "
        f"experiences/s {on['exps_per_s'] / off['exps_per_s']:.2f}x"
    )
    part = runs["tail_partial"]
    print(
        f"partial rollouts / dropping (over_rollout on): steps/s {part['steps_per_s'] / on['steps_per_s']:.2f}x, "
        f"experiences/s {part['exps_per_s'] / on['exps_per_s']:.2f}x"
    )


if __name__ == "__main__":
    main()
