"""The Runs page's API: run folders under the root, their status, their scalars."""

from __future__ import annotations

import os
import time

from trinity_studio.demo import DEMO_TASKSETS, reward_at
from trinity_studio.runs import find_runs

from .conftest import DEMO_STEPS


def _touch_old(path):
    past = time.time() - 3600
    for folder, _, files in os.walk(path):
        for file in files:
            os.utime(os.path.join(folder, file), (past, past))


def test_runs_lists_every_layout_with_its_inferred_status(tmp_path):
    finished = tmp_path / "proj" / "done"
    (finished / "log").mkdir(parents=True)
    (finished / "log" / "trainer.log").write_text("step 1\nstep 2\n")
    failed = tmp_path / "proj" / "group" / "broken"
    (failed / "log").mkdir(parents=True)
    (failed / "log" / "explorer.log").write_text("Traceback (most recent call last):\n  ...\nValueError: x\n")
    stage = tmp_path / "proj" / "multi" / "grpo"  # a stage of a multi-stage job: <name>/<stage>
    (stage / "monitor" / "tensorboard" / "explorer").mkdir(parents=True)
    (stage / "global_step_3").mkdir()
    _touch_old(tmp_path)
    running = tmp_path / "proj" / "live"
    (running / "log").mkdir(parents=True)
    (running / "log" / "explorer.log").write_text("step 1\n")  # written just now

    runs = {r.id: r for r in find_runs(str(tmp_path))}
    assert set(runs) == {"proj/done", "proj/group/broken", "proj/multi/grpo", "proj/live"}
    assert runs["proj/done"].status == "finished"
    assert runs["proj/group/broken"].status == "failed"
    assert "explorer.log" in runs["proj/group/broken"].status_reason
    assert runs["proj/live"].status == "running"
    assert runs["proj/multi/grpo"].checkpoints == 1
    assert runs["proj/multi/grpo"].roles == ["explorer"]
    # A job the studio launched reports what its process says, whatever the files suggest.
    (launched,) = [r for r in find_runs(str(tmp_path), {str(running): "failed"}) if r.id == "proj/live"]
    assert (launched.status, launched.status_reason) == ("failed", "started from the studio")


def test_the_status_the_launcher_recorded_wins_and_a_killed_run_is_failed(tmp_path):
    import json
    import subprocess
    import sys

    from trinity.run_status import FILE, read_run_status, write_run_status

    done, crashed, killed = (tmp_path / "p" / n for n in ("done", "crashed", "killed"))
    write_run_status(done, "running")
    (done / "log").mkdir()
    (done / "log" / "explorer.log").write_text("ERROR a retried request\n")  # inference would say failed
    write_run_status(done, "finished")
    write_run_status(crashed, "failed", "trainer: CUDA out of memory")
    write_run_status(killed, "running")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record = json.loads((killed / FILE).read_text())
    (killed / FILE).write_text(json.dumps({**record, "pid": gone.pid}))

    runs = {r.id: r for r in find_runs(str(tmp_path))}
    assert (runs["p/done"].status, runs["p/done"].status_reason) == ("finished", "recorded by the launcher")
    assert (runs["p/crashed"].status, runs["p/crashed"].status_reason) == (
        "failed",
        "trainer: CUDA out of memory",
    )
    assert runs["p/killed"].status == "failed"
    assert f"its process {gone.pid} is gone without finishing" in runs["p/killed"].status_reason
    assert read_run_status(done)["started"] <= read_run_status(done)["ended"]


def test_runs_api_lists_the_demo_run_as_finished(client, demo_root):
    (run,) = client.get("/api/runs").json()
    assert run["id"] == "demo/tiny"
    assert run["status"] == "finished"
    assert run["roles"] == ["explorer", "trainer"]
    assert run["buffers"] == [str(demo_root / "demo" / "tiny" / "buffer" / "experiences.db")]


def test_scalars_of_runs_by_role_and_tag(client):
    data = client.get("/api/runs/scalars", params={"run": "demo/tiny"}).json()["demo/tiny"]
    rewards = data["explorer"]["rollout/reward_mean"]
    assert [step for step, _ in rewards] == list(range(1, DEMO_STEPS + 1))
    assert [round(v, 4) for _, v in rewards] == [reward_at(s) for s in range(1, DEMO_STEPS + 1)]
    assert {f"eval/{t}/accuracy" for t in DEMO_TASKSETS} <= set(data["explorer"])
    assert {"actor/loss", "timing/step"} <= set(data["trainer"])


def test_scalars_refuse_paths_outside_the_root(client):
    assert client.get("/api/runs/scalars", params={"run": "../.."}).status_code == 404
    assert client.get("/api/runs/scalars", params={"run": "demo/none"}).status_code == 404
