"""The ``trinity`` command.

Kept light on purpose: ``trinity --help`` and ``trinity plugins`` import no torch, ray or
transformers. The subcommands in ``_LAZY_COMMANDS`` (``debug``, ``buffer``, ``log``, ``convert``)
are imported only when invoked, and ``run`` imports the launcher only after the config has been
validated.
"""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import click

from trinity import __version__

# name -> (module, attribute, short help); imported only when the subcommand is used.
_LAZY_COMMANDS = {
    "debug": (
        "trinity.explorer.debug",
        "debug",
        "Try a workflow on a few tasks, serve the job's models, or view experiences.",
    ),
    "buffer": ("trinity.buffer.cli", "buffer_group", "Inspect experience buffers."),
    "studio": ("trinity.studio.cli", "studio", "Configure, launch and inspect runs in the browser."),
    "log": ("trinity.logs", "log_command", "Print a run's actor logs merged by time."),
    "convert": (
        "trinity.trainer.convert",
        "convert_command",
        "Convert a veRL FSDP checkpoint to a Hugging Face model folder.",
    ),
}

EXIT_CONFIG_ERROR = 2
EXIT_PLUGIN_ERROR = 3


class _LazyGroup(click.Group):
    """A group whose heavier subcommands are imported only when invoked, not for ``--help``."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *_LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in _LAZY_COMMANDS:
            return super().get_command(ctx, name)
        module, attr, _ = _LAZY_COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), attr)
        except ImportError as exc:
            raise click.ClickException(f"'trinity {name}' is unavailable: {exc}") from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            if name in _LAZY_COMMANDS:
                rows.append((name, _LAZY_COMMANDS[name][2]))
                continue
            command = super().get_command(ctx, name)
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


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
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


@cli.command()
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
    """The models and files the job reads are there (:mod:`trinity.config.paths`), checked
    before Ray starts: otherwise one line and exit 2, like any config error."""
    from trinity.config import ConfigError, stage_configs
    from trinity.config.paths import check_paths

    names = [stage.stage_name for stage in config.stages]
    try:
        for index, stage in enumerate(stage_configs(config)):
            try:
                # A later stage starts from the previous stage's weights, not model.model_path.
                check_paths(stage, network=network, model_path=index == 0)
            except ConfigError as exc:
                if not names:
                    raise
                raise ConfigError(f"in stage {names[index]!r}: {exc.message}", key=exc.key) from None
    except ConfigError as exc:
        click.secho(f"Error: {exc.with_file(config._file)}", fg="red", err=True)
        sys.exit(EXIT_CONFIG_ERROR)


@cli.command()
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


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="trinity")


if __name__ == "__main__":
    main()
