"""What every configurable algorithm component shares: ``default_args()``."""

from __future__ import annotations

import inspect
from typing import Any


class Component:
    """Base of configurable components (advantage, losses, KL, entropy, sample strategies).

    ``default_args()`` returns the keyword arguments ``__init__`` is built with when the config
    gives none; the config layer merges the user's ``*_args`` over it. By default it is read off
    the ``__init__`` signature, so a subclass only overrides it when the defaults are computed.
    """

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        """Default keyword arguments for ``__init__``."""
        args: dict[str, Any] = {}
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name == "self" or param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                continue
            if param.default is not inspect.Parameter.empty:
                args[name] = param.default
        return args
