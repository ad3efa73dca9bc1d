"""Joining a Ray cluster (trinity.cluster): address resolution, token detection, the one-line
errors and the resource checks, without a cluster (tests/e2e/test_cluster.py runs a real one)."""

from __future__ import annotations

import logging
import socket
from pathlib import Path

import pytest

from trinity.cluster import (
    ClusterError,
    auth_reason,
    check_resources,
    connect,
    failure_line,
    is_auth_error,
    resolve_address,
    token_source,
    travelling_env,
)
from trinity.config import Config


@pytest.mark.parametrize(
    ("configured", "env", "expected"),
    [
        ("10.0.0.1:6379", {"RAY_ADDRESS": "10.0.0.2:6379"}, ("10.0.0.1:6379", "cluster.ray_address")),
        ("auto", {"RAY_ADDRESS": "10.0.0.2:6379"}, ("10.0.0.2:6379", "RAY_ADDRESS")),
        ("", {"RAY_ADDRESS": " auto "}, ("auto", "RAY_ADDRESS")),
        ("local", {"RAY_ADDRESS": "10.0.0.2:6379"}, ("10.0.0.2:6379", "RAY_ADDRESS")),
        ("auto", {}, (None, "")),
        ("auto", {"RAY_ADDRESS": "local"}, (None, "")),
        ("auto", {"RAY_ADDRESS": ""}, (None, "")),
    ],
)
def test_address_config_wins_then_ray_address_else_a_local_ray(configured, env, expected):
    assert resolve_address(configured, env) == expected


def test_trinity_and_offline_variables_travel_to_the_actors():
    env = travelling_env({"TRINITY_X": "1", "HF_HUB_OFFLINE": "1", "HOME": "/root", "RAY_AUTH_TOKEN": "s"})
    assert env == {"TRINITY_X": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def test_a_users_openmp_wait_settings_travel_to_the_actors():
    env = travelling_env({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000", "OMP_NUM_THREADS": "1"})
    assert (env["OMP_WAIT_POLICY"], env["GOMP_SPINCOUNT"], env["OMP_NUM_THREADS"]) == (
        "PASSIVE",
        "10000",
        "1",
    )
    assert "OMP_WAIT_POLICY" not in travelling_env({})  # OpenMP's own default otherwise


def test_token_is_found_where_ray_looks_in_rays_order(tmp_path: Path):
    home = tmp_path / "home"
    assert token_source({}, home) is None
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("t")
    assert token_source({}, home) == str(home / ".ray" / "auth_token")
    token_file = tmp_path / "token"
    token_file.write_text("t")
    assert (
        token_source({"RAY_AUTH_TOKEN_PATH": str(token_file)}, home) == f"RAY_AUTH_TOKEN_PATH ({token_file})"
    )
    # A path to nothing is no token, even with the default file present (Ray reads only the path).
    assert token_source({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "absent")}, home) is None
    assert (
        token_source({"RAY_AUTH_TOKEN": "abc", "RAY_AUTH_TOKEN_PATH": str(token_file)}, home)
        == "RAY_AUTH_TOKEN"
    )
    assert token_source({"RAY_AUTH_TOKEN": "  "}, home) == str(home / ".ray" / "auth_token")


def test_auth_reason_says_what_is_missing_and_how_to_get_it(tmp_path: Path):
    no_token = auth_reason({}, tmp_path)
    assert "requires token authentication and no token was found" in no_token
    assert "ray get-auth-token" in no_token
    refused = auth_reason({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "x"}, tmp_path)
    assert "refused the token from RAY_AUTH_TOKEN" in refused
    disabled = auth_reason({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "x"}, tmp_path)
    assert "RAY_AUTH_MODE is 'disabled'" in disabled


def test_failure_line_is_one_line_naming_the_address_and_the_way_out():
    line = failure_line("10.0.0.1:6379", "RAY_ADDRESS", "nothing listens there")
    assert "\n" not in line
    assert line == (
        "cannot connect to the Ray cluster at 10.0.0.1:6379: nothing listens there; "
        "start it with `ray start --head` or unset RAY_ADDRESS"
    )
    assert failure_line("h:1", "cluster.ray_address", "r").endswith("or unset cluster.ray_address")
    # A head that is there but refuses the job: starting one would not help.
    assert failure_line("h:1", "RAY_ADDRESS", "refused", unreachable=False) == (
        "cannot connect to the Ray cluster at h:1: refused"
    )


def test_auth_refusals_are_recognised_through_the_cause_chain():
    class AuthenticationError(Exception):
        pass

    try:
        try:
            raise RuntimeError("Failed to connect to GCS ... InvalidAuthToken: missing or incorrect")
        except RuntimeError as inner:
            raise ConnectionError("Failed to connect to Ray cluster at h:1") from inner
    except ConnectionError as exc:
        assert is_auth_error(exc)
    assert is_auth_error(AuthenticationError("x"))
    assert not is_auth_error(ConnectionError("Failed to connect to Ray cluster at h:1"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connect_to_a_port_where_nothing_listens_fails_in_one_line(monkeypatch):
    pytest.importorskip("ray")
    import ray

    if ray.is_initialized():
        pytest.skip("this process is already connected to Ray")
    port = _free_port()
    config = Config.model_validate({"cluster": {"ray_address": f"127.0.0.1:{port}"}})
    with pytest.raises(ClusterError) as info:
        connect(config)
    assert str(info.value) == (
        f"cannot connect to the Ray cluster at 127.0.0.1:{port}: nothing listens there (connection refused); "
        "start it with `ray start --head` or unset cluster.ray_address"
    )
    assert not ray.is_initialized()


def test_a_local_ray_gets_the_travelling_variables_by_inheritance_not_a_runtime_env(monkeypatch):
    """Ray's processes started by ray.init inherit this environment; a runtime_env would make
    Ray start a fresh worker per actor instead of using the ones it starts with the node."""
    pytest.importorskip("ray")
    import os

    import ray

    calls: list[dict] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append({**kwargs, "env": dict(os.environ)}))
    monkeypatch.setattr(ray, "nodes", lambda: [_node()])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    monkeypatch.setenv("TRINITY_PROBE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    connect(Config())
    [call] = calls
    assert call["address"] == "local"
    assert "runtime_env" not in call
    assert call["env"]["TRINITY_PROBE"] == "1" and call["env"]["HF_HUB_OFFLINE"] == "1"
    assert call["env"]["TOKENIZERS_PARALLELISM"] == "false"  # our default, set before Ray starts
    # A value of the user's own is kept.
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    connect(Config())
    assert calls[1]["env"]["TOKENIZERS_PARALLELISM"] == "true"


NICENESS_PROBE = """
import os
import ray
from trinity.cluster import connect
from trinity.config import Config

connect(Config(ray_namespace="niceness-probe"))
print("actor niceness", ray.get(ray.remote(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
@pytest.mark.parametrize(("env", "expected"), [({}, 3), ({"RAY_worker_niceness": "7"}, 10)])
def test_workers_of_a_local_ray_run_at_the_launching_processs_priority(env, expected):
    """Ray's default is niceness +15: on a busy machine the actors, which do the job's work,
    would be starved first. A real Ray, started from a process at niceness 3; a value the user
    sets is kept (Ray adds it to the niceness its processes inherit)."""
    pytest.importorskip("ray")
    import os
    import subprocess
    import sys

    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-c", f"import os; os.nice(3); exec({NICENESS_PROBE!r})"],
        capture_output=True, text=True, timeout=180, env={**full_env, **env},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"actor niceness {expected}" in proc.stdout, proc.stdout + proc.stderr[-2000:]


def test_a_local_ray_starts_without_the_autoscaler_monitor_and_log_monitor(monkeypatch):
    """The Ray a job starts for itself gets RayParams with both monitors off (what ``ray start
    --no-monitor --include-log-monitor false`` sets); other RayParams are left as Ray makes them."""
    pytest.importorskip("ray")
    import ray
    from ray._private.parameter import RayParams

    seen: list[tuple[bool, bool]] = []

    def fake_init(**kwargs):
        params = RayParams(num_cpus=2)  # what ray.init builds for a local head
        seen.append((params.no_monitor, params.include_log_monitor))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "nodes", lambda: [_node()])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    connect(Config())
    assert seen == [(True, False)]
    after = RayParams(num_cpus=2)
    assert (after.no_monitor, after.include_log_monitor) == (False, None)


def test_joining_a_cluster_leaves_its_monitors_alone(monkeypatch):
    pytest.importorskip("ray")
    import ray
    from ray._private.parameter import RayParams

    seen: list[tuple[bool, bool]] = []

    def fake_init(**kwargs):
        params = RayParams()
        seen.append((params.no_monitor, params.include_log_monitor))

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "nodes", lambda: [_node()])
    monkeypatch.setattr("trinity.cluster._check_reachable", lambda *a: None)
    monkeypatch.setattr("trinity.cluster._check_head", lambda *a: None)
    connect(_cluster_config(ray_address="10.0.0.1:6379"))
    assert seen == [(False, None)]


def _node(gpus: float = 0, alive: bool = True) -> dict:
    resources = {"CPU": 2.0, **({"GPU": gpus} if gpus else {})}
    return {"Alive": alive, "Resources": resources}


def _cluster_config(mode: str = "both", **cluster) -> Config:
    return Config.model_validate({"mode": mode, "cluster": cluster})


def test_resources_within_the_cluster_pass():
    nodes = [_node(8), _node(8), _node(8, alive=False)]
    check_resources(_cluster_config(), nodes, "h:1")
    check_resources(_cluster_config(node_num=2, gpu_per_node=8), nodes, "h:1")
    check_resources(_cluster_config(node_num=1, gpu_per_node=4), nodes, "h:1")


def test_more_nodes_than_the_cluster_has_is_one_clear_error():
    with pytest.raises(
        ClusterError, match=r"cluster.node_num is 3 but the Ray cluster at h:1 has 2 alive node"
    ):
        check_resources(_cluster_config(node_num=3), [_node(), _node(), _node(alive=False)], "h:1")


def test_more_gpus_per_node_than_the_nodes_have_is_one_clear_error():
    nodes = [_node(8), _node(4)]
    with pytest.raises(
        ClusterError, match=r"gpu_per_node is 8 but only 1 node\(s\) of the Ray cluster at h:1"
    ):
        check_resources(_cluster_config(node_num=2, gpu_per_node=8), nodes, "h:1")
    with pytest.raises(
        ClusterError, match=r"0 node\(s\) of the local Ray have that many GPUs \(GPUs per node: 0\)"
    ):
        check_resources(_cluster_config(gpu_per_node=1), [_node()], "")


def test_more_verl_cpu_ranks_than_a_node_has_cpus_is_one_clear_error():
    def verl(ranks: int, mode: str = "both") -> Config:
        trainer = {"trainer_type": "verl", "trainer_config": {"trainer": {"n_gpus_per_node": ranks}}}
        return Config.model_validate({"mode": mode, "trainer": trainer})

    check_resources(verl(2), [_node()], "")
    check_resources(verl(3, mode="explore"), [_node()], "")  # no trainer in this job
    check_resources(verl(3), [_node(1)], "")  # on GPUs a rank is a GPU, checked where it is placed
    with pytest.raises(
        ClusterError,
        match=r"^the veRL trainer runs on CPU here \(the local Ray has no GPU\): 1 node\(s\) x 3 rank\(s\), "
        r"one CPU each .* CPUs per node: 2; lower trainer.trainer_config.trainer.n_gpus_per_node$",
    ):
        check_resources(verl(3), [_node()], "")


def test_colocate_on_several_gpus_warns_that_it_uses_one(caplog):
    with caplog.at_level(logging.WARNING, logger="trinity.cluster"):
        check_resources(_cluster_config(mode="colocate"), [_node(1)], "h:1")
        assert not caplog.records
        check_resources(_cluster_config(mode="colocate"), [_node(2)], "h:1")
    assert "mode colocate shares one GPU" in caplog.text


# -- a job's own Ray listens on loopback only ------------------------------------------------------

LISTEN_PROBE = """
import ipaddress, json, os, time
import psutil, ray
from trinity.cluster import connect
from trinity.config import Config

connect(Config(ray_namespace="listen-probe"))
actor = ray.remote(num_cpus=0)(type("Probe", (), {"pid": lambda self: os.getpid()})).remote()
actor_pid = ray.get(actor.pid.remote())
session = ray._private.worker.global_worker.node.get_session_dir_path()
me = psutil.Process()
procs = {me.pid: me, **{p.pid: p for p in me.children(recursive=True)}}
for p in psutil.process_iter(["cmdline"]):
    if session in " ".join(p.info["cmdline"] or []):
        procs[p.pid] = p  # Ray's own processes name the session dir on their command line
listening = []
for pid, p in procs.items():
    try:
        listening += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections("tcp") if c.status == "LISTEN"]
    except psutil.Error:
        pass  # ended meanwhile
print(json.dumps({"actor": actor_pid, "pids": sorted(procs), "listening": listening}))
ray.shutdown()
"""


def _is_loopback(ip: str) -> bool:
    import ipaddress

    address = ipaddress.ip_address(ip.split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1, an IPv6 socket's view
    return (mapped or address).is_loopback


@pytest.mark.slow  # over ~3 s on 2 cores: not in `nox -s unit`
def test_a_local_ray_listens_on_loopback_only():
    """A job's own Ray (no cluster named): every listening socket of the processes it started
    (GCS, raylet, agents, the workers and the driver's core worker) is on a loopback address.
    Ray's default is every interface (7 ports, seen from a `mode: serve` job)."""
    pytest.importorskip("ray")
    pytest.importorskip("psutil")  # the probe's
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    proc = subprocess.run(
        [sys.executable, "-c", LISTEN_PROBE], capture_output=True, text=True, timeout=180, env=env
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    names = {name for name, _, _ in seen["listening"]}
    # Found the processes that serve (else the check below would pass on nothing).
    assert {"gcs_server", "raylet"} <= names, seen
    assert seen["actor"] in seen["pids"], seen
    exposed = [entry for entry in seen["listening"] if not _is_loopback(entry[1])]
    assert exposed == [], f"listening beyond loopback: {exposed}"


def test_the_loopback_switch_is_only_on_while_a_local_ray_starts(monkeypatch):
    """``ray.init`` of a local Ray gets a loopback node address, with Ray's cluster mode off just
    for that call; joining a cluster passes no node address and leaves the switch alone."""
    pytest.importorskip("ray")
    import os

    import ray
    from ray._private import ray_constants

    calls: list[dict] = []

    def fake_init(**kwargs):
        calls.append(
            {
                **kwargs,
                "cluster_mode": ray_constants.ENABLE_RAY_CLUSTER,
                "env": os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR),
            }
        )

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(ray, "nodes", lambda: [_node()])
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, raising=False)
    before = ray_constants.ENABLE_RAY_CLUSTER
    connect(Config())
    assert (calls[0]["_node_ip_address"], calls[0]["cluster_mode"], calls[0]["env"]) == (
        "127.0.0.1",
        False,
        "0",
    )
    assert ray_constants.ENABLE_RAY_CLUSTER is before
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR not in os.environ
    monkeypatch.setattr("trinity.cluster._check_reachable", lambda *a: None)
    monkeypatch.setattr("trinity.cluster._check_head", lambda *a: None)
    connect(_cluster_config(ray_address="10.0.0.1:6379"))
    assert "_node_ip_address" not in calls[1]
    assert (calls[1]["cluster_mode"], calls[1]["env"]) == (before, None)
