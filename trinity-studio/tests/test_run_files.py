"""What the studio reads from a run folder besides its scalars: the saved config, whether the
run has any data, why it has no experiences, and its tokenizer for the token view."""

from __future__ import annotations

import os
import time

import yaml
from fastapi.testclient import TestClient

from trinity.config import Config
from trinity.run_status import write_run_status
from trinity_studio.app import create_app
from trinity_studio.runs import find_runs


def _old(path):
    past = time.time() - 3600
    for folder, _, files in os.walk(path):
        for file in files:
            os.utime(os.path.join(folder, file), (past, past))


def _save_config(run_dir, **keys):
    """``config.yaml`` as the launcher writes it (:func:`trinity.launcher.save_config`)."""
    from trinity.launcher import save_config

    config = Config(
        checkpoint_root_dir=str(run_dir.parent.parent), project=run_dir.parent.name, name=run_dir.name, **keys
    )
    config.checkpoint_job_dir = str(run_dir)
    save_config(config)


def test_the_demo_runs_saved_config_is_listed_and_served(client, demo_root):
    (run,) = client.get("/api/runs").json()
    assert run["config_files"] == ["config.yaml"]
    assert run["has_data"] is True
    files = client.get("/api/runs/config", params={"run": "demo/tiny"}).json()["files"]
    config = yaml.safe_load(files["config.yaml"])
    assert config["project"] == "demo" and config["model"]["model_path"].endswith("demo/tiny/model")
    assert client.get("/api/runs/config", params={"run": "../.."}).status_code == 404


def test_save_config_writes_the_resolved_config_that_loads_back(tmp_path):
    run_dir = tmp_path / "p" / "n"
    _save_config(run_dir, model={"model_path": "/models/m"})
    text = (run_dir / "config.yaml").read_text()
    assert text.startswith("# The resolved config of this run, written by `trinity run`")
    assert yaml.safe_load(text)["model"]["model_path"] == "/models/m"
    assert [r.config_files for r in find_runs(str(tmp_path))] == []  # no run marker yet
    write_run_status(run_dir, "finished")
    (run,) = find_runs(str(tmp_path))
    assert run.config_files == ["config.yaml"]


def test_a_start_without_any_data_is_flagged_and_a_real_run_is_not(tmp_path):
    from trinity.monitor.tensorboard import TensorboardMonitor

    real, empty = tmp_path / "p" / "real", tmp_path / "p" / "real_20990101000000"
    monitor = TensorboardMonitor(str(real / "monitor" / "tensorboard"), "trainer")
    monitor.log({"actor/loss": 1.0}, 1)
    monitor.close()
    write_run_status(real, "finished")
    _old(real)
    # A failed start: status, an actor log, an event file holding only its header.
    write_run_status(empty, "failed", "starting actors: an actor died")
    (empty / "log").mkdir()
    (empty / "log" / "trainer.log").write_text("torch uses 2 of 2 CPU cores\n")
    TensorboardMonitor(str(empty / "monitor" / "tensorboard"), "trainer").close()
    runs = find_runs(str(tmp_path))
    assert [(r.id, r.has_data) for r in runs] == [("p/real_20990101000000", False), ("p/real", True)]


def test_why_a_run_has_no_experiences(tmp_path):
    in_memory, sft = tmp_path / "p" / "mem", tmp_path / "p" / "sft"
    _save_config(
        in_memory,
        mode="both",
        buffer={"trainer_input": {"experience_buffer": {"name": "e", "storage_type": "queue"}}},
    )
    _save_config(
        sft,
        mode="train",
        buffer={
            "trainer_input": {
                "experience_buffer": {
                    "name": "d",
                    "storage_type": "file",
                    "path": "/data/sft",
                    "schema_type": "sft",
                }
            }
        },
    )
    for run_dir in (in_memory, sft):
        write_run_status(run_dir, "finished")
    notes = {r.id: r.buffer_note for r in find_runs(str(tmp_path))}
    assert "kept its experiences in memory only" in notes["p/mem"]
    assert notes["p/sft"] == "an SFT stage: it trains on the dataset /data/sft, not on experiences"


def test_tokens_are_decoded_with_the_runs_own_tokenizer(client, demo_root):
    from trinity_studio.demo import demo_experiences

    source = str(demo_root / "demo" / "tiny" / "buffer" / "experiences.db")
    item = client.get("/api/experiences/item", params={"source": source, "id": 2}).json()
    exp = list(demo_experiences(2))[1]
    assert item["tokenizer"] == str(demo_root / "demo" / "tiny" / "model")
    assert item["tokenizer_error"] is None
    assert "".join(item["pieces"]) == exp.prompt_text + exp.response_text
    # "-": ids only; an explicit folder that is no tokenizer: a clear error.
    assert (
        client.get("/api/experiences/item", params={"source": source, "id": 2, "tokenizer": "-"}).json()[
            "pieces"
        ]
        is None
    )
    bad = client.get("/api/experiences/item", params={"source": source, "id": 2, "tokenizer": str(demo_root)})
    assert bad.status_code == 400 and "cannot load a tokenizer" in bad.json()["detail"]


def test_a_run_whose_model_is_gone_shows_ids_and_says_why(tmp_path):
    from trinity_studio.demo import write_sql_experiences

    run_dir = tmp_path / "p" / "gone"
    _save_config(run_dir, model={"model_path": str(tmp_path / "deleted-model")})
    write_run_status(run_dir, "finished")
    write_sql_experiences(f"sqlite:///{run_dir / 'buffer' / 'experiences.db'}", 3)
    client = TestClient(create_app(str(tmp_path)))
    item = client.get(
        "/api/experiences/item", params={"source": str(run_dir / "buffer" / "experiences.db"), "id": 1}
    ).json()
    assert item["pieces"] is None
    assert (
        "cannot load a tokenizer from" in item["tokenizer_error"]
        and "showing token ids" in item["tokenizer_error"]
    )


def test_a_queue_in_a_job_on_a_ray_of_its_own_is_kept_where_the_studio_finds_it(tmp_path, monkeypatch):
    """Its SQL mirror defaults to ``<job_dir>/buffer/<name>.db`` (listed as the run's buffer);
    an explicit path wins; on a shared cluster (whose job folder may be on NFS) there is none."""
    from trinity.config.resolve import resolve_config

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def queue_path(mode="both", **buffer):
        config = Config(
            project="p",
            name="n",
            mode=mode,
            checkpoint_root_dir=str(tmp_path),
            model={"model_path": "/models/m", "max_prompt_tokens": 8, "max_response_tokens": 8},
            buffer={
                "explorer_input": {"taskset": {"path": "/data/t"}},
                "trainer_input": {"experience_buffer": {"name": "exps", "storage_type": "queue", **buffer}},
            },
        )
        return resolve_config(config).buffer.trainer_input.experience_buffer.path

    assert queue_path() == f"sqlite:///{tmp_path}/p/n/buffer/exps.db"
    assert queue_path(path="sqlite:////data/mine.db") == "sqlite:////data/mine.db"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert queue_path() is None
