"""``trinity debug``: try a job's pieces in one process, without Ray, a trainer or a buffer.

Modules (``--module``):

- ``workflow`` (default): the first ``--num-tasks`` tasks of the training tasksets are run one by
  one with the configured workflow; each Experience's prompt, response and reward is printed,
  ``--output-file`` writes the Experiences as JSON lines, a workflow error is printed with its
  full traceback. The rollout model (and the auxiliary models) are loaded here with the
  configured engine, unless ``inference_model`` serves them for this job (below; ``--no-server``
  loads them here anyway).
- ``inference_model``: loads the rollout model and the auxiliary models once and serves them on
  the OpenAI-compatible API on 127.0.0.1 until Ctrl-C (SIGINT) or SIGTERM. Their addresses go to
  ``<checkpoint_job_dir>/debug/inference_model.json``, where ``workflow`` runs in another
  terminal find them: editing and rerunning a workflow then takes seconds, not a model load.
- ``viewer``: opens the studio's experience page on an ``--output-file`` of a workflow run.

The CLI attaches :data:`debug` to the ``trinity`` group; heavy imports happen inside it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from trinity.config import Config

#: The file ``inference_model`` writes under the job's folder.
SERVER_FILE = Path("debug") / "inference_model.json"
DEFAULT_VIEWER_PORT = 8080


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def experience_to_json(exp: Any) -> str:
    """One JSON line for an Experience (tensors as lists)."""
    return json.dumps(exp.to_dict(), default=_jsonable)


def server_file(config: Config) -> Path:
    """Where ``inference_model`` writes its addresses for the job of ``config``."""
    return Path(config.checkpoint_job_dir) / SERVER_FILE


@click.command("debug")
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(exists=True, dir_okay=False),
    help="The job's config (workflow, inference_model).",
)
@click.option(
    "--module",
    type=click.Choice(["workflow", "inference_model", "viewer"]),
    default="workflow",
    show_default=True,
    help="workflow: run it on a few tasks; inference_model: serve the models for workflow runs in "
    "another terminal; viewer: browse an --output-file in the studio.",
)
@click.option(
    "--output-file",
    type=click.Path(dir_okay=False),
    help="workflow: write Experiences here (jsonl); viewer: the file to show.",
)
@click.option(
    "--plugin-dir", multiple=True, type=click.Path(exists=True, file_okay=False), help="Extra plugin folder."
)
@click.option("--num-tasks", default=2, show_default=True, type=click.IntRange(min=1), help="Tasks to run.")
@click.option(
    "--port",
    type=click.IntRange(min=0, max=65535),
    help="inference_model: the rollout model's port (default: explorer.rollout_model.base_port, "
    f"else a free one); viewer: the studio's port (default {DEFAULT_VIEWER_PORT}).",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="viewer: the interface to listen on.")
@click.option(
    "--no-server",
    is_flag=True,
    help="workflow: load the models here even when inference_model serves them.",
)
def debug(
    config_path: str | None,
    module: str,
    output_file: str | None,
    plugin_dir: tuple[str, ...],
    num_tasks: int,
    port: int | None,
    host: str,
    no_server: bool,
) -> None:
    """Try a job's workflow on a few tasks (one process), serve its models, or view the result."""
    if module == "viewer":
        _viewer(output_file, host, DEFAULT_VIEWER_PORT if port is None else port)
        return
    if config_path is None:
        raise click.UsageError(f"--module {module} needs the job's config: -c/--config PATH")
    if plugin_dir:
        from trinity.plugins import add_plugin_dirs

        add_plugin_dirs(plugin_dir)
    if module == "inference_model":
        _serve(_load(config_path), config_path, port)
    else:
        _workflow(config_path, output_file, num_tasks, no_server)


def _load(config_path: str) -> Config:
    from trinity.config import ConfigError, load_config

    try:
        return load_config(config_path)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None


# -- workflow ------------------------------------------------------------------------------


def _workflow(config_path: str, output_file: str | None, num_tasks: int, no_server: bool) -> None:
    import asyncio

    from trinity.buffer.factory import get_taskset_reader
    from trinity.buffer.taskset import TasksetError
    from trinity.config import ConfigError
    from trinity.explorer.runner import WorkflowRunner, task_id

    config = _load(config_path)
    try:
        tasksets = config.buffer.explorer_input.tasksets
        if not tasksets:
            raise click.UsageError(
                f"{config_path}: no training taskset (buffer.explorer_input.tasksets) to debug on"
            )
        reader = get_taskset_reader(tasksets, config.buffer)  # validates workflows before loading the model
        tasks = reader.read_batch(num_tasks)
    except (ConfigError, TasksetError) as exc:
        raise click.ClickException(str(exc)) from None

    served = None if no_server else _served_models(config)
    model, auxiliary = served if served is not None else _load_models(config)
    runner = WorkflowRunner(model, auxiliary, max_timeout=config.explorer.max_timeout, max_retry_times=0)

    written = failed = 0
    out = Path(output_file).open("w") if output_file else None  # noqa: SIM115 - closed in finally
    try:
        for task in tasks:
            click.secho(f"=== task {task_id(task)} ({task.workflow.__name__}) ===", bold=True)
            result = asyncio.run(runner.run_task(task))
            if not result.ok:
                failed += 1
                click.secho(f"workflow failed:\n{result.error}", fg="red")
                continue
            for exp in result.experiences:
                click.echo(f"--- run {exp.eid.run} step {exp.eid.step}")
                click.echo(f"prompt:   {exp.prompt_text!r}")
                click.echo(f"response: {exp.response_text!r}")
                click.echo(f"reward:   {exp.reward}  {exp.info.get('finish_reason', '')}")
                if out is not None:
                    out.write(experience_to_json(exp) + "\n")
                    written += 1
    finally:
        if out is not None:
            out.close()
        for wrapper in [model, *auxiliary]:
            wrapper.close()
    if output_file:
        click.echo(f"wrote {written} experience(s) to {output_file}")
    if failed:
        raise click.ClickException(f"{failed} of {len(tasks)} task(s) failed (tracebacks above)")


def _load_models(config: Config) -> tuple[Any, list[Any]]:
    """The rollout model and the auxiliary models, loaded here with their engines."""
    from trinity.explorer.model_wrapper import model_wrappers_for
    from trinity.rollout import create_engines

    rollout = config.explorer.rollout_model.model_copy(update={"engine_num": 1})
    click.echo(f"loading {rollout.model_path} ({rollout.engine_type} engine) ...")
    [model] = model_wrappers_for(rollout, create_engines(rollout), name="rollout")
    auxiliary = []  # one engine per auxiliary model (a judge, ...), as the workflow sees them
    for i, aux in enumerate(config.explorer.auxiliary_models):
        aux = aux.model_copy(update={"engine_num": 1})
        click.echo(f"loading auxiliary model {aux.model_path} ({aux.engine_type} engine) ...")
        auxiliary += model_wrappers_for(aux, create_engines(aux), name=aux.name or f"auxiliary_{i}")
    return model, auxiliary


def _served_models(config: Config) -> tuple[Any, list[Any]] | None:
    """Wrappers of the models ``inference_model`` serves for this job, or ``None`` (after one
    line saying why, when its file is there but cannot be used)."""
    from trinity.serving.remote_model import RemoteModelError, RemoteModelWrapper, probe

    path = server_file(config)
    if not path.is_file():
        return None
    try:
        served = json.loads(path.read_text())
        entries = [served["rollout"], *served.get("auxiliary_models", [])]
        url = served["rollout"]["url"]
    except (OSError, ValueError, KeyError, TypeError):
        click.echo(f"{path} is not an inference_model address file; loading the model here")
        return None
    configs = [config.explorer.rollout_model, *config.explorer.auxiliary_models]
    if probe(url, configs[0].api_key) is None:
        click.echo(
            f"the inference model in {path} (pid {served.get('pid')}, {url}) does not answer; loading the model here"
        )
        return None
    wanted = [str(c.model_path) for c in configs]
    if [str(e.get("model_path")) for e in entries] != wanted:
        click.echo(
            f"the inference model at {url} serves {[e.get('model_path') for e in entries]}, not this config's "
            f"{wanted}; loading the model here"
        )
        return None
    try:
        wrappers = [
            RemoteModelWrapper(
                e["url"],
                name=e.get("name") or "rollout",
                model_path=e.get("model_path"),
                api_key=c.api_key,
                enable_history=c.enable_history,
                timeout=config.explorer.max_timeout,
            )
            for e, c in zip(entries, configs)
        ]
    except RemoteModelError as exc:
        click.echo(f"{exc}; loading the model here")
        return None
    click.echo(f"using the inference model served at {url} (from trinity debug --module inference_model)")
    return wrappers[0], wrappers[1:]


# -- inference_model -----------------------------------------------------------------------


def _serve(config: Config, config_path: str, port: int | None) -> None:
    import signal
    import threading

    from trinity.serving.openai_api.server import OpenAIServer
    from trinity.serving.remote_model import build_debug_app, probe

    path = server_file(config)
    if path.is_file():  # another inference_model of this job still serving?
        try:
            other = json.loads(path.read_text())
            url, pid = other["rollout"]["url"], other.get("pid")
        except (OSError, ValueError, KeyError, TypeError):
            url = pid = None
        if url and probe(url, config.explorer.rollout_model.api_key) is not None:
            raise click.ClickException(
                f"an inference model is already served for this job at {url} (pid {pid}, {path}); stop it first"
            )

    rollout = config.explorer.rollout_model
    if port is None:
        port = rollout.base_port or 0
    # The servers are started here, on the ports chosen here, with the debug routes.
    plain = {"enable_openai_api": False, "base_port": None}
    models, aux_ports = _load_models_for_serving(config, plain)
    servers: list[OpenAIServer] = []
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    written = False
    try:
        for model, wanted_port in zip(models, [port, *aux_ports]):
            try:
                server = OpenAIServer(model, port=wanted_port, app=build_debug_app(model))
            except OSError as exc:
                raise click.ClickException(
                    f"cannot serve {model.name!r} on 127.0.0.1:{wanted_port}: {exc.strerror or exc}; "
                    "choose another --port (or leave it unset for a free one)"
                ) from None
            server.start()
            servers.append(server)
            click.echo(f"serving {model.model_path} at {server.base_url} (Ctrl-C to stop)")
        entries = [
            {"name": m.name, "model_path": str(m.model_path), "url": s.base_url}
            for m, s in zip(models, servers)
        ]
        address = {
            "pid": os.getpid(),
            "config": str(Path(config_path).resolve()),
            "rollout": entries[0],
            "auxiliary_models": entries[1:],
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(address, indent=2) + "\n")
        tmp.replace(path)  # readers never see half a file
        written = True
        click.echo(
            f"wrote {path}; run `trinity debug -c {config_path} --module workflow` in another terminal"
        )
        while not stop.wait(0.5):
            pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if written:
            _remove_own(path)
        for server in servers:
            server.stop()
        for model in models:
            getattr(model.engine, "shutdown", lambda: None)()
    click.echo("stopped")


def _load_models_for_serving(config: Config, plain: dict[str, Any]) -> tuple[list[Any], list[int]]:
    """The rollout and auxiliary wrappers (servers not started), and the auxiliary models' ports."""
    from trinity.explorer.model_wrapper import model_wrappers_for
    from trinity.rollout import create_engines

    rollout = config.explorer.rollout_model.model_copy(update={"engine_num": 1, **plain})
    click.echo(f"loading {rollout.model_path} ({rollout.engine_type} engine) ...")
    models = model_wrappers_for(rollout, create_engines(rollout), name="rollout")
    ports = []
    for i, aux in enumerate(config.explorer.auxiliary_models):
        ports.append(aux.base_port or 0)
        aux = aux.model_copy(update={"engine_num": 1, **plain})
        click.echo(f"loading auxiliary model {aux.model_path} ({aux.engine_type} engine) ...")
        models += model_wrappers_for(aux, create_engines(aux), name=aux.name or f"auxiliary_{i}")
    return models, ports


def _remove_own(path: Path) -> None:
    """Remove the address file if it is still this process's (not a later server's)."""
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


# -- viewer --------------------------------------------------------------------------------


def _viewer(output_file: str | None, host: str, port: int) -> None:
    if not output_file:
        raise click.UsageError(
            "--module viewer needs the file to show: --output-file PATH (a workflow run's jsonl)"
        )
    path = Path(output_file)
    if not path.is_file():
        raise click.ClickException(f"{path}: no such file (write one with --module workflow --output-file)")
    import importlib

    try:
        # trinity-studio, a distribution of its own (import_module: the tests put a stand-in in
        # sys.modules).
        studio = importlib.import_module("trinity_studio")
    except ImportError:
        from trinity.plugins import install_hint

        click.echo(f"the viewer needs the studio: {install_hint('trinity-studio')}", err=True)
        click.get_current_context().exit(1)
    studio.launch(host=host, port=port, experience_file=str(path))
