"""Trinity: reinforcement fine-tuning for LLMs, as a minimal core plus plugins.

The top-level package stays import-light: it exposes the pluggy ``hookimpl`` marker plugin
authors decorate their hook functions with, and the version. Everything heavy (torch, ray,
transformers) is imported lazily by the modules that need it.
"""

from trinity.hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = ["__version__", "hookimpl"]
