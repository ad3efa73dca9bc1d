"""``trinity log``: a run's actor logs merged by time.

Each Ray actor writes ``<job_dir>/log/<actor>.log`` (``<job_dir>/log/<node_ip>/<actor>.log`` with
``log.group_by_node``; see :mod:`trinity.actors`), one record per line in the format
``2026-01-02 03:04:05,678 INFO trinity.explorer: message``. Lines without that timestamp
(tracebacks, multi-line messages) belong to the record before them and stay with it.

Light on purpose: standard library and click only (no torch, ray or transformers).
"""

from __future__ import annotations

import heapq
import os
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import click

# ``logging.Formatter``'s default ``%(asctime)s``: "YYYY-mm-dd HH:MM:SS,mmm". Timestamps in this
# fixed-width form sort correctly as strings.
_TIMESTAMP = re.compile(rb"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}[,.]\d{3}) ")
_COLORS = ("cyan", "green", "yellow", "magenta", "blue", "red")


@dataclass
class Record:
    """One log record: its timestamp (``""`` when the file starts without one), the actor's
    label, and its lines (the stamped line plus any continuation lines), without newlines."""

    timestamp: str
    label: str
    lines: list[str]


@dataclass
class LogFile:
    """An actor's log file, read incrementally (``offset`` is how far it has been read)."""

    path: Path
    label: str
    actor: str
    offset: int = 0
    last_timestamp: str = ""
    _head: list[str] = field(default_factory=list, repr=False)

    def read_records(self, *, complete_only: bool = False) -> list[Record]:
        """The records written since the last call.

        ``complete_only`` (follow mode) leaves a last line without its newline for the next call:
        the writer may be half-way through it. Continuation lines read before their record's
        stamped line (a new file, or the rest of a traceback seen in an earlier poll) get the
        file's previous timestamp, so they sort where they were written.
        """
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return []
        if size < self.offset:  # truncated or replaced: start over
            self.offset = 0
        if size == self.offset:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        if complete_only:
            end = data.rfind(b"\n") + 1
            data = data[:end]
        self.offset += len(data)
        records: list[Record] = []
        current: Record | None = None
        for raw in data.splitlines():
            match = _TIMESTAMP.match(raw)
            line = raw.decode("utf-8", errors="replace")
            if match:
                self.last_timestamp = match.group(1).decode().replace(".", ",")
                current = Record(self.last_timestamp, self.label, [line])
                records.append(current)
            elif current is None:
                current = Record(self.last_timestamp, self.label, [line])
                records.append(current)
            else:
                current.lines.append(line)
        return records


def find_log_dir(job_dir: str | Path) -> Path:
    """``<job_dir>/log``; ``job_dir`` may also be the log folder itself."""
    job_dir = Path(job_dir)
    if (job_dir / "log").is_dir():
        return job_dir / "log"
    if job_dir.name == "log" and job_dir.is_dir():
        return job_dir
    return job_dir / "log"


def discover(log_dir: Path, known: dict[Path, LogFile] | None = None) -> dict[Path, LogFile]:
    """The ``*.log`` files in ``log_dir`` and its per-node subfolders, keeping ``known`` ones
    (with their read positions). Labels are ``<actor>`` or ``<node_ip>/<actor>``."""
    files = dict(known or {})
    paths = [*log_dir.glob("*.log"), *log_dir.glob("*/*.log")]
    for path in sorted(paths):
        if path not in files and path.is_file():
            rel = path.relative_to(log_dir)
            label = path.stem if rel.parent == Path(".") else f"{rel.parent.as_posix()}/{path.stem}"
            files[path] = LogFile(path, label, path.stem)
    return files


def select(files: dict[Path, LogFile], actors: Iterable[str]) -> dict[Path, LogFile]:
    """Only the files of ``actors`` (by actor name or label); all files when ``actors`` is empty."""
    wanted = set(actors)
    if not wanted:
        return files
    return {p: f for p, f in files.items() if f.actor in wanted or f.label in wanted}


def merge(batches: Iterable[list[Record]]) -> Iterator[Record]:
    """Records of several files in timestamp order; each file keeps its own order, and ties go
    to the file listed first."""
    return heapq.merge(*batches, key=lambda r: r.timestamp)


def format_record(record: Record, width: int, color: str | None = None) -> Iterator[str]:
    """Each line of ``record`` prefixed with its actor's label, padded to ``width``."""
    prefix = f"{record.label:<{width}} | "
    if color:
        prefix = click.style(prefix, fg=color)
    for line in record.lines:
        yield prefix + line


class LogPrinter:
    """Prints merged records; one color per actor (dropped by click when not a terminal)."""

    def __init__(self) -> None:
        self.colors: dict[str, str] = {}
        self.width = 0

    def print(self, records: Iterable[Record]) -> int:
        count = 0
        for record in records:
            color = self.colors.setdefault(record.label, _COLORS[len(self.colors) % len(_COLORS)])
            self.width = max(self.width, len(record.label))
            click.echo("\n".join(format_record(record, self.width, color)))
            count += 1
        return count


def show_logs(
    log_dir: Path,
    actors: tuple[str, ...] = (),
    *,
    follow: bool = False,
    poll_interval: float = 0.5,
    max_polls: int | None = None,
) -> int:
    """Print the logs under ``log_dir`` merged by time; returns an exit status.

    With ``follow``, keep printing what is appended (and files that appear) every
    ``poll_interval`` seconds until interrupted (or ``max_polls`` polls, for tests).
    """
    if not log_dir.is_dir():
        click.secho(f"Error: no log folder at {log_dir} (has the job started?)", fg="red", err=True)
        return 1
    files = discover(log_dir)
    chosen = select(files, actors)
    missing = sorted(a for a in actors if not any(a in (f.actor, f.label) for f in chosen.values()))
    if missing and not follow:
        found = ", ".join(sorted(f.label for f in files.values())) or "none"
        click.secho(
            f"Error: no log for actor {', '.join(missing)} in {log_dir} (found: {found})", fg="red", err=True
        )
        return 1
    printer = LogPrinter()
    printer.width = max((len(f.label) for f in chosen.values()), default=0)
    try:
        printer.print(merge([f.read_records(complete_only=follow) for f in chosen.values()]))
        if not follow:
            return 0
        if missing:
            click.echo(f"(waiting for logs of {', '.join(missing)})", err=True)
        polls = 0
        while max_polls is None or polls < max_polls:
            time.sleep(poll_interval)
            polls += 1
            files = discover(log_dir, files)
            chosen = select(files, actors)
            printer.print(merge([f.read_records(complete_only=True) for f in chosen.values()]))
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader went away (``trinity log ... | head``): stop quietly, and point stdout at
        # nowhere so the interpreter's final flush does not complain either.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def job_dir_from_config(config_path: str) -> str:
    """The job folder (``checkpoint_job_dir``) of the config at ``config_path``.

    Only the path keys are resolved, so a config that no longer passes every check (an older
    Trinity version ran it) still finds its logs.
    """
    from trinity.config import load_config
    from trinity.config.resolve import _resolve_paths

    config = load_config(config_path, resolve=False).model_copy(deep=True)
    _resolve_paths(config)
    return config.checkpoint_job_dir


@click.command(name="log")
@click.option("-c", "--config", "config_path", type=click.Path(dir_okay=False), help="The job's YAML config.")
@click.option(
    "--job-dir",
    type=click.Path(file_okay=False),
    help="The job folder (<checkpoint_root_dir>/<project>/<name>) instead of a config.",
)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines (and new actors) until Ctrl-C.")
@click.option("--actor", "actors", multiple=True, help="Only this actor's log, e.g. explorer (repeatable).")
def log_command(config_path: str | None, job_dir: str | None, follow: bool, actors: tuple[str, ...]) -> None:
    """Print a run's actor logs merged by time, each line prefixed with its actor."""
    if (config_path is None) == (job_dir is None):
        raise click.UsageError("give either -c/--config or --job-dir")
    if config_path is not None:
        from trinity.config import ConfigError

        if not Path(config_path).is_file():
            click.secho(f"Error: config file {config_path} does not exist", fg="red", err=True)
            sys.exit(2)
        try:
            job_dir = job_dir_from_config(config_path)
        except ConfigError as exc:
            click.secho(f"Error: {exc}", fg="red", err=True)
            sys.exit(2)
    sys.exit(show_logs(find_log_dir(job_dir), actors, follow=follow))
