"""Where a CPU GRPO step's time goes: one real `trinity run` of the quickstart's GRPO settings
(16 prompts x 8 rollouts, 56-token answers, native trainer, transformers engine, memory sync,
strictly on-policy) on a tiny math model, then the breakdown read back from its TensorBoard
files.

    python benchmarks/profile_grpo.py [--steps 20] [--work-dir /tmp/trinity-profile]

Each part is the median over the steps after the first two (warm-up). The explorer and the
trainer take turns (explore N+1 waits for the weights of train N), so a step's wall time (from
one trainer log to the next) is explore + train + what lies between: the weight sync, Ray round
trips and the driver's bookkeeping ("between the actors"). Start-up (Ray, actors, model loads)
and shutdown (final checkpoint) are shown apart. The model is untrained, so its answers are
longer than an SFT model's: generation weighs more here than in the quickstart.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

CONFIG = """
project: profile
name: grpo
checkpoint_root_dir: {root}/ckpt
algorithm: {{algorithm_type: grpo, repeat_times: 8, optimizer: {{lr: 3.0e-4}}}}
model: {{model_path: {root}/model, max_prompt_tokens: 32, max_response_tokens: 56}}
buffer:
  batch_size: 16
  total_steps: {steps}
  explorer_input:
    taskset:
      name: sums
      path: {root}/data
      split: train
      format: {{prompt_key: question, response_key: answer, system_prompt: ""}}
      rollout_args: {{temperature: 1.0}}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input: {{experience_buffer: {{name: experiences, storage_type: queue}}}}
explorer:
  runner_per_model: 16
  rollout_model: {{engine_type: transformers, dtype: {dtype}, seed: 0}}
synchronizer: {{sync_method: memory, sync_interval: 1, sync_offset: 0}}
trainer: {{trainer_type: native, save_interval: 0, dtype: {dtype}, seed: 0, max_token_len_per_gpu: 16384}}
monitor: {{monitor_type: tensorboard}}
"""

PARTS = {
    "explorer": [
        ("timing/read_tasks", "read tasks"),
        ("timing/rollout", "rollout: generate + reward (workflows)"),
        ("timing/generate", "  of which the engine's generate batches"),
        ("timing/write_experiences", "write experiences to the buffer"),
    ],
    "trainer": [
        ("timing/read_experience", "read experiences from the buffer"),
        ("timing/old_log_prob", "old-logprob recompute"),
        ("timing/ref", "reference-model forward (KL)"),
        ("timing/adv", "advantages"),
        ("timing/update_actor", "actor forward + backward + optimizer"),
    ],
}


def _events(folder: Path) -> dict[str, list[tuple[int, float, float]]]:
    """``{tag: [(step, wall_time, value)]}`` of one role's event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.wall_time, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _median(points: list[tuple[int, float, float]], skip: int = 2) -> float | None:
    values = [v for _, _, v in points[skip:]] or [v for _, _, v in points]
    return statistics.median(values) if values else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--work-dir", default="/tmp/trinity-profile")
    parser.add_argument(
        "--dtype", default="float32", help="engine and trainer dtype (float32, bfloat16, auto)"
    )
    args = parser.parse_args()
    root = Path(args.work_dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    from trinity_math.tasks import arithmetic_problems
    from trinity_math.tiny import create_math_model

    create_math_model(root / "model", seed=0)
    (root / "data").mkdir()
    rows = [
        {"question": p.question, "answer": p.answer}
        for p in arithmetic_problems(16 * args.steps, terms=3, seed=1)
    ]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "job.yaml").write_text(CONFIG.format(root=root, steps=args.steps, dtype=args.dtype))

    start = time.time()
    cli = [sys.executable, "-m", "trinity.cli", "run", "--config", str(root / "job.yaml")]
    proc = subprocess.run(cli, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    end = time.time()
    if proc.returncode != 0:
        sys.exit(f"the job failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    tb = root / "ckpt" / "profile" / "grpo" / "monitor" / "tensorboard"
    explorer, trainer = _events(tb / "explorer"), _events(tb / "trainer")

    explore = _median(explorer["timing/explore_step"])
    train = _median(trainer["timing/step"])
    trained = trainer["timing/step"]
    walls = [b[1] - a[1] for a, b in itertools.pairwise(trained)][2:]
    wall = statistics.median(walls)
    print(
        f"GRPO step on CPU, median of steps 3-{args.steps} ({len(rows) // args.steps} prompts x 8 rollouts):"
    )
    print(f"  {'wall time per step':44s} {wall:7.3f} s  100%")
    for role, total, label in (("explorer", explore, "explore step"), ("trainer", train, "train step")):
        print(f"  {label:44s} {total:7.3f} s  {100 * total / wall:4.0f}%")
        events = explorer if role == "explorer" else trainer
        for tag, name in PARTS[role]:
            if tag in events:
                value = _median(events[tag])
                print(f"    {name:42s} {value:7.3f} s  {100 * value / wall:4.0f}%")
    between = wall - explore - train
    print(f"  {'between the actors (sync, Ray, driver)':44s} {between:7.3f} s  {100 * between / wall:4.0f}%")
    lengths = explorer.get("rollout/response_length_mean", [])
    if lengths:
        print(f"  (mean response length {_median(lengths):.1f} tokens)")
    first = min(explorer["timing/explore_step"][0][1], trained[0][1])
    print(
        f"start-up until the first step's log: {first - start:.1f} s; after the last: {end - trained[-1][1]:.1f} s"
    )
    print(f"whole job: {end - start:.1f} s for {args.steps} steps")


if __name__ == "__main__":
    main()
