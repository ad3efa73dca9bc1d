"""What a multi-stage job's stages cost when their actors are kept (restarted in place for the
next stage, :mod:`trinity.stage_actors`) against new actors for every stage.

    python benchmarks/stages.py [--stages 6] [--repeats 3] [--work-dir /tmp/trinity-stages]

One job of ``--stages`` stages, each two GRPO steps on the tiny math model (transformers
engine, native trainer, memory sync), run by ``trinity run`` in a fresh process, alternately as
shipped and with ``trinity.stage_actors.can_restart`` patched to refuse every actor (so each
stage starts new ones, as before). The two runs of a repeat are back to back, so the ratio of
their wall times is paired; it is shown with a bootstrap interval over the repeats. Both runs'
final weights are compared too: keeping actors must not change what a job trains.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _stats import bootstrap, interval  # benchmarks/_stats.py, beside this script


def _job(root: Path, label: str, stages: int) -> dict:
    """The tiny math job (:func:`trinity.testing.jobs.tiny_job`) as ``stages`` stages of two
    GRPO steps, 4 tasks x 4 rollouts each, memory sync, a queue buffer."""
    from trinity.testing.jobs import tiny_job, tiny_taskset

    return tiny_job(
        root,
        project="bench",
        name="stages",
        checkpoint_root_dir=f"{root}/{label}",
        algorithm={"repeat_times": 4, "optimizer": {"lr": 1.0e-3}},
        model={"max_prompt_tokens": 32, "max_response_tokens": 16},
        buffer={
            "batch_size": 4,
            "total_steps": 2,
            "explorer_input": {"taskset": tiny_taskset(root, name="sums", rollout_args={"temperature": 1.0})},
            "trainer_input": {
                "experience_buffer": {"name": "experiences", "storage_type": "queue", "path": None}
            },
        },
        explorer={"runner_per_model": 4, "rollout_model": {"seed": 0}},
        synchronizer={"sync_method": "memory", "sync_interval": 1},
        trainer={"save_interval": 2, "seed": 0},
        stages=[{"stage_name": f"s{i}"} for i in range(stages)],
    )


#: ``trinity run`` with every stage starting new actors (the behaviour before actors were kept).
NEW_ACTORS = (
    "import sys, trinity.stage_actors as s; s.can_restart = lambda config, role: False; "
    "from trinity.cli import main; sys.exit(main())"
)


def _run(root: Path, label: str, stages: int, keep: bool) -> float:
    """Wall time of one job; its final weights are under ``root/label``."""
    from trinity.testing.jobs import write_job

    shutil.rmtree(root / label, ignore_errors=True)
    path = write_job(root / f"{label}.yaml", _job(root, label, stages))
    args = ["-m", "trinity.cli"] if keep else ["-c", NEW_ACTORS]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args, "run", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"the {label} job failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    restarts = sum(log.read_text().count("restarted in place") for log in (root / label).rglob("log/*.log"))
    expected = 2 * (stages - 1) if keep else 0
    if restarts != expected:
        sys.exit(f"the {label} job restarted {restarts} actors in place, not {expected}")
    return wall


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stages", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir", default="/tmp/trinity-stages")
    args = parser.parse_args()
    root = Path(args.work_dir)
    shutil.rmtree(root, ignore_errors=True)
    (root / "data").mkdir(parents=True)
    from trinity_math.tasks import arithmetic_problems
    from trinity_math.tiny import create_math_model

    create_math_model(root / "model", seed=0)
    rows = [{"question": p.question, "answer": p.answer} for p in arithmetic_problems(64, terms=2, seed=1)]
    (root / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    kept, new = [], []
    for repeat in range(args.repeats):
        # Alternate which goes first, so a drift of the machine's speed does not favour one.
        order = [True, False] if repeat % 2 == 0 else [False, True]
        for keep in order:
            wall = _run(root, "kept" if keep else "new", args.stages, keep)
            (kept if keep else new).append(wall)
        print(f"repeat {repeat + 1}: kept actors {kept[-1]:.1f} s, new actors {new[-1]:.1f} s", flush=True)

    final = Path("bench") / "stages" / f"s{args.stages - 1}" / "global_step_2"
    a, b = _weights(root / "kept" / final), _weights(root / "new" / final)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    initial = _weights(root / "model")
    moved = max((a[k] - initial[k]).abs().max().item() for k in a)
    ratios = [n / k for k, n in zip(kept, new)]
    low_high = interval(bootstrap(ratios, statistics.median))
    span = f" (95% interval {low_high[0]:.2f}-{low_high[1]:.2f})" if low_high else ""
    print(f"{args.stages} stages x 2 GRPO steps, {args.repeats} paired repeats:")
    print(
        f"  kept actors: median {statistics.median(kept):.1f} s ({statistics.median(kept) / args.stages:.2f} s a stage)"
    )
    print(
        f"  new actors:  median {statistics.median(new):.1f} s ({statistics.median(new) / args.stages:.2f} s a stage)"
    )
    print(f"  new / kept: median {statistics.median(ratios):.2f}{span}")
    print(
        f"  final weights, kept vs new actors: largest difference {diff:.3g} (training moved them {moved:.3g})"
    )


if __name__ == "__main__":
    main()
