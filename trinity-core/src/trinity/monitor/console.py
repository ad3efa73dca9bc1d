"""Console monitor: a progress bar (step / total, what the stage measures, the last eval, ETA) on
a terminal, one plain line per step otherwise (log files, CI).

The bar is one ``\\r``-refreshed line. While it is up, nothing else may write over it: every other
write to ``sys.stdout`` / ``sys.stderr`` and every logging handler writing to them goes through
:class:`_BarLine`, which clears the bar line first and draws it again below the new output. So a
warning, a log line or the launcher's own lines each print on a line of their own, and the bar
stays the last line. :func:`end_progress_bars` ends the bar (its final state stays on screen)
before a closing line such as the launcher's ``done:``.
"""

from __future__ import annotations

import logging
import shutil
import sys
import threading
import time
from typing import Any, TextIO

from trinity.monitor.base import Monitor, scalar_metrics

# Shown as "reward" / "loss": the first of these names present in a step's metrics (the
# trainer reports critic/score/mean, the explorer rollout/reward_mean).
REWARD_KEYS = ("critic/score/mean", "rollout/reward_mean")
LOSS_KEYS = ("actor/loss", "actor/pg_loss", "actor/sft_loss", "actor/dpo_loss", "critic/vf_loss")
#: What the bar shows by default (RL); train-only algorithms (SFT, DPO) have no reward to show.
RL_FIELDS = ("reward", "loss")
_KEYS = {"reward": REWARD_KEYS, "loss": LOSS_KEYS}
# Per eval taskset: the first of these shown (``eval/<taskset>/<metric>``).
EVAL_METRICS = ("accuracy", "reward_mean")

_CLEAR = "\r\x1b[2K"
_BAR_CELLS = 30
_MIN_BAR_CELLS = 10


def _first(metrics: dict[str, float], keys: tuple[str, ...]) -> float | None:
    return next((metrics[k] for k in keys if k in metrics), None)


def format_eta(seconds: float | None) -> str:
    """``H:MM:SS``, or ``?`` when unknown."""
    if seconds is None:
        return "?"
    seconds = round(seconds)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def eval_results(metrics: dict[str, Any]) -> dict[str, tuple[str, float]]:
    """``{taskset: (metric, value)}`` of the ``eval/<taskset>/<metric>`` scalars in ``metrics``
    (accuracy where there is one, else the mean reward)."""
    values = scalar_metrics(metrics)
    out: dict[str, tuple[str, float]] = {}
    for metric in EVAL_METRICS:
        for key, value in values.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "eval" and parts[2] == metric and parts[1] not in out:
                out[parts[1]] = (metric, value)
    return out


def format_eval(results: dict[str, tuple[str, float]]) -> str:
    """``heldout 42.0% practice 51.0%`` (accuracies as percentages)."""
    return " ".join(
        f"{name} {value:.1%}" if metric == "accuracy" else f"{name} {metric} {value:.4f}"
        for name, (metric, value) in results.items()
    )


class ConsoleMonitor(Monitor):
    """Progress of one role. ``total_steps`` unset shows steps without a total or ETA.

    A bar when ``stream`` is a terminal (or ``use_rich=True``, the name from when the bar was
    drawn by ``rich``); otherwise each ``log`` prints ``[role] step 3/10 reward 0.5000 loss
    0.1234 eta 0:01:02``. ``fields`` says what the bar shows of a step's metrics: ``reward``
    and/or ``loss`` (an SFT stage has no reward: ``("loss",)``). Eval results (``eval/<taskset>
    /accuracy``) are shown from the last eval on, whether they come through :meth:`log` or
    :meth:`log_eval` (the launcher forwards the explorer's evals to the trainer's bar).
    """

    def __init__(
        self,
        role: str = "trainer",
        total_steps: int | None = None,
        stream: TextIO | None = None,
        use_rich: bool | None = None,
        fields: tuple[str, ...] = RL_FIELDS,
    ) -> None:
        super().__init__(role)
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        if isinstance(self.stream, _Guarded):  # another bar is up: draw on the same terminal line
            self.stream = self.stream._stream
        self.use_rich = _isatty(self.stream) if use_rich is None else use_rich
        self.fields = tuple(f for f in fields if f in _KEYS)
        self._start = time.monotonic()
        self._first_step: int | None = None
        self.step = 0
        self.stats = ""
        self.eval_text = ""
        self.done_in: float | None = None
        self._line: _BarLine | None = None
        if self.use_rich:
            self._line = _BarLine.get(self.stream)
            self._line.add(self)

    def eta(self, step: int) -> float | None:
        """Seconds left, from the mean time per step since the first logged step."""
        if not self.total_steps or self._first_step is None or step <= self._first_step:
            return None
        per_step = (time.monotonic() - self._start) / (step - self._first_step)
        return max(0.0, (self.total_steps - step) * per_step)

    def summary(self, metrics: dict[str, Any]) -> str:
        """``reward x loss y`` for the values present of the monitor's ``fields``."""
        values = scalar_metrics(metrics)
        parts = []
        for label in self.fields:
            value = _first(values, _KEYS[label])
            if value is not None:
                parts.append(f"{label} {value:.4f}")
        return " ".join(parts)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        self.skip_histograms(metrics)
        numbers = scalar_metrics(metrics)
        if numbers and all(k.startswith("eval/") or k.startswith("timing/eval") for k in numbers):
            self.log_eval(metrics, step)  # an eval is no step: the ETA and the step stay
            return
        if self._first_step is None:
            self._first_step, self._start = step, time.monotonic()
        self.step = step
        self.stats = self.summary(metrics)
        if self._line is not None:
            self._line.draw()
            return
        total = f"/{self.total_steps}" if self.total_steps else ""
        eta = f" eta {format_eta(self.eta(step))}" if self.total_steps else ""
        line = f"[{self.role}] step {step}{total}" + (f" {self.stats}" if self.stats else "") + eta
        print(line, file=self.stream, flush=True)

    def log_eval(self, metrics: dict[str, Any], step: int) -> None:
        """Show an eval's results (from the eval at ``step``) until the next eval."""
        results = eval_results(metrics)
        if not results:
            return
        self.eval_text = f"eval@{step} {format_eval(results)}"
        if self._line is not None:
            self._line.draw()
            return
        print(f"[{self.role}] eval at step {step}: {format_eval(results)}", file=self.stream, flush=True)

    def render(self, width: int) -> str:
        """The bar line, at most ``width`` characters."""
        total = self.total_steps
        count = f"{self.step}/{total}" if total else f"step {self.step}"
        if self.done_in is not None:
            timing = f"in {format_eta(self.done_in)}"
        elif total:
            timing = f"eta {format_eta(self.eta(self.step))}"
        else:
            timing = ""
        tail = " ".join(p for p in (count, self.stats, self.eval_text, timing) if p)
        cells = 0
        if total:
            cells = max(_MIN_BAR_CELLS, min(_BAR_CELLS, width - len(self.role) - len(tail) - 2))
        bar = ""
        if cells:
            done = min(1.0, max(0.0, self.step / total)) * cells
            full = int(done)
            bar = "━" * full + ("╸" if full < cells and done - full >= 0.5 else "")
            bar += "─" * (cells - len(bar))
        text = " ".join(p for p in (self.role, bar, tail) if p)
        return text if len(text) <= width else text[: max(0, width - 1)] + "…"

    def close(self) -> None:
        """End the bar: its final state stays on screen, on a line of its own."""
        if self._line is not None:
            self.done_in = time.monotonic() - self._start if self._first_step is not None else None
            line, self._line = self._line, None
            line.remove(self)


def end_progress_bars() -> None:
    """End every progress bar that is up (each keeps its final state on screen), so that what
    is printed next (the launcher's closing line) comes after them."""
    for line in list(_BarLine.lines.values()):
        for bar in list(line.bars):
            bar.close()


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


class _Guarded:
    """A stand-in for ``sys.stdout`` / ``sys.stderr`` (or a logging handler's stream) while a
    bar is up: every write first clears the bar line when it goes to the terminal. A stand-in
    that outlives its bar (a handler made while it was up keeps it) coordinates with whichever
    bar is up when it writes, or writes straight through."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._tty = _isatty(stream)

    def write(self, text: str) -> int:
        line = _BarLine.active()
        if line is None:
            return self._stream.write(text)
        return line.write_through(self._stream, text, self._tty or self._stream is line.stream)

    def writelines(self, lines: Any) -> None:
        for text in lines:
            self.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _BarLine:
    """The bar line of one terminal stream: the bars drawn on it (joined with ``│``), and the
    streams and logging handlers redirected through it while any bar is up."""

    lines: dict[int, _BarLine] = {}
    _registry_lock = threading.Lock()

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.bars: list[ConsoleMonitor] = []
        self.drawn = False  # the bar is on the terminal's current line
        self.mid_line = False  # other output left the cursor in the middle of a line
        self.lock = threading.RLock()
        self._saved_std: dict[str, Any] = {}
        self._saved_handlers: list[tuple[logging.StreamHandler, Any]] = []

    @classmethod
    def active(cls) -> _BarLine | None:
        """The bar line that is up (there is one terminal), if any."""
        return next((line for line in list(cls.lines.values()) if line.bars), None)

    @classmethod
    def get(cls, stream: TextIO) -> _BarLine:
        with cls._registry_lock:
            line = cls.lines.get(id(stream))
            if line is None:
                line = cls.lines[id(stream)] = cls(stream)
            return line

    # -- bars --------------------------------------------------------------------------------

    def add(self, bar: ConsoleMonitor) -> None:
        with self.lock:
            if not self.bars:
                self._install()
            self.bars.append(bar)
            self.draw()

    def remove(self, bar: ConsoleMonitor) -> None:
        with self.lock:
            if bar not in self.bars:
                return
            self.draw()
            if self.drawn:
                self.stream.write("\n")  # the final state stays, on its own line
                self.stream.flush()
                self.drawn = False
            self.bars.remove(bar)
            if self.bars:
                self.draw()
                return
            self._uninstall()
        with self._registry_lock:
            if self.lines.get(id(self.stream)) is self and not self.bars:
                del self.lines[id(self.stream)]

    def draw(self) -> None:
        with self.lock:
            if not self.bars:
                return
            width = max(20, shutil.get_terminal_size((100, 24)).columns - 1)
            text = " │ ".join(bar.render(width) for bar in self.bars)
            if len(text) > width:
                text = text[: width - 1] + "…"
            if self.mid_line:
                self.stream.write("\n")
                self.mid_line = False
            self.stream.write(_CLEAR + text)
            self.stream.flush()
            self.drawn = True

    def clear(self) -> None:
        with self.lock:
            if self.drawn:
                self.stream.write(_CLEAR)
                self.stream.flush()
                self.drawn = False

    def write_through(self, stream: TextIO, text: str, terminal: bool) -> int:
        """``stream.write(text)`` with the bar cleared first (when ``stream`` is the terminal)
        and drawn again once the output ends its line."""
        if not terminal or not text:
            return stream.write(text)
        with self.lock:
            self.clear()
            written = stream.write(text)
            stream.flush()
            self.mid_line = not text.endswith("\n")
            if not self.mid_line:
                self.draw()
            return written

    # -- redirection -------------------------------------------------------------------------

    def _install(self) -> None:
        originals = {name: getattr(sys, name) for name in ("stdout", "stderr")}
        for name, stream in originals.items():
            if not isinstance(stream, _Guarded):
                self._saved_std[name] = stream
                setattr(sys, name, _Guarded(stream))
        targets = {id(s): s for s in (*originals.values(), self.stream)}
        for handler in _stream_handlers():
            stream = getattr(handler, "stream", None)
            if id(stream) in targets and not isinstance(stream, _Guarded):
                self._saved_handlers.append((handler, stream))
                handler.stream = _Guarded(stream)

    def _uninstall(self) -> None:
        for name, stream in self._saved_std.items():
            current = getattr(sys, name)
            if isinstance(current, _Guarded) and current._stream is stream:
                setattr(sys, name, stream)
        self._saved_std.clear()
        for handler, stream in self._saved_handlers:
            current = getattr(handler, "stream", None)
            if isinstance(current, _Guarded) and current._stream is stream:
                handler.stream = stream
        self._saved_handlers.clear()


def _stream_handlers() -> list[logging.StreamHandler]:
    """Every logging ``StreamHandler`` (not file handlers) of every logger."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    found: list[logging.StreamHandler] = []
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if (
                isinstance(handler, logging.StreamHandler)
                and not isinstance(handler, logging.FileHandler)
                and handler not in found
            ):
                found.append(handler)
    return found


__all__ = ["ConsoleMonitor", "end_progress_bars", "eval_results", "format_eta", "format_eval"]
