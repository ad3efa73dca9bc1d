"""Experience pipeline overhead: an explore step with and without the pipeline.

    python benchmarks/pipeline.py [--groups 16] [--repeat 8] [--tokens 512] [--steps 20]
                                  [--explore-steps 6]

Part 1 (the target: overhead per explore step): a real CPU explore step of the tiny math model
(``trinity_math.tiny``, 4 tasks x 8 rollouts, transformers engine, SQLite buffer), run by two
in-process explorers, one with the six built-in operators in its experience pipeline; steps
interleaved, median time per step, and their ratio.

Part 2, a harsher baseline:
a step is ``--groups`` tasks x ``--repeat`` rollouts of ``--tokens`` tokens (half response),
rewards 0/1 with a quarter of the groups all-correct and a quarter all-wrong. Each round writes
``--steps`` steps into a fresh SQLite buffer, once through the plain writer and once through the
experience pipeline of every built-in operator (reward shaping, pass rate, invalid-reward, reward
and reward-std filters, duplicate filter), interleaved, fastest of 3 rounds each. Printed: the
time per step of each and their ratio. This is the pipeline's cost against the buffer write it
wraps, a harsher baseline than a whole explore step (whose generation dwarfs both). The pipeline
drops the zero-variance groups, so its buffer writes less: the "same rows" line times a plain
writer given exactly what the pipeline kept, to show the pipeline's own cost.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch

from trinity.buffer.sql import SQLStorage, SQLWriter
from trinity.data.experience_ops import EXPERIENCE_OPERATORS as OPS
from trinity.data.pipeline import ExperiencePipeline, PipelineWriter
from trinity.experience import EID, Experience


def copy(exp: Experience) -> Experience:
    """A copy sharing the tensors, with its own reward and info."""
    return Experience(**{**exp.__dict__, "info": dict(exp.info)})


def make_step(step: int, groups: int, repeat: int, tokens: int) -> list[Experience]:
    out = []
    half = tokens // 2
    for g in range(groups):
        for r in range(repeat):
            reward = 1.0 if g % 4 == 0 else 0.0 if g % 4 == 1 else float((g + r) % 2)
            out.append(
                Experience(
                    tokens=torch.randint(0, 30000, (tokens,)),
                    prompt_length=half,
                    logprobs=torch.randn(tokens - half),
                    reward=reward,
                    eid=EID(batch=step, task=g, run=r),
                    info={"quality": 0.1},
                )
            )
    return out


def pipeline() -> ExperiencePipeline:
    return ExperiencePipeline(
        [
            ("invalid_reward_filter", OPS["invalid_reward_filter"]()),
            (
                "reward_shaping_mapper",
                OPS["reward_shaping_mapper"]([{"stats_key": "quality", "op_type": "ADD"}]),
            ),
            ("pass_rate_calculator", OPS["pass_rate_calculator"]()),
            ("reward_filter", OPS["reward_filter"](threshold=-1.0)),
            ("reward_std_filter", OPS["reward_std_filter"]()),
            ("duplicate_filter", OPS["duplicate_filter"]()),
        ]
    )


def run(
    steps: list[list[Experience]], with_pipeline: bool, only: list[list[Experience]] | None = None
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        writer = SQLWriter(SQLStorage(f"sqlite:///{tmp}/b.db", "exp"))
        if with_pipeline:
            writer = PipelineWriter(writer, pipeline())
        warm = make_step(0, 1, 1, 8)  # connect and create the tables outside the timing
        writer.write(warm)
        writer.end_step(0)
        # Fresh copies (the pipeline reshapes rewards in place), made before the clock starts.
        data = [[copy(e) for e in exps] for exps in (only if only is not None else steps)]
        start = time.perf_counter()
        for step, exps in enumerate(data, start=1):
            writer.write(exps)
            writer.end_step(step)
        return (time.perf_counter() - start) / len(data)


EXPLORE = """
project: bench
name: {name}
checkpoint_root_dir: {root}/ckpt
algorithm: {{algorithm_type: grpo, repeat_times: 8}}
model: {{model_path: {root}/model, max_prompt_tokens: 64, max_response_tokens: 24}}
data_processor:
  experience_pipeline:
    save_input: false
    operators: {operators}
buffer:
  batch_size: 4
  explorer_input:
    taskset:
      name: arith
      path: {root}/data
      format: {{prompt_key: question, response_key: answer, system_prompt: ""}}
    default_workflow_type: math_workflow
    default_reward_fn_type: math_reward
  trainer_input:
    experience_buffer: {{name: exp, storage_type: sql, path: "sqlite:///{root}/{name}.db"}}
explorer:
  runner_per_model: 2
  rollout_model: {{engine_type: transformers, dtype: float32, seed: 1}}
"""

BUILTINS = [
    {"name": "invalid_reward_filter"},
    {"name": "pass_rate_calculator"},
    {"name": "reward_shaping_mapper", "args": {"reward_shaping_configs": [{"stats_key": "accuracy"}]}},
    {"name": "reward_filter", "args": {"threshold": -1.0}},
    {"name": "reward_std_filter"},
    {"name": "duplicate_filter"},
]


def explore_steps(steps: int) -> None:
    """Part 1: median explore step time with and without the built-in pipeline."""
    import json
    import statistics

    from trinity.config import load_config
    from trinity.explorer.explorer import Explorer
    from trinity_math.tasks import main as make_tasks
    from trinity_math.tiny import create_math_model

    with tempfile.TemporaryDirectory() as root:
        make_tasks(
            ["arithmetic", "--out", f"{root}/data", "--train", "200", "--test", "4", "--difficulty", "3"]
        )
        create_math_model(f"{root}/model", seed=0)
        explorers = {}
        for name, ops in (("plain", []), ("pipeline", BUILTINS)):
            text = EXPLORE.format(root=root, name=name, operators=json.dumps(ops))
            with open(f"{root}/{name}.yaml", "w") as f:
                f.write(text)
            explorers[name] = Explorer(load_config(f"{root}/{name}.yaml"))
        times: dict[str, list[float]] = {name: [] for name in explorers}
        for _ in range(steps + 1):
            for name, explorer in explorers.items():
                start = time.perf_counter()
                metrics = explorer.explore_step()
                times[name].append(time.perf_counter() - start)
        cost = metrics.get("pipeline/seconds", 0.0)
        plain = statistics.median(times["plain"][1:])  # the first step warms up
        piped = statistics.median(times["pipeline"][1:])
        print(f"explore step, tiny model, 4 tasks x 8 rollouts, {steps} steps each (median):")
        print(f"  without pipeline:  {plain:6.3f} s/step")
        print(f"  with 6 built-ins:  {piped:6.3f} s/step  ({piped / plain:.3f}x)")
        print(
            f"  the pipeline itself: {1000 * cost:.2f} ms in the last step: overhead ratio "
            f"{(plain + cost) / plain:.5f} (the step times above differ by the machine's noise)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--explore-steps", type=int, default=6, help="0 skips part 1")
    args = parser.parse_args()
    if args.explore_steps:
        explore_steps(args.explore_steps)
    torch.manual_seed(0)
    steps = [make_step(s, args.groups, args.repeat, args.tokens) for s in range(1, args.steps + 1)]
    kept = [pipeline().process([copy(e) for e in s])[0] for s in steps]
    plain, piped, same = [], [], []
    for _ in range(3):  # interleaved rounds: both see the same machine load
        plain.append(run(steps, False))
        piped.append(run(steps, True))
        same.append(run(steps, False, kept))
    base, with_pipe, same_rows = min(plain), min(piped), min(same)
    n = args.groups * args.repeat
    print(f"step: {args.groups} groups x {args.repeat} rollouts = {n} experiences of {args.tokens} tokens")
    print(f"kept by the pipeline: {len(kept[0])} of {n} (zero-variance groups dropped)")
    print(f"plain writer:             {1000 * base:7.2f} ms/step")
    print(f"pipeline writer:          {1000 * with_pipe:7.2f} ms/step  ({with_pipe / base:.2f}x plain)")
    print(f"plain writer, same rows:  {1000 * same_rows:7.2f} ms/step")
    print(f"pipeline's own cost:      {with_pipe / same_rows:.2f}x the write of the rows it kept")
    ops = pipeline()
    sample = [copy(e) for e in steps[0]]
    for name, op in ops.operators:
        start = time.perf_counter()
        for _ in range(20):
            op.process([copy(e) for e in sample])
        print(f"  {name:24s} {1000 * (time.perf_counter() - start) / 20:6.2f} ms/step (with copying)")


if __name__ == "__main__":
    main()
