"""End to end: jobs on an existing Ray cluster — a head of its own started by ``ray start --head``
(own temp dir, own port, token authentication on), tiny jobs joining it through
``cluster.ray_address`` (two at once, one of them in ``mode: colocate``), the head alive after
them, and the one-line errors of a job the head refuses or cannot hold. Only this head is
stopped at the end: its processes are the process group ``ray start`` was started in (the
machine may run other Rays, e.g. other tests' local ones, which ``ray stop`` would kill)."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from trinity.testing.jobs import deep_merge, tiny_job, write_job

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RAY = Path(sys.executable).parent / "ray"

# Run in a subprocess (this test process stays out of Ray): what the head's GCS knows of actors.
ACTOR_TABLE = """
import json, sys
import ray
ray.init(address=sys.argv[1], log_to_driver=False)
rows = [
    {"name": a["Name"], "class": a["ActorClassName"], "state": a["State"], "job": a["JobID"]}
    for a in ray._private.state.actors().values()
]
print(json.dumps(rows))
"""


@dataclass
class Head:
    address: str
    token: str
    temp_dir: Path
    pgid: int

    def env(self, base: dict[str, str], token: str | None = None) -> dict[str, str]:
        """``base`` with this head's token (or ``token``) given the way a user would: the token
        only, never ``RAY_AUTH_MODE`` (the job must work out that the head wants it)."""
        env = {k: v for k, v in base.items() if k not in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")}
        env["RAY_AUTH_TOKEN"] = self.token if token is None else token
        return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop_head(pgid: int, temp_dir: Path) -> None:
    """Stop this head only: its process group, SIGTERM then (after 1 s) SIGKILL.

    The agents that stop on SIGTERM are gone within 0.2 s; the GCS server, the raylet, the
    autoscaler's monitor and the runtime-env agent were still running 15 s after it (measured),
    so a longer grace only waited for the SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not _group_alive(pgid):
            break
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def head(job_env) -> Iterator[Head]:
    if not RAY.is_file():
        pytest.skip(f"the ray CLI is not installed next to {sys.executable}")
    # A short path: Ray's socket paths under the temp dir must stay below the OS limit (107).
    temp_dir = Path(tempfile.mkdtemp(prefix="trh", dir="/tmp"))
    port, token = _free_port(), secrets.token_hex(32)
    env = {**job_env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    command = [
        str(RAY),
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        f"--temp-dir={temp_dir}",
        "--num-cpus=4",  # two jobs at once: an explorer and a trainer each
        "--num-gpus=0",
        "--include-dashboard=false",
        "--disable-usage-stats",
    ]
    # A session of its own: every process of the head shares this process group (and no other).
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        _stop_head(proc.pid, temp_dir)
        pytest.fail("`ray start --head` did not return within 120 s")
    if proc.returncode != 0:
        _stop_head(proc.pid, temp_dir)
        pytest.fail(f"`ray start --head` failed: {out[-2000:]}")
    try:
        yield Head(f"127.0.0.1:{port}", token, temp_dir, proc.pid)
    finally:
        _stop_head(proc.pid, temp_dir)


def _write_job(root: Path, name: str, mode: str, head: Head, file: str = "", **overrides) -> Path:
    """The tiny job ``name`` joining ``head`` (``overrides`` merged into its config), written to
    ``root/<file or name>.yaml``."""
    config = tiny_job(
        root,
        name=name,
        mode=mode,
        cluster={"ray_address": head.address},
        algorithm={"optimizer": {"lr": 1.0e-3}},
        buffer={
            "total_steps": 2,
            "trainer_input": {"experience_buffer": {"storage_type": "queue", "path": None}},
        },
        explorer={"eval_interval": 100, "runner_per_model": 1},
        trainer={"save_interval": 2},
        monitor={"monitor_type": "console"},
    )
    return write_job(root / f"{file or name}.yaml", deep_merge(config, overrides))


def _trinity(config: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "trinity.cli", "run", "--config", str(config)]
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)


def _actors(head: Head, env: dict[str, str]) -> list[dict[str, str]]:
    """The head's actor table; connecting at all shows the head is still up."""
    probe_env = {**head.env(env), "RAY_AUTH_MODE": "token"}
    proc = subprocess.run(
        [sys.executable, "-c", ACTOR_TABLE, head.address],
        capture_output=True,
        text=True,
        timeout=120,
        env=probe_env,
    )
    assert proc.returncode == 0, f"the head at {head.address} is gone: {proc.stderr[-2000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _job_actors(rows: list[dict[str, str]]) -> dict[str, set[str]]:
    """Ray job id -> the names of its explorer/trainer actors."""
    jobs: dict[str, set[str]] = {}
    for row in rows:
        if row["class"] in ("ExplorerActor", "TrainerActor"):
            jobs.setdefault(row["job"], set()).add(row["name"])
    return jobs


@pytest.fixture(scope="module")
def job_root(tmp_path_factory, math_job) -> Path:
    return math_job(tmp_path_factory.mktemp("cluster"), train=16, test=2)


def test_jobs_run_on_the_head_they_join_and_leave_it_running(head, job_root, job_env):
    # Two jobs on the head at once (their own namespaces), one in mode colocate (on CPU: both
    # roles sharing the cores); each is checked as a job alone on it would be.
    env = head.env(job_env)
    command = [sys.executable, "-m", "trinity.cli", "run", "--config"]
    running = [
        subprocess.Popen(
            [*command, str(_write_job(job_root, name, mode, head))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for name, mode in (("first", "colocate"), ("second", "both"))
    ]
    for proc in running:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:] + err[-3000:]
        assert f"joined the Ray cluster at {head.address}" in err
        # The job was given only the token, and worked out that the head wants it.
        assert "uses token authentication: sending the token from RAY_AUTH_TOKEN" in err
        assert "[trinity] done: 2 train steps" in out
    rows = _actors(head, job_env)
    jobs = _job_actors(rows)
    assert len(jobs) == 2 and all(names == {"explorer", "trainer"} for names in jobs.values()), jobs
    # The jobs stopped their actors, not the head (which answered _actors).
    assert all(row["state"] == "DEAD" for row in rows if row["class"] in ("ExplorerActor", "TrainerActor"))
    # Each job's detached queue actor went with the job (the last, and only, job using it).
    queues = [row for row in rows if row["class"] == "QueueActor"]
    assert len(queues) == 2 and all(row["state"] == "DEAD" for row in queues), queues
    assert _group_alive(head.pgid)


@pytest.mark.parametrize("sync_method", ["checkpoint", "nccl"])
def test_a_decoupled_pair_shares_the_named_queue_and_the_last_to_leave_removes_it(
    head, job_root, job_env, sync_method
):
    # An explore job and a train job of one run (same project/name), each its own `trinity run`,
    # on the shared head: both reach the queue actor by name in the run's namespace (no path).
    # Weights go through checkpoints, or (nccl) the train job broadcasts to the explore job's
    # explorer actor (gloo on CPU).
    env = head.env(job_env)
    name = f"pair_{sync_method}"
    queues_before = sum(row["class"] == "QueueActor" for row in _actors(head, job_env))
    command = [sys.executable, "-m", "trinity.cli", "run", "--config"]
    configs = {}
    for mode in ("train", "explore"):
        # Four train steps, weights sent after steps 2 and 4, while the explorer explores.
        configs[mode] = _write_job(
            job_root,
            name,
            mode,
            head,
            file=f"{name}_{mode}",
            buffer={"total_steps": 4},
            synchronizer={"sync_method": sync_method, "sync_interval": 2},
        )
    procs = {
        mode: subprocess.Popen(
            [*command, str(configs[mode])], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for mode in ("train", "explore")
    }
    outs = {mode: proc.communicate(timeout=600) for mode, proc in procs.items()}
    for mode, proc in procs.items():
        assert proc.returncode == 0, mode + ": " + outs[mode][0][-3000:] + outs[mode][1][-3000:]
    assert "[trinity] done: 4 train steps" in outs["train"][0]
    if sync_method == "nccl":
        # The explore job starts its actors while the train job waits for its first batch, so
        # its explorer is on the cluster for the broadcast after train step 2.
        assert "trainer step 2: broadcast version 2 to the explorer job" in outs["train"][0], outs["train"]
        log = (job_root / "ckpt" / "e2e" / name / "log" / "explorer.log").read_text()
        assert "loaded weights version 2 from the trainer's broadcast" in log
    queues = [row for row in _actors(head, job_env) if row["class"] == "QueueActor"]
    # One queue for the pair (not one per job), gone once both jobs left.
    assert len(queues) == queues_before + 1 and all(row["state"] == "DEAD" for row in queues), queues


def test_a_job_asking_for_more_than_the_cluster_has_stops_in_one_line(head, job_root, job_env):
    config = _write_job(job_root, "too_big", "both", head, cluster={"node_num": 2})
    proc = _trinity(config, head.env(job_env), timeout=120)
    assert proc.returncode == 1
    line = (
        f"[trinity] job failed: cluster.node_num is 2 but the Ray cluster at {head.address} has 1 alive "
        "node(s); start Ray on the others (`ray start --address=<head>:<port>`) or lower cluster.node_num"
    )
    assert line in proc.stderr.splitlines(), proc.stderr[-3000:]


def test_a_job_the_head_refuses_says_why_in_one_line(head, job_root, job_env, tmp_path):
    config = _write_job(job_root, "refused", "both", head)
    start = time.monotonic()
    wrong = _trinity(config, head.env(job_env, token="0" * 64), timeout=120)
    assert wrong.returncode == 1
    line = (
        f"[trinity] job failed: cannot connect to the Ray cluster at {head.address}: the head refused "
        "the token from RAY_AUTH_TOKEN (token authentication); set RAY_AUTH_TOKEN to the head's token "
        "(`ray get-auth-token` on the head)"
    )
    assert line in wrong.stderr.splitlines(), wrong.stderr[-3000:]
    assert "Traceback" not in wrong.stderr

    # No token anywhere (an empty home: no ~/.ray/auth_token).
    no_token_env = {k: v for k, v in head.env(job_env).items() if k != "RAY_AUTH_TOKEN"}
    no_token_env["HOME"] = str(tmp_path)
    none = _trinity(config, no_token_env, timeout=120)
    assert none.returncode == 1
    assert "requires token authentication and no token was found" in none.stderr, none.stderr[-3000:]
    # Refused at once, not after Ray's retries.
    assert time.monotonic() - start < 90
    assert _actors(head, job_env) is not None  # the head is unharmed
