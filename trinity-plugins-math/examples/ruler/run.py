"""RULER on CPU: does the judge matter? The quickstart's job with its GRPO reward replaced by a
scripted judge's group scores (``math_ruler_workflow``), against the same job with a random judge.

    python trinity-plugins-math/examples/ruler/run.py [--work-dir ./ruler-run] [--seeds 0 1 2]

For each seed and judge (``ruler_scripted_judge``, ``ruler_random_judge``; see judges.py) it
prepares the quickstart's data and tiny model (``examples/quickstart/run.py``'s ``prepare``),
runs ``trinity run --config ruler.yaml --plugin-dir <this folder>`` (SFT warm-up, then 120 GRPO
steps rewarded by the judge) and reads the held-out accuracy before and after RL. Prints one row
per run and the mean change per judge.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
QUICKSTART = HERE.parents[2] / "examples" / "quickstart" / "run.py"
JUDGES = ("ruler_scripted_judge", "ruler_random_judge")


def quickstart():
    """The quickstart's run.py as a module (its ``prepare`` and ``run_to_the_end``)."""
    spec = importlib.util.spec_from_file_location("quickstart_run", QUICKSTART)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_one(work: Path, seed: int, judge: str) -> dict[str, float]:
    """One job; held-out accuracy before and after RL."""
    from trinity.monitor.tensorboard import eval_curves

    qs = quickstart()
    start = time.monotonic()
    qs.prepare(work, seed)
    env = {
        **os.environ,
        "RULER_DIR": str(work),
        "RULER_SEED": str(seed),
        "RULER_JUDGE": judge,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(HERE / "ruler.yaml")]
    command += ["--plugin-dir", str(HERE)]
    code = qs.run_to_the_end(command, env)
    if code != 0:
        raise SystemExit(f"[ruler] seed {seed}, {judge}: trinity run failed (exit {code}); logs under {work}")
    points = eval_curves(work / "checkpoints" / "ruler" / judge / "grpo")["heldout"]
    return {"before": points[0][1], "after": points[-1][1], "minutes": (time.monotonic() - start) / 60}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("ruler-run"), help="default ./ruler-run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="default 0 1 2")
    parser.add_argument("--judges", nargs="+", choices=JUDGES, default=list(JUDGES))
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, float]]] = {j: [] for j in args.judges}
    for seed in args.seeds:
        for judge in args.judges:
            result = run_one(args.work_dir.resolve() / f"{judge}-seed{seed}", seed, judge)
            results[judge].append(result)
            print(
                f"[ruler] seed {seed} {judge}: held-out {result['before']:.0%} -> {result['after']:.0%} "
                f"({100 * (result['after'] - result['before']):+.0f} points, {result['minutes']:.1f} min)",
                flush=True,
            )
    print("\n| judge | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean change |")
    print("|---|" + "---|" * (len(args.seeds) + 1))
    for judge, rows in results.items():
        cells = [f"{r['before']:.0%} → {r['after']:.0%}" for r in rows]
        mean = statistics.fmean(100 * (r["after"] - r["before"]) for r in rows)
        print(f"| {judge} | " + " | ".join(cells) + f" | **{mean:+.1f}** |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
