"""``trinity debug``: run the configured workflow on a few tasks, in this process.

No Ray, no trainer, no experience buffer: the rollout model is loaded here (the configured
engine), the first ``--num-tasks`` tasks of the training tasksets are run one by one, and
each Experience's prompt, response and reward is printed. ``--output-file`` writes the
Experiences as JSON lines. A workflow error is printed with its full traceback.

The CLI attaches :data:`debug` to the ``trinity`` group; heavy imports happen inside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def experience_to_json(exp: Any) -> str:
    """One JSON line for an Experience (tensors as lists)."""
    return json.dumps(exp.to_dict(), default=_jsonable)


@click.command("debug")
@click.option("--config", "config_path", required=True, type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--module",
    type=click.Choice(["workflow"]),
    default="workflow",
    show_default=True,
    help="What to debug (only workflows for now).",
)
@click.option(
    "--output-file", type=click.Path(dir_okay=False, writable=True), help="Write Experiences here (jsonl)."
)
@click.option(
    "--plugin-dir", multiple=True, type=click.Path(exists=True, file_okay=False), help="Extra plugin folder."
)
@click.option("--num-tasks", default=2, show_default=True, type=click.IntRange(min=1), help="Tasks to run.")
def debug(
    config_path: str, module: str, output_file: str | None, plugin_dir: tuple[str, ...], num_tasks: int
) -> None:
    """Run the configured workflow on a few tasks with the configured model (one process)."""
    import asyncio

    from trinity.buffer.factory import get_taskset_reader
    from trinity.buffer.taskset import TasksetError
    from trinity.config import ConfigError, load_config
    from trinity.explorer.engines import create_engines
    from trinity.explorer.model_wrapper import model_wrappers_for
    from trinity.explorer.runner import WorkflowRunner, task_id
    from trinity.plugins import add_plugin_dirs

    if plugin_dir:
        add_plugin_dirs(plugin_dir)
    try:
        config = load_config(config_path)
        tasksets = config.buffer.explorer_input.tasksets
        if not tasksets:
            raise click.UsageError(
                f"{config_path}: no training taskset (buffer.explorer_input.tasksets) to debug on"
            )
        reader = get_taskset_reader(tasksets, config.buffer)  # validates workflows before loading the model
        tasks = reader.read_batch(num_tasks)
    except (ConfigError, TasksetError) as exc:
        raise click.ClickException(str(exc)) from None

    rollout = config.explorer.rollout_model.model_copy(update={"engine_num": 1})
    click.echo(f"loading {rollout.model_path} ({rollout.engine_type} engine) ...")
    [model] = model_wrappers_for(rollout, create_engines(rollout), name="rollout")
    auxiliary = []  # one engine per auxiliary model (a judge, ...), as the workflow sees them
    for i, aux in enumerate(config.explorer.auxiliary_models):
        aux = aux.model_copy(update={"engine_num": 1})
        click.echo(f"loading auxiliary model {aux.model_path} ({aux.engine_type} engine) ...")
        auxiliary += model_wrappers_for(aux, create_engines(aux), name=aux.name or f"auxiliary_{i}")
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
