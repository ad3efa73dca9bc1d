"""``ConfigError``: one line saying which file, which key, what is wrong and what would be valid."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration problem, reported as a single line for people.

    ``str(error)`` reads ``<file>: <key>: <problem>`` (file and key only when known), e.g.
    ``grpo.yaml: buffer.batch_size: expected an integer, got 'eight' (str)``.
    """

    def __init__(self, message: str, *, key: str | None = None, file: str | None = None) -> None:
        self.message = message
        self.key = key
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        parts = [p for p in (self.file, self.key) if p]
        return ": ".join([*parts, self.message])

    def with_file(self, file: str | None) -> ConfigError:
        """The same error, attributed to ``file`` (kept if already set)."""
        if file is None or self.file is not None:
            return self
        return ConfigError(self.message, key=self.key, file=file)

    def __str__(self) -> str:
        return self._render()
