"""The quickstart's GRPO stage against TRL's ``GRPOTrainer``: time per step, quiet and under load,
and time to held-out accuracy, each as a ratio with a 95% interval.

    python benchmarks/vs_trl.py [--steps 120] [--repeats 8] [--load-repeats 2] [--load-steps 30]
                                [--heldout 300] [--kl k3] [--threads N] [--trinity-threads 0]
    python benchmarks/vs_trl.py --quick        # smoke run: SFT 60 steps, GRPO 4, evaluated every 2
    nox -s bench_trl -- --quick                # the same in a venv with TRL installed

1. Builds the quickstart's SFT checkpoint once (``examples/quickstart/run.py``'s data and tiny
   model, with ``--heldout`` of the 1,000 problems held out instead of the quickstart's 100 for
   a finer accuracy estimate; then ``trinity run`` on a copy of ``quickstart.yaml`` holding only
   its ``sft_warmup`` stage) under ``--work-dir``; later runs reuse it.
2. Trains from that checkpoint with the quickstart's ``grpo`` stage (``trinity run`` in a
   subprocess: the path a user runs, Ray and both actors included) and with TRL's
   ``GRPOTrainer`` (in a subprocess of this script) with the settings matched one by one
   (printed), the KL estimator included (``--kl k3``, TRL's; ``--kl k2`` benchmarks the
   quickstart's own). TRL sees the prompts in the order Trinity's ``shuffle`` selector reads them.
3. Interleaves the two: repeat ``r`` runs Trinity then TRL when ``r`` is even, TRL then Trinity
   when odd, so drift in machine load hits both alike. Repeat ``r`` seeds both sides with
   ``r`` (sampling and training; the data order stays the quickstart's), so the mean accuracy
   averages sampling luck too. Each side runs as its user runs it: TRL with every core,
   Trinity with its own split of the cores (``--trinity-threads`` forces a thread count).
4. Then ``--load-repeats`` shorter pairs of runs under a controlled background load: one
   CPU-bound process per core, started before each run and killed after it (``_stats.cpu_load``),
   at this script's priority, as other work on a user's machine would be.
5. Evaluates the quiet runs with one evaluator, in this process, after training: every
   ``--eval-every`` steps' weights generate greedily for the held-out problems (one batched
   ``generate``) and ``math_reward`` scores the answers.
6. Prints ratios TRL / Trinity with 95% bootstrap intervals: the median step time after
   warm-up, quiet and under load (repeats, then steps within a run, drawn with replacement), and
   the train wall time to a held-out accuracy (the SFT checkpoint's plus ``--tta-fraction`` of
   the smaller side's peak gain; seeds drawn with replacement; resamples where a side never
   reaches it are counted); the accuracy at each
   evaluated step; start-up times on their own lines (Ray start-up and actor creation are not in
   the step times); the settings, and the settings that could not be matched and why.
   ``<work-dir>/results.json`` holds it all.

Step times are wall-clock between the ends of consecutive training steps, so each includes the
step's generation, reference and policy passes, the optimizer step and (Trinity) the weight
sync; for Trinity they come from the tensorboard event times its trainer writes every step.
Everything is local: the data and the model are generated, nothing is downloaded.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _stats import bootstrap, cpu_load, interval  # benchmarks/_stats.py, beside this script

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "examples" / "quickstart"

# The quickstart's grpo stage (quickstart.yaml and the grpo algorithm's defaults), as TRL names
# them. main() checks these against Trinity's resolved config before anything runs.
PROMPTS_PER_STEP = 16  # buffer.batch_size
GENERATIONS = 8  # algorithm.repeat_times
LR = 3.0e-4  # algorithm.optimizer.lr
WARMUP_STEPS = 10  # algorithm.optimizer.lr_warmup_steps, then constant (lr_scheduler_type)
WEIGHT_DECAY = 0.01  # algorithm.optimizer.weight_decay (AdamW)
BETAS = (0.9, 0.999)  # algorithm.optimizer.betas
GRAD_CLIP = 1.0  # algorithm.optimizer.clip_grad
CLIP_EPSILON = 0.2  # policy_loss_fn_args.clip_range
KL_COEF = 0.001  # kl_loss_fn_args.kl_coef (kl_loss_fn k2)
MAX_PROMPT_TOKENS = 32  # model.max_prompt_tokens
MAX_RESPONSE_TOKENS = 56  # model.max_response_tokens
TEMPERATURE = 1.0  # taskset rollout_args.temperature
SEED = 0  # trainer.seed, rollout_model.seed, the shuffle selector's seed


# ---------------------------------------------------------------------------------------------
# the quickstart: data, model, SFT checkpoint


def quickstart_module() -> Any:
    """``examples/quickstart/run.py`` as a module (its ``prepare`` makes the data and model)."""
    spec = importlib.util.spec_from_file_location("quickstart_run", QUICKSTART / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quickstart_yaml() -> dict[str, Any]:
    import yaml

    return yaml.safe_load((QUICKSTART / "quickstart.yaml").read_text())


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trinity_env(quickstart_dir: Path, threads: int) -> dict[str, str]:
    """The environment of a ``trinity run`` (and of the TRL worker, which sets its own threads).

    ``threads`` > 0 sets ``OMP_NUM_THREADS``, which travels to Trinity's actors and replaces its
    own share of the cores; 0 leaves Trinity's default (``trinity.placement.cpu_shares``), as a
    user runs it."""
    env = {
        **os.environ,
        "QUICKSTART_DIR": str(quickstart_dir),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env.pop("OMP_NUM_THREADS", None)
    if threads > 0:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def resolved_stage(config_path: Path, env: dict[str, str]) -> Any:
    """The last stage of ``config_path`` as ``trinity run`` resolves it (with ``env``'s QUICKSTART_DIR)."""
    from trinity.config import load_config, stage_configs

    saved = os.environ.get("QUICKSTART_DIR")
    os.environ["QUICKSTART_DIR"] = env["QUICKSTART_DIR"]
    try:
        return stage_configs(load_config(config_path))[-1]
    finally:
        if saved is None:
            os.environ.pop("QUICKSTART_DIR", None)
        else:
            os.environ["QUICKSTART_DIR"] = saved


def job_dir(config_path: Path, env: dict[str, str]) -> Path:
    """The job folder ``trinity run`` uses for a one-stage config."""
    return Path(resolved_stage(config_path, env).checkpoint_job_dir)


def latest_checkpoint(job: Path) -> Path | None:
    from trinity.trainer.checkpoint import LATEST_FILE, checkpoint_dir, hf_weights_dir

    latest = job / LATEST_FILE
    if not latest.is_file():
        return None
    return hf_weights_dir(checkpoint_dir(job, int(latest.read_text().strip())))


def run_logged(command: list[str], env: dict[str, str], log: Path, what: str) -> None:
    with log.open("w") as out:
        code = subprocess.call(command, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT)
    if code != 0:
        tail = "".join(log.read_text().splitlines(keepends=True)[-40:])
        sys.exit(f"{what} failed (exit {code}); last lines of {log}:\n{tail}")


def quickstart_dir(work: Path, sft_steps: int, heldout: int) -> Path:
    """Where the data, model and SFT checkpoint of these settings live (made once, reused)."""
    return work / f"quickstart-sft{sft_steps}-heldout{heldout}"


def build_sft(work: Path, sft_steps: int, threads: int, heldout: int) -> Path:
    """The quickstart's data (``heldout`` problems held out), model and SFT checkpoint, made once."""
    qdir = quickstart_dir(work, sft_steps, heldout)
    config = quickstart_yaml()
    (sft_stage,) = [s for s in config["stages"] if s["stage_name"] == "sft_warmup"]
    sft_stage = copy.deepcopy(sft_stage)
    sft_stage["buffer"]["total_steps"] = sft_steps
    config["stages"] = [sft_stage]
    env = trinity_env(qdir, threads)
    if qdir.is_dir() and (qdir / "sft.yaml").is_file():
        found = latest_checkpoint(job_dir(qdir / "sft.yaml", env))
        if found is not None:
            print(f"[vs_trl] reusing the SFT checkpoint {found}", flush=True)
            return found
    quickstart_module().prepare(qdir, test_problems=heldout)  # recreates qdir: data/ and model/
    path = write_yaml(qdir / "sft.yaml", config)
    print(f"[vs_trl] SFT warm-up ({sft_steps} steps): trinity run --config {path}", flush=True)
    start = time.monotonic()
    run_logged(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(path)], env, qdir / "sft.log", "SFT"
    )
    found = latest_checkpoint(job_dir(path, env))
    if found is None:
        sys.exit(f"the SFT run left no checkpoint; see {qdir / 'sft.log'}")
    print(f"[vs_trl] SFT checkpoint {found} ({time.monotonic() - start:.0f} s)", flush=True)
    return found


# ---------------------------------------------------------------------------------------------
# Trinity: the quickstart's grpo stage


def grpo_config(
    sft: Path,
    work: Path,
    name: str,
    steps: int,
    eval_every: int,
    seed: int = SEED,
    sync_offset: int = 0,
    kl: str = "k3",
) -> dict[str, Any]:
    """quickstart.yaml's top level with its ``grpo`` stage applied, starting from ``sft``.

    Changed: the steps, the folders, weights saved every ``eval_every`` steps for the shared
    evaluator instead of Trinity's own evaluation (which would run inside the timed steps), the
    sampling and training ``seed`` (each repeat its own; the data order stays the quickstart's),
    ``synchronizer.sync_offset`` when ``--trinity-sync-offset`` asks for another, and the KL
    estimator (``--kl``: k3 by default, TRL's; the quickstart ships grpo's k2)."""
    config = quickstart_yaml()
    (stage,) = [s for s in config.pop("stages") if s["stage_name"] == "grpo"]
    config["mode"] = stage["mode"]
    config["project"], config["name"] = "vs_trl", name
    config["checkpoint_root_dir"] = str(work / "trinity")
    config["model"]["model_path"] = str(sft)
    config["buffer"]["total_steps"] = steps
    config["buffer"]["explorer_input"]["eval_tasksets"] = []
    config["explorer"]["eval_on_startup"] = False
    config["trainer"]["save_interval"] = eval_every
    config["trainer"]["seed"] = seed
    config["explorer"]["rollout_model"]["seed"] = seed
    if sync_offset:
        config["synchronizer"]["sync_offset"] = sync_offset
    if kl != "k2":  # grpo's default is k2 (upstream's); the same coefficient either way
        config["algorithm"]["kl_loss_fn"] = kl
    return config


def event_times(folder: Path, tag: str) -> list[tuple[int, float, float]]:
    """``(step, wall_time, value)`` of one scalar in a tensorboard folder."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return [(e.step, e.wall_time, e.value) for e in events.Scalars(tag)]


def run_trinity(
    sft: Path, qdir: Path, work: Path, repeat: int, args: argparse.Namespace, steps: int, tag: str = ""
) -> dict[str, Any]:
    name = f"grpo{tag}-r{repeat}"
    config_path = write_yaml(
        work / f"trinity-{name}.yaml",
        grpo_config(
            sft, work, name, steps, args.eval_every, SEED + repeat, args.trinity_sync_offset, args.kl
        ),
    )
    env = trinity_env(qdir, args.trinity_threads)
    job = job_dir(config_path, env)
    # A fresh job folder: an earlier run's tensorboard events would be read as this run's.
    shutil.rmtree(job, ignore_errors=True)
    launched = time.time()
    run_logged(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(config_path)],
        env,
        work / f"trinity-{name}.log",
        "trinity run (GRPO)",
    )
    finished = time.time()
    tb = job / "monitor" / "tensorboard"
    trained = event_times(tb / "trainer", "timing/step")
    # The first step starts when the explorer starts exploring it: its end minus its duration.
    _, first_end, first_seconds = event_times(tb / "explorer", "timing/explore_step")[0]
    start = first_end - first_seconds
    ends = [wall for _, wall, _ in sorted(trained)]
    checkpoints = {
        int(p.name.rsplit("_", 1)[1]): str(p)
        for p in job.glob("global_step_*")
        if p.name.rsplit("_", 1)[1].isdigit()
    }
    return {
        "startup_s": start - launched,  # process, Ray, actors, models: not in the step times
        "teardown_s": finished - ends[-1],
        "step_seconds": [b - a for a, b in zip([start, *ends], ends)],
        "checkpoints": checkpoints,
        "job_dir": str(job),
    }


# ---------------------------------------------------------------------------------------------
# TRL: GRPOTrainer, in a subprocess (--trl-worker)


def trinity_order(size: int, count: int) -> list[int]:
    """The rows Trinity's ``shuffle`` selector (seed SEED) reads first, in its order."""
    from trinity.buffer.selector import ShuffleSelector

    selector = ShuffleSelector(size, seed=SEED)
    return [selector.index(position) for position in range(count)]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def trl_config_kwargs(out: Path, steps: int, seed: int = SEED) -> dict[str, Any]:
    """GRPOConfig arguments matching the quickstart's grpo stage (see SETTINGS)."""
    return {
        "output_dir": str(out),
        "use_cpu": True,
        "bf16": False,  # TRL's default is bf16; the quickstart trains in float32
        "gradient_checkpointing": False,  # TRL's default is on; Trinity's trainer has it off
        # transformers 5's Trainer sets model.config.use_cache from this (default False), and
        # TRL's generate then recomputes the whole sequence at every token: ~3x slower steps here.
        # Trinity's engine generates with the KV cache.
        "use_cache": True,
        "per_device_train_batch_size": PROMPTS_PER_STEP * GENERATIONS,  # completions per step
        "gradient_accumulation_steps": 1,
        "num_generations": GENERATIONS,
        "num_iterations": 1,
        "max_completion_length": MAX_RESPONSE_TOKENS,
        "temperature": TEMPERATURE,
        "top_p": 1.0,
        "top_k": 0,
        "learning_rate": LR,
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": WARMUP_STEPS,
        "optim": "adamw_torch",
        "weight_decay": WEIGHT_DECAY,
        "adam_beta1": BETAS[0],
        "adam_beta2": BETAS[1],
        "max_grad_norm": GRAD_CLIP,
        "beta": KL_COEF,
        "epsilon": CLIP_EPSILON,
        "loss_type": "dapo",  # token mean over the step's batch, as Trinity's token-mean
        "scale_rewards": "group",
        "max_steps": steps,
        "shuffle_dataset": False,  # the dataset is already in Trinity's order
        "seed": seed,
        "save_strategy": "no",  # the callback saves the weights the evaluator reads
        "report_to": "none",
        "logging_steps": 1,
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


def trl_worker(spec_path: Path) -> None:
    """Train with TRL as ``spec_path`` says; write step times and checkpoint paths next to it."""
    spec = json.loads(spec_path.read_text())
    import torch

    torch.set_num_threads(spec["threads"])
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from trinity_math.rewards import MathRewardFn

    steps, eval_every, out = spec["steps"], spec["eval_every"], Path(spec["out"])
    rows = read_jsonl(Path(spec["train"]))
    order = trinity_order(len(rows), steps * PROMPTS_PER_STEP)
    # The taskset's format: the question as the only (user) turn, no system prompt.
    dataset = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": rows[i]["question"]}], "answer": rows[i]["answer"]}
            for i in order
        ]
    )
    reward_fn = MathRewardFn(format_score=0.0)  # the taskset's reward_fn_args

    def math_reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        """trinity_math's math_reward as a TRL reward: the sum of its parts, as Trinity's reward."""
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        return [float(sum(reward_fn(text, truth).values())) for text, truth in zip(texts, answer)]

    class StepClock(TrainerCallback):
        """Step end times (after saving, as Trinity's save is inside its step) and checkpoints."""

        def __init__(self) -> None:
            self.start = 0.0
            self.ends: list[float] = []
            self.checkpoints: dict[int, str] = {}

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.time()

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            step = state.global_step
            if step % eval_every == 0 or step == steps:
                path = out / f"global_step_{step}"
                model.save_pretrained(path)
                self.checkpoints[step] = str(path)
            self.ends.append(time.time())

    clock = StepClock()
    trainer = GRPOTrainer(
        model=spec["model"],
        reward_funcs=[math_reward],
        args=GRPOConfig(**trl_config_kwargs(out, steps, spec["seed"])),
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(spec["model"]),
        callbacks=[clock],
    )
    trainer.train()
    result = {
        "startup_s": clock.start - spec["launched"],
        "teardown_s": time.time() - clock.ends[-1],
        "step_seconds": [b - a for a, b in zip([clock.start, *clock.ends], clock.ends)],
        "checkpoints": clock.checkpoints,
        "trl_version": __import__("trl").__version__,
    }
    (out / "result.json").write_text(json.dumps(result))


def run_trl(
    sft: Path, qdir: Path, work: Path, repeat: int, args: argparse.Namespace, steps: int, tag: str = ""
) -> dict[str, Any]:
    out = work / "trl" / f"grpo{tag}-r{repeat}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    spec = {
        "model": str(sft),
        "train": str(qdir / "data" / "rl" / "train.jsonl"),
        "steps": steps,
        "eval_every": args.eval_every,
        "threads": args.threads,
        "seed": SEED + repeat,
        "out": str(out),
        "launched": time.time(),
    }
    spec_path = out / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**trinity_env(qdir, args.threads), "TOKENIZERS_PARALLELISM": "false"}
    run_logged(
        [sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(spec_path)],
        env,
        out / "trl.log",
        "TRL",
    )
    result = json.loads((out / "result.json").read_text())
    result["checkpoints"] = {int(k): v for k, v in result["checkpoints"].items()}
    return result


# ---------------------------------------------------------------------------------------------
# the shared evaluator


def evaluate(weights: str, tokenizer_dir: Path, problems: list[dict[str, Any]], threads: int) -> float:
    """Held-out accuracy of ``weights``: one batched greedy generate, math_reward's accuracy."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trinity_math.rewards import MathRewardFn

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p["question"]}], tokenize=False, add_generation_prompt=True
        )
        for p in problems
    ]
    batch = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(
            **batch,
            do_sample=False,
            max_new_tokens=MAX_RESPONSE_TOKENS,
            pad_token_id=tokenizer.pad_token_id,
        )
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1] :], skip_special_tokens=True)
    reward = MathRewardFn(format_score=0.0)
    return sum(reward(text, p["answer"])["accuracy"] for text, p in zip(texts, problems)) / len(problems)


# ---------------------------------------------------------------------------------------------
# settings and the report

SETTINGS = [
    # (setting, Trinity (quickstart grpo stage), TRL GRPOConfig)
    (
        "model",
        "the quickstart's SFT checkpoint (tiny Qwen2, float32)",
        "the same folder, float32 (bf16=False)",
    ),
    (
        "train prompts",
        "data/rl (the train problems without a worked SFT solution), shuffle selector seed 0",
        "the same rows in the same order, shuffle_dataset=False",
    ),
    (
        "prompt format",
        "chat template, user turn only, no system prompt",
        "conversational prompt, same chat template",
    ),
    ("reward", "math_reward(format_score=0.0), sum of parts", "the same function wrapped as a TRL reward"),
    (
        "batch",
        f"batch_size {PROMPTS_PER_STEP} x repeat_times {GENERATIONS}",
        f"{PROMPTS_PER_STEP * GENERATIONS} completions/step, num_generations {GENERATIONS}, grad accumulation 1",
    ),
    ("updates per batch", "ppo_epochs 1, one micro-batch", "num_iterations 1, steps_per_generation 1"),
    (
        "optimizer",
        f"AdamW lr {LR}, betas {BETAS}, weight_decay {WEIGHT_DECAY}",
        f"adamw_torch lr {LR}, betas {BETAS}, weight_decay {WEIGHT_DECAY}",
    ),
    (
        "lr schedule",
        f"linear warm-up {WARMUP_STEPS} steps, then constant",
        f"constant_with_warmup, warmup_steps {WARMUP_STEPS}",
    ),
    ("grad clip", f"{GRAD_CLIP}", f"max_grad_norm {GRAD_CLIP}"),
    ("clip epsilon", f"ppo clip_range {CLIP_EPSILON}", f"epsilon {CLIP_EPSILON}"),
    (
        "loss aggregation",
        "token-mean over the step's batch",
        "loss_type dapo: token sum / tokens of the step's batch",
    ),
    ("advantage", "(r - group mean) / (group std + 1e-6)", "(r - group mean) / (group std + 1e-4)"),
    (
        "old log-probs",
        "bypass_old_logprobs (ratio to the detached current)",
        "not computed (num_iterations 1): the same",
    ),
    (
        "max prompt / response tokens",
        f"{MAX_PROMPT_TOKENS} / {MAX_RESPONSE_TOKENS}",
        f"none (TRL has no prompt limit) / {MAX_RESPONSE_TOKENS}",
    ),
    (
        "sampling",
        f"temperature {TEMPERATURE}, top_p 1, top_k off",
        f"temperature {TEMPERATURE}, top_p 1, top_k 0 (off)",
    ),
    ("stop tokens", "model's generation_config EOS ids + tokenizer EOS", "the same list"),
    ("gradient checkpointing", "off", "off (gradient_checkpointing=False)"),
    (
        "KV cache in generation",
        "on (transformers engine's loop)",
        "on (use_cache=True; transformers 5's Trainer default is off)",
    ),
    ("seed", f"{SEED} + repeat (trainer.seed, rollout_model.seed)", f"{SEED} + repeat (seed)"),
]


def settings(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """:data:`SETTINGS` and the rows that depend on the options (KL estimator, held-out size)."""
    return [
        *SETTINGS,
        (
            "KL",
            f"kl_loss_fn {args.kl}, kl_coef {KL_COEF}, reference = SFT model",
            f"beta {KL_COEF} (k3, hard-coded), reference = SFT model",
        ),
        (
            "held-out problems",
            f"{args.heldout} of the 1,000 (the quickstart holds out 100; its first 100 are the same)",
            "the same",
        ),
    ]


UNMATCHED = [
    (
        "advantage epsilon",
        "Trinity divides by group std + 1e-6 (configurable), TRL by std + 1e-4 (hard-coded). With 0/1 "
        "rewards a group's std is 0 (advantage 0 either way) or >= 0.33, so the difference is < 0.03%.",
    ),
    (
        "generation backend",
        "Trinity generates in its explorer actor (transformers engine: the 16 tasks' chat calls batched "
        "into one batch, each prompt prefilled once for its 8 samples, the engine's own sampling loop "
        "dropping finished rows; weights synced from the trainer in memory each step); TRL calls "
        "transformers' generate on the training model in the same process. The same samples as "
        "generate would draw for Trinity's seeds (tested); the engine and the sync are what is compared.",
    ),
    (
        "training forward",
        "Trinity's native trainer runs each distinct prompt once per micro-batch and the 8 responses on "
        "its key/value cache (trainer.share_prompt_forward, the default: same log-probs and gradients "
        "up to rounding); TRL runs every row's prompt. Both are the same computation; this is how "
        "each side does it.",
    ),
    (
        "processes and threads",
        "Trinity runs the explorer and the trainer in two Ray actors (strictly on-policy, sync_interval 1 / "
        "offset 0: they take turns) plus the Ray driver, with its own split of the cores by default "
        "(trinity.placement.cpu_shares: taking turns, each every core) or OMP_NUM_THREADS="
        "--trinity-threads each; TRL is one process with torch.set_num_threads(--threads), every core by "
        "default. Trinity cannot run its both mode in one process.",
    ),
    (
        "prompt length limit",
        "TRL (1.x) has no max_prompt_length; Trinity's is 32. The prompts are at most 24 tokens, so "
        "neither truncates.",
    ),
    (
        "sampling randomness",
        "repeat r seeds both sides with r (Trinity's trainer.seed and rollout_model.seed, TRL's seed; "
        "the data order stays the quickstart's), but their random streams differ (different "
        "processes and call orders), so the sampled completions differ. Each side repeats itself "
        "exactly for a given seed, so --repeats averages sampling luck as well as timing noise.",
    ),
    (
        "checkpoints",
        "Trinity saves a full trainer checkpoint (weights, optimizer, scheduler, RNG) every --eval-every "
        "steps; the TRL callback saves only the weights (save_pretrained). Both inside the step time.",
    ),
    (
        "logging",
        "Trinity writes every step's metrics to tensorboard and a console progress bar; TRL logs one "
        "dict per step to stdout (report_to none).",
    ),
    (
        "evaluation",
        "neither evaluates during training (Trinity's eval tasksets are removed from its config); the "
        "shared evaluator reads the saved weights afterwards. The quickstart itself evaluates inside "
        "its run (eval_interval 40).",
    ),
]


def median_after_warmup(step_seconds: list[list[float]], warmup: int) -> float:
    pooled = [s for run in step_seconds for s in run[warmup:]]
    return statistics.median(pooled)


def paired_ratios(step_seconds: dict[str, list[list[float]]], warmup: int) -> list[float]:
    """TRL / Trinity median step time of each repeat: the two runs of a repeat are adjacent in
    time, so their ratio is less exposed to the machine's speed drifting between repeats than
    the ratio of the pooled medians."""
    return [
        statistics.median(trl[warmup:]) / statistics.median(trinity[warmup:])
        for trinity, trl in zip(step_seconds["trinity"], step_seconds["trl"], strict=True)
    ]


def step_ratio(
    step_seconds: dict[str, list[list[float]]], warmup: int, resamples: int = 2000
) -> dict[str, Any]:
    """TRL / Trinity median step time, with a 95% bootstrap interval.

    Two-level bootstrap: repeats are drawn with replacement (a repeat's two runs stay together:
    they ran next to each other, under the same machine drift), then each drawn run's steps are
    drawn with replacement, so both the run-to-run and the step-to-step spread are in the interval."""
    pairs = list(zip(step_seconds["trinity"], step_seconds["trl"], strict=True))
    trimmed = [(a[warmup:], b[warmup:]) for a, b in pairs]
    rng = random.Random(0)

    def one(drawn: list[tuple[list[float], list[float]]]) -> float:
        sides = [[], []]
        for runs in drawn:
            for side, run in zip(sides, runs):
                side.extend(run[rng.randrange(len(run))] for _ in run)
        return statistics.median(sides[1]) / statistics.median(sides[0])

    point = median_after_warmup([b for _, b in trimmed], 0) / median_after_warmup([a for a, _ in trimmed], 0)
    return {"ratio": point, "interval": interval(bootstrap(trimmed, one, resamples))}


def reach(
    curves: list[dict[int, float]], times: list[dict[int, float]], target: float
) -> tuple[float, float] | None:
    """(step, train seconds) where the mean of ``curves`` first reaches ``target``, interpolated
    linearly between evaluated steps (and their mean train seconds); ``None`` if it never does."""
    steps = sorted(curves[0])
    acc = [statistics.mean(c[s] for c in curves) for s in steps]
    secs = [statistics.mean(t[s] for t in times) for s in steps]
    if acc[0] >= target:
        return steps[0], secs[0]
    for k in range(1, len(steps)):
        if acc[k] >= target:
            f = (target - acc[k - 1]) / (acc[k] - acc[k - 1])
            return steps[k - 1] + f * (steps[k] - steps[k - 1]), secs[k - 1] + f * (secs[k] - secs[k - 1])
    return None


def time_to_accuracy(
    curves: dict[str, list[dict[int, float]]],
    times: dict[str, list[dict[int, float]]],
    fraction: float = 0.8,
    resamples: int = 2000,
) -> dict[str, Any]:
    """Train wall time for each side's mean held-out curve to reach a target accuracy, and the
    ratio TRL / Trinity with a 95% bootstrap interval over seeds.

    The target is the SFT checkpoint's accuracy plus ``fraction`` of the smaller of the two sides'
    peak gains (mean curves, all repeats): not the peak itself, which the noisier side's mean
    curve reaches only by luck, so that resamples would miss it half the time. Each resample
    draws repeats with replacement (the same draws for both sides: a repeat's two runs share a
    seed and a stretch of time) and finds when each side's resampled mean curve reaches the
    target. Resamples where a side never reaches it are counted, not dropped silently."""
    mean = {n: {s: statistics.mean(c[s] for c in cs) for s in cs[0]} for n, cs in curves.items()}
    base = mean["trinity"][0]
    gain = min(max(c.values()) for c in mean.values()) - base
    out: dict[str, Any] = {"base": base, "fraction": fraction}
    if gain <= 0:
        out["target"] = base
        out["note"] = "a side never improved on the SFT checkpoint's mean accuracy"
        return out
    target = out["target"] = base + fraction * gain
    reached = {n: reach(curves[n], times[n], target) for n in curves}
    out["reached"] = {n: {"step": r[0], "seconds": r[1]} for n, r in reached.items()}
    t, tr = reached["trinity"][1], reached["trl"][1]
    out["ratio_trl_over_trinity"] = tr / t if t else None

    def one(drawn: list[int]) -> float | None:
        got = {n: reach([curves[n][i] for i in drawn], [times[n][i] for i in drawn], target) for n in curves}
        if not got["trinity"] or not got["trl"] or not got["trinity"][1]:
            return None
        return got["trl"][1] / got["trinity"][1]

    draws = bootstrap(list(range(len(curves["trinity"]))), one, resamples)
    out["interval"] = interval(draws)
    out["resamples_unreached"] = sum(d is None for d in draws)
    out["resamples"] = resamples
    return out


def accuracy_interval(curves: list[dict[int, float]], step: int) -> tuple[float, float] | None:
    """95% bootstrap interval over seeds of the mean accuracy at ``step``."""
    values = [c[step] for c in curves]
    return interval(bootstrap(values, statistics.mean))


def unmatched(args: argparse.Namespace) -> list[tuple[str, str]]:
    """:data:`UNMATCHED`, the KL estimator with ``--kl k2``, the overlap when
    ``--trinity-sync-offset`` is not 0."""
    found = list(UNMATCHED)
    if args.kl != "k3":
        found.append(
            (
                "KL estimator",
                f"asked for with --kl {args.kl} (the quickstart's grpo default k2: 0.5 * log-ratio^2); TRL's "
                "GRPOTrainer hard-codes k3 (exp(ref - logp) - (ref - logp) - 1). Same coefficient and aggregation.",
            )
        )
    if not args.trinity_sync_offset:
        return found
    overlap = (
        "explorer / trainer overlap",
        f"asked for with --trinity-sync-offset {args.trinity_sync_offset}: Trinity samples up to "
        f"{args.trinity_sync_offset} step(s) ahead of the weights it trains (its explorer and "
        "trainer run at the same time, each with half the cores); TRL is strictly on-policy. The "
        "held-out accuracies show what that costs per step.",
    )
    return [*found, overlap]


def check_settings(sft: Path, qdir: Path, work: Path, args: argparse.Namespace) -> None:
    """Fail early if quickstart.yaml no longer says what the TRL side copies."""
    path = write_yaml(
        work / "trinity-check.yaml", grpo_config(sft, work, "check", args.steps, args.eval_every)
    )
    c = resolved_stage(path, trinity_env(qdir, args.trinity_threads))
    a, o = c.algorithm, c.algorithm.optimizer
    found = {
        "batch": (c.buffer.batch_size, a.repeat_times),
        "lr": (o.lr, o.lr_warmup_steps, o.lr_scheduler_type, o.weight_decay, tuple(o.betas), o.clip_grad),
        "clip": dict(a.policy_loss_fn_args)["clip_range"],
        "kl": (a.kl_loss_fn, dict(a.kl_loss_fn_args)["kl_coef"]),
        "agg": a.loss_agg_mode,
        "lengths": (c.model.max_prompt_tokens, c.model.max_response_tokens),
        "temperature": c.buffer.explorer_input.tasksets[0].rollout_args.temperature,
        "bypass": a.bypass_old_logprobs,
    }
    expected = {
        "batch": (PROMPTS_PER_STEP, GENERATIONS),
        "lr": (LR, WARMUP_STEPS, "constant", WEIGHT_DECAY, BETAS, GRAD_CLIP),
        "clip": CLIP_EPSILON,
        "kl": (args.kl, KL_COEF),
        "agg": "token-mean",
        "lengths": (MAX_PROMPT_TOKENS, MAX_RESPONSE_TOKENS),
        "temperature": TEMPERATURE,
        "bypass": True,
    }
    wrong = {k: (found[k], expected[k]) for k in expected if found[k] != expected[k]}
    if wrong:
        sys.exit(
            "examples/quickstart/quickstart.yaml changed; update the constants at the top of "
            f"benchmarks/vs_trl.py (key: (quickstart, benchmark)): {wrong}"
        )


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, default=Path("bench-vs-trl"), help="default ./bench-vs-trl")
    parser.add_argument("--steps", type=int, default=120, help="GRPO steps of each quiet run (default 120)")
    parser.add_argument("--eval-every", type=int, default=10, help="evaluate every N steps (default 10)")
    parser.add_argument(
        "--repeats",
        type=int,
        default=8,
        help="quiet runs of each, alternating the order, repeat r seeded with r (default 8)",
    )
    parser.add_argument(
        "--load-repeats",
        type=non_negative,
        default=2,
        help="runs of each under a background load of one CPU-bound process per core (default 2; 0: none)",
    )
    parser.add_argument(
        "--load-steps", type=int, default=30, help="GRPO steps of each run under load (default 30)"
    )
    parser.add_argument(
        "--heldout",
        type=int,
        default=300,
        help="held-out problems of the 1,000 (default 300; the quickstart holds out 100)",
    )
    parser.add_argument(
        "--kl",
        choices=["k3", "k2"],
        default="k3",
        help="Trinity's KL estimator: k3 (default, TRL's hard-coded one) or k2 (the quickstart's grpo default)",
    )
    parser.add_argument(
        "--tta-fraction",
        type=float,
        default=0.8,
        help="time-to-accuracy target: the SFT accuracy plus this fraction of the smaller peak gain (default 0.8)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="torch threads of TRL's process and of the evaluator (default: every core, as TRL runs)",
    )
    parser.add_argument(
        "--trinity-threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS of each Trinity actor; 0 (default): Trinity's own split of the cores",
    )
    parser.add_argument(
        "--trinity-sync-offset",
        type=non_negative,
        default=0,
        help="synchronizer.sync_offset of Trinity's runs: 0 (default, the quickstart's: strictly "
        "on-policy, as TRL) or 1 (one step off-policy: the explorer samples step N+1 while the "
        "trainer trains step N, each with half the cores)",
    )
    parser.add_argument(
        "--sft-steps",
        type=int,
        help="SFT warm-up steps (default 600, the quickstart's; 60 with --quick); built once per value",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: --steps 4 --eval-every 2 --repeats 2 --load-repeats 1 --load-steps 3 --sft-steps 60",
    )
    parser.add_argument("--trl-worker", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker:
        trl_worker(args.trl_worker)
        return 0
    if args.quick:
        args.steps, args.eval_every, args.repeats = 4, 2, 2
        args.load_repeats, args.load_steps = min(args.load_repeats, 1), 3
    if args.sft_steps is None:
        # The full warm-up takes minutes on 2 busy cores; a smoke run needs only a checkpoint.
        args.sft_steps = 60 if args.quick else 600
    if importlib.util.find_spec("trl") is None:
        # `nox -s bench` runs every benchmark without TRL: say how to run this one instead.
        print("[vs_trl] skipped: TRL is not installed here; run `nox -s bench_trl` (its own venv with TRL)")
        return 0

    work = args.work_dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    sft = build_sft(work, args.sft_steps, args.trinity_threads, args.heldout)
    qdir = quickstart_dir(work, args.sft_steps, args.heldout)
    check_settings(sft, qdir, work, args)

    runners = {"trinity": run_trinity, "trl": run_trl}
    conditions = {"quiet": (args.repeats, args.steps, 0)}
    if args.load_repeats:
        conditions["load"] = (args.load_repeats, args.load_steps, os.cpu_count() or 1)
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {"trinity": [], "trl": []} for c in conditions}
    for condition, (repeats, steps, burners) in conditions.items():
        for repeat in range(repeats):
            order = ["trinity", "trl"] if repeat % 2 == 0 else ["trl", "trinity"]
            for name in order:
                print(
                    f"[vs_trl] {condition} {repeat + 1}/{repeats}: {name}, {steps} steps"
                    + (f", {burners} CPU-bound background processes" if burners else ""),
                    flush=True,
                )
                load_before = os.getloadavg()[0]
                tag = "-load" if burners else ""
                with cpu_load(burners) if burners else contextlib.nullcontext():
                    result = runners[name](sft, qdir, work, repeat, args, steps, tag)
                result["loadavg_1min_before"] = load_before
                runs[condition][name].append(result)
                print(
                    f"[vs_trl]   start-up {result['startup_s']:.1f} s, steps {sum(result['step_seconds']):.1f} s "
                    f"(median {statistics.median(result['step_seconds']):.2f} s); load before {load_before:.1f}",
                    flush=True,
                )

    # Evaluation of the quiet runs, after all training so it cannot slow either down.
    quiet = runs["quiet"]
    problems = read_jsonl(qdir / "data" / "test.jsonl")
    eval_steps = sorted({*range(args.eval_every, args.steps + 1, args.eval_every), args.steps})
    print(
        f"[vs_trl] evaluating steps 0, {', '.join(map(str, eval_steps))} of the quiet runs on "
        f"{len(problems)} held-out problems",
        flush=True,
    )
    base = evaluate(str(sft), sft, problems, args.threads)
    accuracy: dict[str, list[dict[int, float]]] = {"trinity": [], "trl": []}
    times: dict[str, list[dict[int, float]]] = {"trinity": [], "trl": []}
    for name, results in quiet.items():
        for result in results:
            curve = {0: base}
            for step in eval_steps:
                curve[step] = evaluate(result["checkpoints"][step], sft, problems, args.threads)
            accuracy[name].append(curve)
            times[name].append({s: sum(result["step_seconds"][:s]) for s in curve})
    mean_curve = {
        name: {s: statistics.mean(c[s] for c in curves) for s in curves[0]}
        for name, curves in accuracy.items()
    }
    mean_time = {name: {s: statistics.mean(t[s] for t in ts) for s in ts[0]} for name, ts in times.items()}

    per_step: dict[str, Any] = {}
    for condition, sides in runs.items():
        steps = conditions[condition][1]
        warmup = min(5, steps // 4)
        seconds = {name: [r["step_seconds"] for r in sides[name]] for name in sides}
        per_step[condition] = {
            "steps": steps,
            "repeats": conditions[condition][0],
            "background_processes": conditions[condition][2],
            "warmup_steps_excluded": warmup,
            "median_step_s": {name: median_after_warmup(seconds[name], warmup) for name in seconds},
            **step_ratio(seconds, warmup),
            "ratio_per_repeat": paired_ratios(seconds, warmup),
            "startup_s": {name: [r["startup_s"] for r in sides[name]] for name in sides},
            "loadavg_1min_before": {name: [r["loadavg_1min_before"] for r in sides[name]] for name in sides},
            "step_seconds": seconds,
        }
    results = {
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "options": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "trl_worker"
        },
        "trl_version": quiet["trl"][0]["trl_version"],
        "sft_checkpoint": str(sft),
        "heldout_problems": len(problems),
        "per_step": per_step,
        "heldout_accuracy": {
            name: [{str(k): v for k, v in c.items()} for c in curves] for name, curves in accuracy.items()
        },
        "heldout_accuracy_mean": {name: {str(k): v for k, v in c.items()} for name, c in mean_curve.items()},
        "heldout_accuracy_final_interval": {
            name: accuracy_interval(curves, args.steps) for name, curves in accuracy.items()
        },
        "train_seconds_to_step_mean": {
            name: {str(k): v for k, v in t.items()} for name, t in mean_time.items()
        },
        "time_to_accuracy": time_to_accuracy(accuracy, times, args.tta_fraction),
        "settings": [{"setting": s, "trinity": t, "trl": r} for s, t, r in settings(args)],
        "trl_config": trl_config_kwargs(Path("<out>"), args.steps),
        "unmatched": [{"setting": s, "why": w} for s, w in unmatched(args)],
    }
    (work / "results.json").write_text(json.dumps(results, indent=1))
    report(results, args)
    return 0


def _span(pair: tuple[float, float] | list[float] | None, fmt: str = "{:.2f}") -> str:
    return f"[{fmt.format(pair[0])}, {fmt.format(pair[1])}]" if pair else "[n/a]"


def report(r: dict[str, Any], args: argparse.Namespace) -> None:
    line = "=" * 78
    print(
        f"\n{line}\nTrinity (quickstart grpo stage, KL {args.kl}) vs TRL {r['trl_version']} GRPOTrainer, CPU "
        f"({os.cpu_count()} cores), Trinity threads: {args.trinity_threads or 'its own split of the cores'}, "
        f"TRL threads: {args.threads}, Trinity sync_offset: {args.trinity_sync_offset}"
        f"{' (strictly on-policy)' if not args.trinity_sync_offset else ' (off-policy)'}\n{line}"
    )
    for p in r["per_step"].values():
        what = (
            "quiet machine"
            if not p["background_processes"]
            else f"under load: {p['background_processes']} CPU-bound background processes (one per core)"
        )
        m = p["median_step_s"]
        print(
            f"step time, {what}, {p['repeats']} repeat(s) x {p['steps']} steps, median after "
            f"{p['warmup_steps_excluded']} warm-up steps: Trinity {m['trinity']:.3f} s, TRL {m['trl']:.3f} s"
            f"  ->  TRL / Trinity {p['ratio']:.2f}, 95% interval {_span(p['interval'])}"
        )
        print(
            f"  per repeat (a repeat's two runs are adjacent in time): {', '.join(f'{x:.2f}' for x in p['ratio_per_repeat'])}"
        )
        s = p["startup_s"]
        print(
            "  start-up, not in step times (Trinity: process + Ray + actors + models; TRL: process + imports "
            f"+ trainer): Trinity {', '.join(f'{x:.1f}' for x in s['trinity'])} s, TRL {', '.join(f'{x:.1f}' for x in s['trl'])} s"
        )
    acc, t = r["heldout_accuracy_mean"], r["train_seconds_to_step_mean"]
    repeats = len(r["heldout_accuracy"]["trinity"])
    print(
        f"held-out accuracy (greedy, {r['heldout_problems']} problems; mean over {repeats} seeds), "
        "train wall time to that step (quiet runs):"
    )
    for step in acc["trinity"]:
        print(
            f"  step {int(step):>4}: Trinity {acc['trinity'][step]:6.1%} ({t['trinity'][step]:6.1f} s)   "
            f"TRL {acc['trl'][step]:6.1%} ({t['trl'][step]:6.1f} s)"
        )
    final = r["heldout_accuracy_final_interval"]
    print(
        f"  last step, 95% interval over seeds: Trinity {_span(final['trinity'], '{:.1%}')}, "
        f"TRL {_span(final['trl'], '{:.1%}')}"
    )
    tta = r["time_to_accuracy"]
    if "note" in tta:
        print(f"time to accuracy: n/a ({tta['note']})")
    else:
        reached = tta["reached"]
        ratio = tta["ratio_trl_over_trinity"]
        print(
            f"time to {tta['target']:.1%} held-out accuracy (SFT {tta['base']:.1%} + {tta['fraction']:.0%} of the "
            f"smaller peak gain): Trinity step {reached['trinity']['step']:.0f} ({reached['trinity']['seconds']:.1f} s), "
            f"TRL step {reached['trl']['step']:.0f} "
            f"({reached['trl']['seconds']:.1f} s)  ->  TRL / Trinity "
            + (f"{ratio:.2f}" if ratio is not None else "n/a")
            + f", 95% interval over seeds {_span(tta['interval'])}"
            + (
                f" ({tta['resamples_unreached']} of {tta['resamples']} resamples: a side never reached it)"
                if tta["resamples_unreached"]
                else ""
            )
        )
    print("\nsettings (Trinity | TRL):")
    for item in r["settings"]:
        print(f"  {item['setting']}: {item['trinity']} | {item['trl']}")
    print(f"  TRL GRPOConfig: {json.dumps({k: v for k, v in r['trl_config'].items() if k != 'output_dir'})}")
    print("\nsettings that could not be matched:")
    for item in r["unmatched"]:
        print(f"  - {item['setting']}: {item['why']}")
    print(f"\nresults: {Path(r['options']['work_dir']).resolve() / 'results.json'}\n{line}")


if __name__ == "__main__":
    sys.exit(main())
