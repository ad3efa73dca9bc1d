"""The console progress bar: other output on lines of its own, what it shows per stage, evals."""

from __future__ import annotations

import io
import logging
import os
import re
import sys

import pytest

from trinity.config import Config
from trinity.monitor import console_fields
from trinity.monitor.console import ConsoleMonitor, end_progress_bars


class Terminal(io.StringIO):
    """A terminal as the program sees it (``isatty``), and what a person would see on it."""

    def isatty(self) -> bool:
        return True

    def screen(self) -> list[str]:
        """The lines on screen: ``\\r`` goes back to the line's start, ``ESC[2K`` clears it."""
        lines: list[str] = []
        line: list[str] = []
        col = 0
        for token in re.split(r"(\r|\x1b\[2K|\n)", self.getvalue()):
            if token == "\n":
                lines.append("".join(line))
                line, col = [], 0
            elif token == "\r":
                col = 0
            elif token == "\x1b[2K":
                line = [" "] * col
            else:
                for char in token:
                    line[col : col + 1] = [char]
                    col += 1
        return [*lines, "".join(line)]


@pytest.fixture
def terminal(monkeypatch):
    term = Terminal()
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: os.terminal_size((120, 40)))
    yield term
    end_progress_bars()


def test_output_while_the_bar_is_up_gets_lines_of_its_own(terminal, monkeypatch):
    """A logging warning (a handler made before the bar, holding the terminal), a print to
    stdout and one to stderr: each on a line of its own, never glued to the bar; the bar stays
    the last line and its final state stays on screen above the closing line."""
    # Here, not in the fixture: pytest's own capture replaces sys.stdout after fixtures ran.
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    logger = logging.getLogger("trinity.test_console")
    handler = logging.StreamHandler(terminal)
    handler.setFormatter(logging.Formatter("[trinity] %(levelname)s %(name)s: %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    try:
        bar = ConsoleMonitor("trainer", total_steps=4, stream=terminal, fields=("loss",))
        logger.warning("something to say")
        bar.log({"actor/loss": 0.5}, 1)
        print("a plain line")
        print("partial", end="", file=sys.stderr)
        bar.log({"actor/loss": 0.25}, 2)
        print("[trinity] on stderr", file=sys.stderr)
        bar.log({"actor/loss": 0.125}, 4)
        end_progress_bars()
        print("[trinity] done: 4 train steps in /a/very/long/path/" + "x" * 150)
    finally:
        logger.removeHandler(handler)
    screen = [line for line in terminal.screen() if line]
    assert "[trinity] WARNING trinity.test_console: something to say" in screen
    assert "a plain line" in screen
    assert "partial" in screen  # a line left unfinished is ended before the bar is drawn again
    assert "[trinity] on stderr" in screen
    # the bar: its final state, then the closing line (whole, never wrapped) last
    assert screen[-2].startswith("trainer ━") and "4/4 loss 0.1250" in screen[-2], screen
    assert screen[-1] == "[trinity] done: 4 train steps in /a/very/long/path/" + "x" * 150
    assert sum("trainer ━" in line for line in screen) == 1, screen  # no stale copies
    # Streams and handlers are back to what they were.
    assert sys.stdout is terminal and sys.stderr is terminal and handler.stream is terminal


def test_the_bar_fits_the_terminal(terminal, monkeypatch):
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback=None: os.terminal_size((40, 10)))
    bar = ConsoleMonitor("trainer", total_steps=600, stream=terminal)
    bar.log({"critic/score/mean": 0.5, "actor/loss": 0.25}, 300)
    bar.log_eval({"eval/heldout/accuracy": 0.5}, 300)
    assert all(len(line) < 40 for line in terminal.screen())


def test_sft_stage_shows_its_loss_and_no_reward():
    out = io.StringIO()
    monitor = ConsoleMonitor("trainer", total_steps=600, stream=out, fields=("loss",))
    monitor.log({"critic/score/mean": 0.0, "actor/sft_loss": 0.5}, 1)
    assert out.getvalue().startswith("[trainer] step 1/600 loss 0.5000 eta ")
    assert "reward" not in out.getvalue()


def test_console_fields_follow_the_algorithm(tmp_path):
    def config(algorithm):
        return Config(checkpoint_root_dir=str(tmp_path), algorithm={"algorithm_type": algorithm})

    assert console_fields(config("sft")) == ("loss",)
    assert console_fields(config("dpo")) == ("loss",)
    assert console_fields(config("grpo")) == ("reward", "loss")


def test_the_last_eval_is_shown_until_the_next():
    out = io.StringIO()
    monitor = ConsoleMonitor("trainer", total_steps=120, stream=out)
    evals = {"eval/heldout/accuracy": 0.42, "eval/practice/accuracy": 0.5, "eval/model_version": 40.0}
    monitor.log_eval(evals, 40)
    assert out.getvalue() == "[trainer] eval at step 40: heldout 42.0% practice 50.0%\n"

    bar = ConsoleMonitor("trainer", total_steps=120, stream=Terminal(), use_rich=True)
    try:
        bar.log({"critic/score/mean": 0.75, "actor/pg_loss": 0.1}, 39)
        bar.log(evals | {"timing/eval/heldout": 2.0}, 40)  # an explorer's eval through log()
        assert bar.step == 39  # an eval is no step
        text = bar.render(200)
        assert "39/120 reward 0.7500 loss 0.1000 eval@40 heldout 42.0% practice 50.0% eta" in text
        bar.log_eval({"eval/heldout/accuracy": 0.5}, 80)
        assert "eval@80 heldout 50.0% eta" in bar.render(200)
    finally:
        bar.close()


def test_eval_without_accuracy_shows_the_mean_reward():
    out = io.StringIO()
    ConsoleMonitor("explorer", total_steps=4, stream=out).log_eval({"eval/t/reward_mean": 0.25}, 0)
    assert out.getvalue() == "[explorer] eval at step 0: t reward_mean 0.2500\n"


def test_a_handler_made_while_one_bar_was_up_respects_the_next(terminal, monkeypatch):
    """A handler made while a bar is up holds the stand-in ``sys.stderr``; once that bar is gone,
    its lines must still keep apart from the next stage's bar."""
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", terminal)
    first = ConsoleMonitor("trainer", total_steps=2, stream=terminal)
    handler = logging.StreamHandler()  # sys.stderr now: the first bar's stand-in
    logger = logging.getLogger("trinity.test_console_late")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        first.log({"actor/loss": 1.0}, 2)
        first.close()
        second = ConsoleMonitor("explorer", total_steps=2, stream=terminal)
        second.log({"rollout/reward_mean": 0.5}, 1)
        logger.warning("late warning")
        second.log({"rollout/reward_mean": 0.75}, 2)
        second.close()
    finally:
        logger.removeHandler(handler)
    screen = [line for line in terminal.screen() if line]
    assert "late warning" in screen, screen
    assert screen[-1].startswith("explorer ━") and "2/2 reward 0.7500" in screen[-1], screen
