"""The ``trinity`` command.

Every subcommand comes through the ``register_commands`` hook (kind ``command``): the core
registers its own here (:func:`register_commands`, a core plugin of :mod:`trinity.plugins`),
plugins add theirs (trinity-studio's ``trinity studio``). Kept light on purpose: ``trinity --help``
and ``trinity plugins`` import no torch, ray or transformers. The heavier core commands
(``debug``, ``buffer``, ``log``, ``convert``) are :class:`LazyCommand` objects, imported only
when invoked, and ``run`` imports the launcher only after the config has been validated.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import click

from trinity import __version__, hookimpl
from trinity.hookspecs import RegisterCommand

EXIT_CONFIG_ERROR = 2
EXIT_PLUGIN_ERROR = 3

#: Commands that first-party distributions register, by name: ``trinity <name>`` without the
#: distribution says how to install it.
COMMAND_PROVIDERS = {"studio": "trinity-studio"}


class LazyCommand(click.Command):
    """A command registered by name and import path (``"module:attribute"``), imported only when
    it runs, so ``trinity --help`` lists it (with ``short_help``) without loading its module.

    Register it like any command: ``register("debug", LazyCommand("debug", "pkg.mod:debug",
    "Try a workflow."))``. An :class:`ImportError` (a missing optional dependency) becomes one
    line naming the command.
    """

    def __init__(self, name: str, import_path: str, short_help: str) -> None:
        super().__init__(name, short_help=short_help, help=short_help)
        self.import_path = import_path

    def load(self) -> click.Command:
        """The real command (its module imported now)."""
        module, _, attr = self.import_path.partition(":")
        try:
            command = getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise click.ClickException(f"'trinity {self.name}' is unavailable: {exc}") from exc
        if not isinstance(command, click.Command):
            raise click.ClickException(f"'trinity {self.name}': {self.import_path} is not a click command")
        return command

    def make_context(self, info_name, args, parent=None, **extra):  # type: ignore[no-untyped-def]
        # Run on its own (not through the `trinity` group, which resolves it first): the real
        # command parses the arguments, and the context it makes invokes it.
        return self.load().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        return ctx.command.invoke(ctx)  # the real command's context (make_context above)


def _registered_commands() -> dict[str, click.Command]:
    """``{name: command}`` of every loaded plugin (the core's own included)."""
    from trinity.plugins import get_component, list_components

    return {name: get_component("command", name) for name in list_components("command")}


def _missing_command_error(name: str) -> click.ClickException | None:
    """Why a first-party command is not there (its distribution is not installed, failed to
    load, or is blocked by the allow/deny lists), as one line; ``None`` for any other name."""
    from trinity.plugins import install_hint, plugin_infos

    distribution = COMMAND_PROVIDERS.get(name)
    if distribution is None:
        return None
    for info in plugin_infos(include_disabled=True):
        if info.name.split(":")[0] != distribution:
            continue
        if info.disabled:
            return click.ClickException(
                f"'trinity {name}' comes from {distribution}, which is {info.disabled}"
            )
        if info.error:
            return click.ClickException(
                f"'trinity {name}' comes from {distribution}, which failed to load: {info.error}"
            )
    return click.ClickException(f"'trinity {name}' needs {distribution}: {install_hint(distribution)}")


class _Group(click.Group):
    """The ``trinity`` group: its commands are the ``command`` components of the plugin
    manager; a :class:`LazyCommand` is imported when invoked, not for ``--help``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_registered_commands()})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        command = super().get_command(ctx, name) or _registered_commands().get(name)
        if isinstance(command, LazyCommand):
            return command.load()
        if command is None:
            error = _missing_command_error(name)
            if error is not None:
                raise error
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        registered = _registered_commands()
        rows = []
        for name in self.list_commands(ctx):
            command = super().get_command(ctx, name) or registered.get(name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _version_message() -> str:
    from trinity.plugins import plugin_infos

    lines = [f"trinity-core {__version__}"]
    for info in plugin_infos():
        status = " (failed to load)" if info.error else ""
        lines.append(f"  {info.name} {info.version or ''}{status}".rstrip())
    return "\n".join(lines)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        click.echo(_version_message())
        ctx.exit()


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the registered plugins.",
)
def cli() -> None:
    """Trinity: reinforcement fine-tuning for LLMs (minimal core + plugins)."""


@click.command()
@click.option(
    "--all",
    "show_all",
    is_flag=True,
    help="Also list plugins blocked by TRINITY_LOAD_PLUGINS/TRINITY_DISABLE_PLUGINS.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
@click.option(
    "--plugin-dir",
    "plugin_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Also load *.py plugins from this folder (repeatable).",
)
def plugins(show_all: bool, as_json: bool, plugin_dirs: tuple[str, ...]) -> None:
    """List installed plugins, their hooks and the components they register."""
    from trinity.plugins import PluginError, add_plugin_dirs, install_hint, plugin_infos

    try:
        add_plugin_dirs(plugin_dirs)
    except PluginError as exc:
        raise click.ClickException(str(exc)) from exc
    infos = plugin_infos(include_disabled=show_all)
    if as_json:
        rows = []
        for info in infos:
            row = info.to_json()
            if show_all:
                row["disabled"] = info.disabled
            rows.append(row)
        click.echo(json.dumps(rows, indent=2))
        return
    if not infos:
        click.echo(
            "No Trinity plugins installed. Try: "
            + install_hint("trinity-plugins-algos", "trinity-plugins-math")
        )
        return
    for info in infos:
        header = f"{info.name} {info.version or ''}".rstrip()
        if info.disabled:
            click.echo(f"{header}  [disabled: {info.disabled}]")
            continue
        click.echo(header)
        if info.error:
            click.secho(f"  error: {info.error}", fg="red")
            continue
        click.echo(f"  hooks: {', '.join(info.hooks) or '(none)'}")
        for kind, names in sorted(info.components.items()):
            click.echo(f"  {kind}: {', '.join(sorted(names))}")


def _load_plugins_or_exit(plugin_dirs: tuple[str, ...]) -> None:
    from trinity.plugins import PluginError, add_plugin_dirs, check_plugins

    try:
        add_plugin_dirs(plugin_dirs)
        check_plugins()
    except PluginError as exc:
        click.secho(f"Error: {exc}", fg="red", err=True)
        sys.exit(EXIT_PLUGIN_ERROR)


def _load_config_or_exit(config_path: str):
    from trinity.config import ConfigError, load_config

    try:
        return load_config(config_path)
    except ConfigError as exc:
        click.secho(f"Error: {exc}", fg="red", err=True)
        sys.exit(EXIT_CONFIG_ERROR)


def _check_paths_or_exit(config, *, network: bool) -> None:
    """The models and files the job reads are there (:mod:`trinity.config.paths`) and the data
    processor's operators get what they need from the job (:mod:`trinity.data.checks`), checked
    before Ray starts: otherwise one line and exit 2, like any config error."""
    from trinity.config import ConfigError, stage_configs
    from trinity.config.paths import check_paths
    from trinity.data.checks import check_operator_needs

    names = [stage.stage_name for stage in config.stages]
    try:
        for index, stage in enumerate(stage_configs(config)):
            try:
                # A later stage starts from the previous stage's weights, not model.model_path.
                check_operator_needs(stage)
                check_paths(stage, network=network, model_path=index == 0)
            except ConfigError as exc:
                if not names:
                    raise
                raise ConfigError(f"in stage {names[index]!r}: {exc.message}", key=exc.key) from None
    except ConfigError as exc:
        click.secho(f"Error: {exc.with_file(config._file)}", fg="red", err=True)
        sys.exit(EXIT_CONFIG_ERROR)


@click.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="The job's YAML config.",
)
@click.option(
    "--plugin-dir",
    "plugin_dirs",
    multiple=True,
    type=click.Path(file_okay=False),
    help="Load *.py plugins from this folder (repeatable).",
)
@click.option("--dry-run", is_flag=True, help="Validate and print the resolved config; start nothing.")
def run(config_path: str, plugin_dirs: tuple[str, ...], dry_run: bool) -> None:
    """Run an RFT job described by a Trinity-RFT YAML config."""
    if not Path(config_path).is_file():
        click.secho(f"Error: config file {config_path} does not exist", fg="red", err=True)
        sys.exit(EXIT_CONFIG_ERROR)
    _load_plugins_or_exit(plugin_dirs)
    config = _load_config_or_exit(config_path)
    # The hub is asked whether it has a model only when the job starts (a dry run stays offline).
    _check_paths_or_exit(config, network=not dry_run)
    if dry_run:
        click.echo(config.to_yaml(), nl=False)
        return
    from trinity.launcher import run as launch

    sys.exit(launch(config))


@hookimpl
def register_commands(register: RegisterCommand) -> None:
    """The core's own commands, registered like any plugin's."""
    register("run", run)
    register("plugins", plugins)
    register(
        "debug",
        LazyCommand(
            "debug",
            "trinity.serving.debug:debug",
            "Try a workflow on a few tasks, serve the job's models, or view experiences.",
        ),
    )
    register(
        "buffer", LazyCommand("buffer", "trinity.buffer.cli:buffer_group", "Inspect experience buffers.")
    )
    register(
        "log", LazyCommand("log", "trinity.logs:log_command", "Print a run's actor logs merged by time.")
    )
    register(
        "convert",
        LazyCommand(
            "convert",
            "trinity.trainer.convert:convert_command",
            "Convert a veRL FSDP checkpoint to a Hugging Face model folder.",
        ),
    )


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="trinity")


if __name__ == "__main__":
    # `python -m trinity.cli`: run the group of the module `trinity.cli`, whose classes the
    # registered commands share (this __main__ copy has its own LazyCommand class).
    from trinity.cli import main as _main

    _main()
