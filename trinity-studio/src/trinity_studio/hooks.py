"""Hook implementation of trinity-studio (entry point `trinity` → `trinity_studio.hooks`): the
``trinity studio`` command.

Light on purpose: ``trinity --help`` and ``trinity plugins`` import this module, and the command
imports FastAPI and the application only when it runs.
"""

from __future__ import annotations

from trinity import hookimpl
from trinity.hookspecs import RegisterCommand
from trinity_studio.cli import studio


@hookimpl
def register_commands(register: RegisterCommand) -> None:
    register("studio", studio)
