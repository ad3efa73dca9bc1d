"""Shared set-up of the end-to-end tests: a tiny math job's files, and the environment of a
``trinity run`` subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def job_env() -> dict[str, str]:
    """Environment for ``trinity run`` subprocesses: offline, unbuffered, and a Ray of its own
    (never a cluster another test left behind)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="session")
def math_job(tiny_model) -> Callable[..., Path]:
    """``math_job(root, train=, test=, difficulty=, sft=, dpo=, **model_args)`` writes an
    arithmetic taskset to ``root/data`` (``sft``/``dpo``: that many SFT / DPO rows besides) and
    a copy of the tiny math model to ``root/model`` (``model_args``: sizes, see
    ``create_tiny_model``; built once per session for the same sizes); returns ``root``. The job
    config for it: ``trinity.testing.jobs.tiny_job(root, ...)``."""

    def make(
        root: Path, *, train: int, test: int, difficulty: int = 1, sft: int = 0, dpo: int = 0, **model_args
    ) -> Path:
        from trinity_math.tasks import main as make_tasks
        from trinity_math.tiny import MATH_VOCAB_CHARS

        args = ["arithmetic", "--out", str(root / "data"), "--train", str(train), "--test", str(test)]
        args += ["--difficulty", str(difficulty)]
        args += ["--sft", str(sft)] if sft else []
        args += ["--dpo", str(dpo)] if dpo else []
        assert make_tasks(args) == 0
        # A copy: the job reads root/model, and a test may change the files it was given.
        model = tiny_model(vocab_chars=MATH_VOCAB_CHARS, seed=0, **model_args)
        shutil.copytree(model, root / "model")
        return root

    return make


#: Test plugins (``--plugin-dir``): the ``weights_probe`` eval workflow.
PLUGINS = Path(__file__).parent / "plugins"


def probe_taskset(root: Path) -> dict:
    """An eval taskset (``root``'s test split) run by the ``weights_probe`` workflow (``PLUGINS``),
    which reports the version and score of the weights it ran on (``probe_score``)."""
    from trinity.testing.jobs import tiny_taskset

    return tiny_taskset(
        root, "probe", split="test", format={"system_prompt": None}, default_workflow_type="weights_probe"
    )


@pytest.fixture(scope="session")
def trinity_run(job_env) -> Callable[..., subprocess.CompletedProcess]:
    """``trinity_run(config, *args)`` runs ``trinity run --config config *args`` in a subprocess
    (``job_env``), asserts it succeeded and returns the finished process."""

    def run(config: Path, *args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config), *args]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=job_env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc

    return run


@pytest.fixture(scope="session")
def probe_score() -> Callable[[Path], float]:
    """What the ``weights_probe`` eval workflow reports for the weights saved at a path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("weights_probe", PLUGINS / "weights_probe.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.score


@pytest.fixture(scope="session")
def check_on_policy_rollouts() -> Callable[..., None]:
    """``check(db, job_dir, run)``: in the SQL buffer at ``db`` (table ``exp``, ids
    ``<run>:<batch>/...``), explore step ``b`` of a strictly on-policy 3-step job ran on the
    weights of train step ``b - 1``, and the log-probs the explorer recorded with versions 1 and 2
    are those of a transformers forward of the trainer's ``global_step_<version>`` checkpoint (so
    every weight of that version reached the engine)."""

    def check(db: Path, job_dir: Path, run: str) -> None:
        import sqlite3

        import torch
        from transformers import AutoModelForCausalLM

        from trinity.experience import Experience
        from trinity.trainer.checkpoint import hf_weights_dir

        with sqlite3.connect(db) as conn:
            rows = conn.execute(
                "select e.uid, e.model_version, b.blob from exp e join exp_blobs b on b.id = e.id"
            ).fetchall()
        by_batch: dict[int, set[int]] = {}
        for uid, version, _ in rows:
            owner, eid = uid.split(":", 1)  # stored ids are <run>:<eid.uid>
            assert owner == run
            by_batch.setdefault(int(eid.split("/")[0]), set()).add(version)
        assert by_batch == {1: {0}, 2: {1}, 3: {2}}, by_batch
        for version in (1, 2):
            model = AutoModelForCausalLM.from_pretrained(  # a LoRA checkpoint: its merged export
                hf_weights_dir(job_dir / f"global_step_{version}"), dtype=torch.float32
            )
            experiences = [Experience.deserialize(blob) for _, v, blob in rows if v == version]
            assert experiences
            for exp in experiences:
                with torch.no_grad():
                    logits = model(input_ids=exp.tokens[None]).logits[0, :-1].float()
                expected = torch.log_softmax(logits, -1).gather(-1, exp.tokens[1:, None]).squeeze(-1)
                torch.testing.assert_close(
                    exp.logprobs, expected[exp.prompt_length - 1 :], rtol=1e-4, atol=1e-4
                )

    return check
