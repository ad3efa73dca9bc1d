"""The ``register_commands`` hook: every ``trinity`` subcommand, the core's own included, is a
``command`` component; a first-party command whose distribution is missing says how to get it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import click
import pytest
from click.testing import CliRunner

from trinity import hookimpl
from trinity.cli import LazyCommand, cli
from trinity.plugins import PluginError, get_component, install_hint, list_components, plugin_infos
from trinity.testing import check_component

CORE_COMMANDS = {"run", "plugins", "debug", "buffer", "log", "convert"}


class _Plugin:
    """A plugin object registering ``commands`` (``{name: command}``)."""

    def __init__(self, commands: dict[str, object]) -> None:
        self.commands = commands

    @hookimpl
    def register_commands(self, register):
        for name, command in self.commands.items():
            register(name, command)


@click.command()
@click.option("--who", default="world")
def hello(who: str) -> None:
    """Say hello."""
    click.echo(f"hello {who}")


def test_the_core_registers_its_commands_through_the_hook(plugin_manager):
    assert set(list_components("command")) == CORE_COMMANDS
    for name in CORE_COMMANDS:
        assert plugin_manager.component_provider("command", name) == "trinity-core/commands"
    # the core's own hook modules are not listed as plugins
    assert not [i for i in plugin_infos() if "command" in i.components]
    out = CliRunner().invoke(cli, ["--help"]).output
    for name in CORE_COMMANDS:
        assert f"  {name} " in out


def test_core_commands_pass_the_conformance_check(plugin_manager):
    for name in sorted(CORE_COMMANDS):
        check_component("command", get_component("command", name))


def test_a_plugin_command_is_listed_and_runs(plugin_manager):
    info = plugin_manager.register_plugin(_Plugin({"hello": hello}), "hello-plugin")
    assert info.hooks == ["register_commands"] and info.components == {"command": ["hello"]}
    assert "hello    Say hello." in CliRunner().invoke(cli, ["--help"]).output
    result = CliRunner().invoke(cli, ["hello", "--who", "trinity"])
    assert result.exit_code == 0 and result.output == "hello trinity\n"
    table = CliRunner().invoke(cli, ["plugins"]).output
    assert "hello-plugin" in table and "command: hello" in table


def test_a_command_name_taken_by_the_core_is_a_duplicate(plugin_manager):
    with pytest.raises(PluginError, match=r"duplicate command 'run'.*'trinity-core/commands'.*'mine'"):
        plugin_manager.register_plugin(_Plugin({"run": hello}), "mine")
    assert get_component("command", "run") is not hello


def test_a_command_must_be_a_click_command(plugin_manager):
    def not_a_command():
        pass

    with pytest.raises(PluginError, match=r"command 'x' must be an instance of click\.core\.Command"):
        plugin_manager.register_plugin(_Plugin({"x": not_a_command}), "bad")
    with pytest.raises(AssertionError, match=r"must be an instance of click\.core\.Command"):
        check_component("command", hello.callback)


def test_studio_without_trinity_studio_says_how_to_install_it(plugin_manager):
    # no entry points in this manager: as on a machine without trinity-studio
    result = CliRunner().invoke(cli, ["studio", "--root", "x"])
    assert result.exit_code == 1
    hint = install_hint("trinity-studio")
    assert hint.startswith("pip install ") and "trinity-studio" in hint
    assert result.output == f"Error: 'trinity studio' needs trinity-studio: {hint}\n"


def test_an_unknown_command_is_still_clicks_usage_error(plugin_manager):
    result = CliRunner().invoke(cli, ["no-such-command"])
    assert result.exit_code == 2 and "No such command 'no-such-command'" in result.output


def test_a_lazy_command_imports_its_module_only_when_run(tmp_path, monkeypatch):
    (tmp_path / "lazy_cmd_probe.py").write_text(
        textwrap.dedent(
            """
            import click

            @click.command()
            def probe():
                click.echo("probe ran")
            """
        )
    )
    code = textwrap.dedent(
        """
        import sys
        from click.testing import CliRunner
        from trinity import hookimpl
        from trinity.cli import LazyCommand, cli
        from trinity.testing import isolated_plugin_manager

        class Plugin:
            @hookimpl
            def register_commands(self, register):
                register("probe", LazyCommand("probe", "lazy_cmd_probe:probe", "A probe."))
                register("gone", LazyCommand("gone", "lazy_cmd_missing_module:cmd", "Missing."))

        with isolated_plugin_manager() as manager:
            manager.register_plugin(Plugin(), "lazy")
            out = CliRunner().invoke(cli, ["--help"]).output
            assert "probe    A probe." in out, out
            print("before:", "lazy_cmd_probe" in sys.modules)
            print(CliRunner().invoke(cli, ["probe"]).output.strip())
            print("after:", "lazy_cmd_probe" in sys.modules)
            result = CliRunner().invoke(cli, ["gone"])
            print(result.exit_code, result.output.strip())
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "before: False",
        "probe ran",
        "after: True",
        "1 Error: 'trinity gone' is unavailable: No module named 'lazy_cmd_missing_module'",
    ]


def test_lazy_command_loads_the_real_command():
    lazy = LazyCommand("hello", f"{__name__}:hello", "Say hello.")
    assert lazy.load() is hello
    # run on its own, outside the `trinity` group, it is the real command
    result = CliRunner().invoke(lazy, ["--who", "you"])
    assert result.exit_code == 0 and result.output == "hello you\n"
    not_a_command = LazyCommand("x", "trinity.cli:main", "x")
    with pytest.raises(click.ClickException, match=r"trinity\.cli:main is not a click command"):
        not_a_command.load()
