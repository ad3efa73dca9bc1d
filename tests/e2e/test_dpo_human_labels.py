"""End to end: a DPO train job whose task pipeline is ``human_preference_annotation_mapper``
(upstream's ``dpo_human_in_the_loop``, CI-sized). ``trinity run`` serves the Labels page and
waits; a person (this test, over the page's HTTP API) labels the pairs; the job then trains two
DPO steps on exactly the labelled pairs. The tiny math model and its DPO rows stand in for
upstream's demo data (answers shown in both orders)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from trinity.monitor.tensorboard import read_scalars
from trinity.testing.jobs import tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: DPO steps the job trains on the labelled pairs, two pairs a step.
STEPS = 2


def _person(api_url: str, good: dict[str, str], done: list[dict], stop: threading.Event) -> None:
    """Picks the right answer of each pair the page shows (skips the last one)."""
    while not stop.is_set():
        try:
            _label_next(api_url, good, done)
        except OSError:  # the job has not served the page yet (or has stopped it: all decided)
            pass
        except Exception as exc:  # the test says what went wrong
            done.append({"error": repr(exc)})
            return
        time.sleep(0.1)


def _label_next(api_url: str, good: dict[str, str], done: list[dict]) -> None:
    """What the page does: ask for the next pair of each project, post the choice."""
    with urllib.request.urlopen(f"{api_url}/api/labels/projects", timeout=5) as response:
        projects = json.load(response)
    for project in projects:
        query = urllib.parse.urlencode({"store": project["store"]})
        with urllib.request.urlopen(f"{api_url}/api/labels/next?{query}", timeout=5) as response:
            pair = json.load(response)["pair"]
        if pair is None:
            continue
        choice = "answer1" if pair["answer1"] == good[pair["prompt"]] else "answer2"
        if len(done) == len(good) - 1:
            choice = "skip"
        body = {"store": project["store"], "pair_id": pair["pair_id"], "choice": choice, "labelled_by": "e2e"}
        request = urllib.request.Request(
            f"{api_url}/api/labels", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        urllib.request.urlopen(request, timeout=5).close()
        done.append({**pair, "choice": choice})


def test_dpo_steps_train_on_the_pairs_people_labelled(tmp_path, math_job, job_env):
    math_job(tmp_path, train=2 * STEPS + 1, test=2, dpo=2 * STEPS + 1)  # one of them skipped
    good, raw = {}, []
    for i, line in enumerate((tmp_path / "data" / "dpo" / "train.jsonl").read_text().splitlines()):
        row = json.loads(line)
        good[row["prompt"]] = row["chosen"]
        answers = [row["chosen"], row["rejected"]][:: 1 if i % 2 else -1]  # the right one first or second
        raw.append({"prompt": row["prompt"], "answer1": answers[0], "answer2": answers[1]})
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in raw))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        api_url = f"http://127.0.0.1:{s.getsockname()[1]}"
    operator = {
        "name": "human_preference_annotation_mapper",
        "args": {"wait_for_annotations": True, "timeout": 300, "poll_interval": 0.2, "api_url": api_url},
    }
    config = tiny_job(
        tmp_path,
        name="human_dpo",
        mode="train",
        algorithm={"algorithm_type": "dpo", "repeat_times": None, "optimizer": {"lr": 1e-3}},
        buffer={
            "train_batch_size": 4,  # two labelled pairs, chosen and rejected
            "total_steps": STEPS,
            "explorer_input": None,
            "trainer_input": {
                "experience_buffer": {
                    "name": "labelled",
                    "storage_type": "file",
                    "path": "./outputs/human_annotation_output/",  # upstream's; the pipeline's output instead
                    "format": {"prompt_type": "plaintext", "prompt_key": "prompt"},
                }
            },
        },
        explorer=None,
        trainer={"save_interval": 0},
        data_processor={
            "task_pipeline": {
                "num_process": 1,
                "inputs": [str(tmp_path / "pairs.jsonl")],
                "target_fields": ["prompt"],
                "operators": [operator],
            }
        },
    )
    job = write_job(tmp_path / "job.yaml", config)
    done: list[dict] = []
    stop = threading.Event()
    person = threading.Thread(target=_person, args=(api_url, good, done, stop), daemon=True)
    person.start()
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(job)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=job_env, cwd=tmp_path)
    finally:
        stop.set()
        person.join(timeout=10)
    output = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.returncode == 0, output
    assert f"label them at {api_url}/#labels?store=" in proc.stderr, output  # it said what it waited for
    assert [d.get("choice") for d in done].count("skip") == 1 and len(done) == 2 * STEPS + 1, done

    job_dir = tmp_path / "ckpt" / "e2e" / "human_dpo"
    rows = [json.loads(line) for line in (job_dir / "task_pipeline" / "train.jsonl").read_text().splitlines()]
    labelled = [d for d in done if d["choice"] != "skip"]
    assert [(r["prompt"], r["chosen"], r["labelled_by"]) for r in rows] == [
        (d["prompt"], good[d["prompt"]], "e2e") for d in sorted(labelled, key=lambda d: d["position"])
    ]
    trainer = read_scalars(Path(job_dir) / "monitor" / "tensorboard" / "trainer")
    assert len(trainer["actor/dpo_loss"]) == STEPS, "DPO steps on the labelled pairs"
