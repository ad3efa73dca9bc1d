"""Joining the Ray cluster a job runs on, or starting a Ray of its own.

:func:`connect` is the one place a job connects to Ray. ``cluster.ray_address`` names the
cluster; ``auto`` (the default), ``local`` or an empty value defer to ``$RAY_ADDRESS``, and
without it the job starts a local Ray with this machine's CPUs. A job that joins a cluster only
disconnects from it when it ends (``ray.shutdown()`` stops only a Ray the process started), so
the cluster stays up for the next job, and two jobs can share it.

Token authentication: a head started by ``ray start --head`` on recent Ray (2.60 here) turns it
on when a token exists (``$RAY_AUTH_TOKEN``, ``$RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``), but
``ray.init(address=...)`` sends a token only when ``RAY_AUTH_MODE=token`` is set by hand. Before
connecting, :func:`connect` asks the head's GCS directly (a head answers at once) whether it accepts
this process; when the head wants a token and one is available it turns token mode on, so the
token is only ever sent to a head that asks for it. Every failure to connect is one line
(:class:`ClusterError`) instead of Ray's twenty seconds of retries and a traceback.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import Config

from trinity.config.ray_address import resolve_address

logger = logging.getLogger("trinity.cluster")

#: Environment variables (besides ``TRINITY_*``) that travel to every actor of the job.
TRAVELLING_ENV = (
    "HF_HUB_OFFLINE",
    "HF_DATASETS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    "OMP_NUM_THREADS",
    # How torch's OpenMP threads wait between parallel regions: left as OpenMP has it (they spin
    # a while, which pays on a quiet machine), a user's choice reaches every actor.
    "OMP_WAIT_POLICY",
    "GOMP_SPINCOUNT",
)

# Seconds to wait for a TCP connection to the head before calling it unreachable.
_REACH_TIMEOUT_S = 5.0


class ClusterError(RuntimeError):
    """The job cannot use the Ray cluster; the message is one line saying why and what to do."""


def travelling_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The driver's environment variables that every actor of the job gets: through Ray's
    ``runtime_env`` on a cluster the job joins; inherited on a Ray the job starts itself."""
    env = {k: v for k, v in environ.items() if k.startswith("TRINITY_") or k in TRAVELLING_ENV}
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def token_source(environ: Mapping[str, str], home: Path | None = None) -> str | None:
    """Where Ray would read this process's auth token from, in Ray's order; ``None``: no token."""
    if environ.get("RAY_AUTH_TOKEN", "").strip():
        return "RAY_AUTH_TOKEN"
    path = environ.get("RAY_AUTH_TOKEN_PATH", "").strip()
    if path:
        return f"RAY_AUTH_TOKEN_PATH ({path})" if Path(path).expanduser().is_file() else None
    default = (home if home is not None else Path.home()) / ".ray" / "auth_token"
    return str(default) if default.is_file() else None


def failure_line(address: str, origin: str, reason: str, *, unreachable: bool = True) -> str:
    """The one line that says the job cannot connect to the cluster at ``address``; for a head
    that is not there (``unreachable``) it ends with how to start one or not ask for it."""
    line = f"cannot connect to the Ray cluster at {address}: {reason}"
    if unreachable:
        line += f"; start it with `ray start --head` or unset {origin or 'cluster.ray_address'}"
    return line


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the head refusing this process's token (or none)."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__name__ == "AuthenticationError" or "InvalidAuthToken" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def auth_reason(environ: Mapping[str, str], home: Path | None = None) -> str:
    """Why a head that requires token authentication refused this process, and what to do."""
    fix = "set RAY_AUTH_TOKEN to the head's token (`ray get-auth-token` on the head)"
    mode = environ.get("RAY_AUTH_MODE", "").strip().lower()
    source = token_source(environ, home)
    if mode and mode != "token":
        return f"the head requires token authentication and RAY_AUTH_MODE is {mode!r}; unset it and {fix}"
    if source is None:
        return (
            "the head requires token authentication and no token was found (RAY_AUTH_TOKEN, "
            f"RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token); {fix}"
        )
    return f"the head refused the token from {source} (token authentication); {fix}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a ``host:port`` GCS address; ``None`` for ``auto``, ``ray://`` and the like."""
    if "://" in address or ":" not in address:
        return None
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        return None


def _check_reachable(address: str, origin: str) -> None:
    host_port = _host_port(address)
    if host_port is None:
        return
    try:
        with socket.create_connection(host_port, timeout=_REACH_TIMEOUT_S):
            pass
    except socket.gaierror:
        raise ClusterError(failure_line(address, origin, f"unknown host {host_port[0]!r}")) from None
    except ConnectionRefusedError:
        raise ClusterError(
            failure_line(address, origin, "nothing listens there (connection refused)")
        ) from None
    except OSError as exc:  # timeout, no route to host, ...
        raise ClusterError(failure_line(address, origin, f"no answer ({exc or 'timed out'})")) from None


def _probe_gcs(address: str) -> BaseException | None:
    """What the head's GCS at ``address`` answers this process: ``None`` when it accepts it,
    else the error (an auth refusal at once; about 40 s for a port where no GCS answers)."""
    try:
        from ray._raylet import GcsClient
    except ImportError:  # a Ray without this client: leave every check to ray.init
        return None
    try:
        with _quiet_stderr():
            GcsClient(address=address)
    except Exception as exc:
        return exc
    return None


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Silence file descriptor 2 for a moment: Ray's C++ client logs a refused probe as a
    warning ("Authentication token is missing or incorrect") just before this module sends the
    token and connects, which would read as a failure."""
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _enable_token_auth() -> None:
    """``RAY_AUTH_MODE=token`` for this process (and what it starts), as ``ray start`` does."""
    os.environ["RAY_AUTH_MODE"] = "token"
    try:
        from ray._raylet import Config as RayConfig

        RayConfig.initialize("")  # Ray caches its config: re-read the environment
    except (ImportError, AttributeError):
        pass


def _check_head(address: str, origin: str) -> None:
    """Ask the head at ``address`` whether it accepts this process before ``ray.init`` (which
    retries for minutes): turn token mode on when it wants a token and one is available, and
    fail in one line when it still refuses or no Ray head answers."""
    if _host_port(address) is None:
        return
    error = _probe_gcs(address)
    if error is not None and is_auth_error(error):
        source = token_source(os.environ)
        if "RAY_AUTH_MODE" not in os.environ and source is not None:
            _enable_token_auth()
            error = _probe_gcs(address)
            if error is None:
                logger.info(
                    "the Ray cluster at %s uses token authentication: sending the token from %s",
                    address,
                    source,
                )
                return
        if error is not None and is_auth_error(error):
            raise ClusterError(failure_line(address, origin, auth_reason(os.environ), unreachable=False))
    if error is not None:
        raise ClusterError(failure_line(address, origin, f"no Ray head answers there ({_first_line(error)})"))


def check_resources(config: Config, nodes: list[dict[str, Any]], address: str) -> None:
    """Fail (one line) when ``cluster.node_num`` / ``cluster.gpu_per_node`` ask for more than the
    cluster's alive ``nodes`` (``ray.nodes()``) have: Ray would leave the actors pending for ever.
    Warn when ``mode: colocate`` meets a cluster with more than one GPU (it uses one of them)."""
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    gpus = [float(n.get("Resources", {}).get("GPU", 0)) for n in alive]
    want_nodes, want_gpus = config.cluster.node_num, config.cluster.gpu_per_node
    where = f"the Ray cluster at {address}" if address else "the local Ray"
    if want_nodes and len(alive) < want_nodes:
        raise ClusterError(
            f"cluster.node_num is {want_nodes} but {where} has {len(alive)} alive node(s); start Ray on the "
            "others (`ray start --address=<head>:<port>`) or lower cluster.node_num"
        )
    if want_gpus:
        enough = sum(1 for g in gpus if g >= want_gpus)
        if enough < max(want_nodes, 1):
            per_node = ", ".join(f"{g:g}" for g in gpus) or "none"
            raise ClusterError(
                f"cluster.gpu_per_node is {want_gpus} but only {enough} node(s) of {where} have that many "
                f"GPUs (GPUs per node: {per_node}); lower cluster.gpu_per_node or set it to 0 (what Ray reports)"
            )
    if not any(gpus) and not want_gpus:
        _check_cpu_ranks(config, alive, where)
    if config.mode == "colocate" and sum(gpus) > 1:
        logger.warning(
            "mode colocate shares one GPU between trainer and explorer; %s has %g, the others stay "
            "free (mode both uses them all)",
            where,
            sum(gpus),
        )


def _check_cpu_ranks(config: Config, alive: list[dict[str, Any]], where: str) -> None:
    """On a cluster without GPUs the veRL trainer runs one gloo rank per CPU bundle; fail now (one
    line) when no node can ever hold a node's ranks, instead of when the trainer places them."""
    from trinity.placement import runs

    if config.trainer.trainer_type != "verl" or not runs(config, "trainer"):
        return
    from trinity.trainer.verl.config import cpu_trainer_split

    nnodes, ranks = cpu_trainer_split(config)
    cpus = [float(n.get("Resources", {}).get("CPU", 0)) for n in alive]
    if sum(1 for c in cpus if c >= ranks) < nnodes:
        per_node = ", ".join(f"{c:g}" for c in cpus) or "none"
        raise ClusterError(
            f"the veRL trainer runs on CPU here ({where} has no GPU): {nnodes} node(s) x {ranks} rank(s), one "
            f"CPU each (trainer.trainer_config.trainer.nnodes / n_gpus_per_node), but {where} has CPUs per "
            f"node: {per_node}; lower trainer.trainer_config.trainer.n_gpus_per_node"
        )


@contextlib.contextmanager
def _without_head_monitors() -> Iterator[None]:
    """While the job starts a Ray of its own: no autoscaler monitor and no log monitor.

    A single-node Ray started for one job has nothing to autoscale, and with ``log_to_driver``
    off nobody reads what the log monitor forwards. The two Python processes compete with the
    actors' start on a small machine and slow the shutdown (measured on 2 cores: 0.4 s less
    start-up, 1 s less shutdown; ``docs/performance.md``, "What is left in a Trinity step").
    ``ray start`` has flags for both (``--no-monitor``, ``--include-log-monitor false``) but
    ``ray.init`` has none, so this sets the same two fields of the ``RayParams`` that
    ``ray.init`` builds; a Ray without those fields starts both as usual.
    """
    try:
        from ray._private.parameter import RayParams
    except ImportError:
        yield
        return
    default_init = RayParams.__init__
    if not {"no_monitor", "include_log_monitor"} <= set(default_init.__code__.co_varnames):
        yield
        return

    def lean_init(self: Any, *args: Any, **kwargs: Any) -> None:
        default_init(self, *args, **kwargs)
        self.no_monitor = True
        self.include_log_monitor = False

    RayParams.__init__ = lean_init  # type: ignore[method-assign]
    try:
        yield
    finally:
        RayParams.__init__ = default_init  # type: ignore[method-assign]


#: The address every process of a Ray the job starts itself listens on.
LOOPBACK = "127.0.0.1"


@contextlib.contextmanager
def _loopback_node() -> Iterator[None]:
    """While the job starts a Ray of its own: make its node address loopback, so that no process
    of it (GCS, raylet and its object manager, workers, agents) listens on another interface.

    Ray's servers listen on the node's address, but ``ray.init(_node_ip_address="127.0.0.1")``
    alone is not enough: Ray replaces a loopback address by the machine's network address
    (``services.resolve_ip_for_localhost``) unless its "cluster mode" is off, which is what
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` means on Linux (``ray_constants.ENABLE_RAY_CLUSTER``,
    read once when Ray is imported, hence set here on the module too). Both are restored
    afterwards: a Ray started here keeps the address it was given."""
    try:
        from ray._private import ray_constants
    except ImportError:
        yield
        return
    saved_flag = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    saved_env = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved_flag
        if saved_env is None:
            os.environ.pop(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, None)
        else:
            os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = saved_env


def connect(config: Config) -> Any:
    """Connect this process to Ray for ``config``'s job (see the module docstring); return ``ray``.

    Raises :class:`ClusterError` (one line) when the named cluster cannot be used.
    """
    import ray

    address, origin = resolve_address(config.cluster.ray_address, os.environ)
    if ray.is_initialized():
        # A later stage of the same job on the Ray its first stage started (see
        # :func:`end_stage`): what this stage asks for is checked again.
        check_resources(config, ray.nodes(), address or "")
        return ray
    runtime_env = {"env_vars": travelling_env(os.environ)}
    if address is None:
        # No cluster named: start our own. Probing for "any running cluster" can latch onto a
        # stale or dying local one (its session file outlives it), so that is opt-in
        # (RAY_ADDRESS=auto).
        # Ray's processes started here inherit this environment, so the variables travel
        # without a runtime_env. A runtime_env would also make Ray start a fresh worker for each
        # actor instead of the ones it started with the node (measured: ~1 s less start-up).
        for key, value in runtime_env["env_vars"].items():
            os.environ.setdefault(key, value)
        # Ray starts its workers at niceness +15, so on a machine where anything else runs (a
        # laptop, CI, a second job) the actors, which do all of the job's work, are starved
        # first. Workers of a Ray the job starts run at the launching process's priority
        # instead. Ray adds the value to the niceness its processes inherit from this one: set
        # RAY_worker_niceness to lower the workers' priority by that much.
        os.environ.setdefault("RAY_worker_niceness", "0")
        if "RAY_AUTH_MODE" not in os.environ:
            # What Ray does for a Ray it starts (token authentication, a token made if there is
            # none), chosen explicitly so Ray does not warn about it (with a link) on every start.
            _enable_token_auth()
        with _without_head_monitors(), _loopback_node():
            ray.init(
                address="local",
                # Reachable from this machine only: nothing outside needs a job's own Ray.
                _node_ip_address=LOOPBACK,
                num_cpus=max(os.cpu_count() or 1, 2),
                namespace=config.ray_namespace,
                include_dashboard=False,
                log_to_driver=False,
                # Ray's start-up INFO lines ("Started a local Ray instance", ...) say nothing the
                # job's own lines do not; its warnings and errors still print.
                logging_level=logging.WARNING,
            )
    else:
        _check_reachable(address, origin)
        _check_head(address, origin)
        try:
            ray.init(
                address=address,
                namespace=config.ray_namespace,
                runtime_env=runtime_env,
                log_to_driver=False,
                logging_level=logging.WARNING,  # the job says which cluster it joined (below)
            )
        except Exception as exc:  # ConnectionError, RuntimeError, AuthenticationError, ValueError, ...
            if is_auth_error(exc):
                line = failure_line(address, origin, auth_reason(os.environ), unreachable=False)
            else:
                line = failure_line(address, origin, _first_line(exc))
            raise ClusterError(line) from None
        logger.info("joined the Ray cluster at %s (namespace %s)", address, config.ray_namespace)
    try:
        check_resources(config, ray.nodes(), address or "")
    except ClusterError:
        ray.shutdown()  # disconnects; a cluster this job joined keeps running
        raise
    return ray


def end_stage(
    ray: Any, config: Config, more_stages: bool, actor_names: Sequence[tuple[str, str]] = ()
) -> None:
    """What a stage leaves on Ray when it ends (its explorer and trainer actors are already
    killed, and whatever they owned with them, or kept for the next stage: those own nothing
    outside their process, :mod:`trinity.stage_actors`).

    A job that joined a cluster disconnects after each stage, as it always has (the cluster
    keeps running; the next stage connects again). A job on a Ray of its own keeps that Ray for
    its next stage (starting a local Ray takes seconds: a 15-stage job spent about a third of its
    time on it) and removes what would outlive the stage instead: the detached queue actor of its
    experience buffer (a stage's rows are not the next stage's; any SQL mirror keeps them) and
    the placement groups its actors made (vLLM engines, veRL workers), which Ray scopes to the
    driver, not to the actor that made them. ``actor_names``: ``(name, namespace)`` of the
    stage's killed actors, waited for until Ray has let go of their names (a next stage in the
    same namespace takes them again). After the last stage, or when ``more_stages`` is false,
    the Ray is shut down.
    """
    from trinity.config.resolve import joins_cluster

    if not more_stages or joins_cluster(config):
        ray.shutdown()
        return
    exp = config.buffer.trainer_input.experience_buffer
    if exp is not None and exp.storage_type == "queue":
        from trinity.buffer.queue import kill_queue_actor

        kill_queue_actor(exp.name or "experience", exp.ray_namespace)
    remove_placement_groups(ray)
    wait_until_names_free(ray, actor_names)


#: How long a stage's end waits for Ray to let go of its killed actors' names.
_KILL_WAIT_S = 30.0


def wait_until_names_free(ray: Any, actor_names: Sequence[tuple[str, str]]) -> None:
    """Wait (up to :data:`_KILL_WAIT_S` in all) until Ray has let go of the names of killed
    actors, given as ``(name, namespace)``: an actor started under a name still taken fails."""
    deadline = time.monotonic() + _KILL_WAIT_S
    for name, namespace in actor_names:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(name, namespace=namespace)
            except ValueError:
                break  # gone, its name free
            time.sleep(0.05)


def remove_placement_groups(ray: Any) -> int:
    """Remove every placement group still alive on this process's Ray (a Ray of the job's own:
    they are all the job's). Returns how many were removed."""
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    removed = 0
    for group_id, info in ray.util.placement_group_table().items():
        if info.get("state") == "REMOVED":
            continue
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(group_id))))
        removed += 1
    return removed
