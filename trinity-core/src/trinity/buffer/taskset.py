"""Taskset readers: turn a ``TasksetConfig`` into :class:`~trinity.workflow.Task` batches.

Construction checks everything that would make the run pointless (missing file or folder, an
unknown workflow or reward function, more than half of the rows unusable) and raises
:class:`TasksetError` naming the taskset, before any model is loaded. Rows that are individually
broken (invalid JSON or UTF-8, nested too deeply, huge integers, missing prompt, wrong type,
unknown per-row workflow, any exception while checking them) are skipped, logged with file and
row number, and counted in :meth:`TasksetReader.metrics` as ``buffer/<taskset>/skipped_rows``:
one hostile row never stops a job.

Several training tasksets are interleaved by :class:`TasksetScheduler`, task by task.

Which rows a training taskset reads is its selector's choice (``data_selector``: a registered
:class:`~trinity.buffer.selector.Selector`). After each explore step the explorer reports how
every finished task went (:meth:`TasksetScheduler.feedback`), and the reader passes it on to the
selector that chose the task (:meth:`~trinity.buffer.selector.Selector.update`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.buffer.base import BufferExhausted
from trinity.buffer.dataset import DatasetError, RawRow, load_rows
from trinity.buffer.rows import one_line, type_name
from trinity.buffer.selector import Selector, SequentialSelector, build_selector

if TYPE_CHECKING:
    from trinity.config import BufferConfig, TasksetConfig
    from trinity.workflow import Task

logger = logging.getLogger(__name__)

_MAX_LOGGED_SKIPS = 20


class TasksetError(ValueError):
    """A taskset cannot be used; the message names the taskset and what to fix."""


class TasksetReader:
    """Reads one taskset.

    Args:
        config: the taskset's :class:`~trinity.config.TasksetConfig`.
        buffer_config: the ``buffer`` section, for defaults the taskset does not set
            (``default_workflow_type``, ``default_reward_fn_type``, ``total_epochs``,
            ``total_steps``, ``batch_size``). A resolved config already has them filled in.

    The read position starts at ``config.index`` and is saved by :meth:`state_dict`, with
    the selector's own state. Eval tasksets (``is_eval``) are read once, in file order.
    """

    def __init__(self, config: TasksetConfig, buffer_config: BufferConfig | None = None) -> None:
        self.config = config
        self.name = config.name or "taskset"
        b = buffer_config
        self.default_workflow = config.default_workflow_type or (b.default_workflow_type if b else None)
        self.default_reward_fn = config.default_reward_fn_type or (b.default_reward_fn_type if b else None)
        self.batch_size = config.batch_size or (b.batch_size if b else 1) or 1
        self.total_steps = (
            config.total_steps if config.total_steps is not None else (b.total_steps if b else None)
        )
        epochs = config.total_epochs or (b.total_epochs if b else 1) or 1
        self.is_eval = bool(config.is_eval)
        self.total_epochs = 1 if self.is_eval else epochs
        if self.is_eval:
            self.total_steps = None
        self.skipped: Counter[str] = Counter()
        self._first_skip: str | None = None  # file:line of the first unusable row
        self._components: dict[tuple[str, str], type | None] = {}
        self._check_components()
        self.rows = self._load()
        self.selector = self._make_selector()
        self._row_of_task: dict[int, int] | None = None  # Task.index -> row index, built on feedback
        self.position = int(config.index or 0)
        self.steps = 0

    # -- construction-time checks ----------------------------------------------------------

    def _error(self, message: str) -> TasksetError:
        return TasksetError(f"taskset {self.name!r}: {message}")

    def _component(self, kind: str, name: str) -> type:
        from trinity.plugins import get_component

        key = (kind, name)
        if key not in self._components:
            self._components[key] = get_component(kind, name)
        return self._components[key]  # type: ignore[return-value]

    def _check_components(self) -> None:
        from trinity.plugins import UnknownComponentError

        fmt = self.config.format
        if not self.default_workflow and not fmt.workflow_key:
            raise self._error(
                "no workflow: set default_workflow_type on the taskset or buffer.default_workflow_type"
            )
        for kind, name, key in (
            ("workflow", self.default_workflow, "default_workflow_type"),
            ("reward_fn", self.default_reward_fn, "default_reward_fn_type"),
        ):
            if not name:
                continue
            try:
                self._component(kind, name)
            except UnknownComponentError as exc:
                raise self._error(f"{key}: {exc}") from None
        if not self.is_eval:
            try:
                self._component("selector", self.config.data_selector.selector_type)
            except UnknownComponentError as exc:
                raise self._error(f"data_selector.selector_type: {exc}") from None

    def _make_selector(self) -> Selector:
        """The training taskset's selector, given the ``feature_keys`` columns of the usable rows
        (``None`` where a row lacks one); eval tasksets read in file order."""
        if self.is_eval:
            return SequentialSelector(len(self.rows))
        cfg = self.config.data_selector
        cls = self._component("selector", cfg.selector_type)
        features = {
            key: [raw.value.get(key) for raw, _, _ in self.rows] for key in dict.fromkeys(cfg.feature_keys)
        }
        try:
            return build_selector(cls, len(self.rows), seed=cfg.seed, features=features, kwargs=cfg.kwargs)
        except (TypeError, ValueError) as exc:
            raise self._error(f"data_selector: selector {cfg.selector_type!r}: {exc}") from None

    def _load(self) -> list[tuple[RawRow, type, type | None]]:
        cfg = self.config
        try:
            raw = load_rows(cfg.path, split=cfg.split, subset_name=cfg.subset_name)
        except DatasetError as exc:
            raise self._error(f"{exc}; check buffer.explorer_input tasksets path/split") from None
        if not raw:
            raise self._error(f"{cfg.path} holds no rows")
        rows = []
        for r in raw:
            checked = self._check_row(r)
            if isinstance(checked, str):
                self._skip(r, checked)
                continue
            rows.append((r, *checked))
        if 2 * len(rows) < len(raw):
            raise self._error(self._unusable_message(len(raw) - len(rows), len(raw)))
        if self.skipped:
            logger.warning(
                "taskset %r: skipped %d of %d rows of %s (%s)",
                self.name,
                sum(self.skipped.values()),
                len(raw),
                cfg.path,
                "; ".join(f"{n}x {why}" for why, n in self.skipped.most_common(5)),
            )
        return rows

    def _check_row(self, r: RawRow) -> tuple[type, type | None] | str:
        """The row's (workflow, reward_fn) classes, or why the row is unusable."""
        if r.error:
            return r.error
        if not isinstance(r.value, dict):
            return f"row must be a JSON object, got {type_name(r.value)}"
        try:
            components = self._row_components(r.value)
            if isinstance(components, str):
                return components
            return components[0].row_problem(r.value, self.config.format) or components
        except Exception as exc:  # hostile data (or a workflow's own check) costs one row, never the job
            return f"unreadable row ({type(exc).__name__}: {one_line(str(exc))[:200]})"

    def _unusable_message(self, bad: int, total: int) -> str:
        """One line for a taskset whose rows are mostly unusable: counts, top reasons, first row."""
        path = self.config.path
        fmt = self.config.format
        if bad == total:
            head = f"none of the {total} rows of {path} is usable"
        else:
            head = f"{bad} of {total} rows are unusable in {path}"
        reasons = "; ".join(f"{n}x {why}" for why, n in self.skipped.most_common(3))
        return (
            f"{head} ({reasons}); first bad row {self._first_skip}. Probably the wrong file or "
            f"wrong format keys: check format.prompt_key / response_key "
            f"(now {fmt.prompt_key!r} / {fmt.response_key!r})"
        )

    def _row_components(self, row: dict) -> tuple[type, type | None] | str:
        from trinity.plugins import UnknownComponentError

        fmt = self.config.format
        names = {}
        for kind, key, default in (
            ("workflow", fmt.workflow_key, self.default_workflow),
            ("reward_fn", fmt.reward_fn_key, self.default_reward_fn),
        ):
            name = row.get(key) if key and row.get(key) is not None else default
            if name is not None and not isinstance(name, str):
                return f"{kind} name {key!r} must be a string, got {type_name(name)}"
            names[kind] = name
        if not names["workflow"]:
            return f"no workflow: column {fmt.workflow_key!r} is empty and there is no default_workflow_type"
        try:
            workflow = self._component("workflow", names["workflow"])
            reward = self._component("reward_fn", names["reward_fn"]) if names["reward_fn"] else None
        except UnknownComponentError as exc:
            return (
                str(exc).split(" Installed")[0].rstrip(".")
                + f" (installed: {', '.join(exc.installed) or 'none'})"
            )
        return workflow, reward

    def _skip(self, row: RawRow, why: str) -> None:
        # Reasons are counted without their row-specific detail so metrics stay few.
        why = one_line(why)
        self.skipped[why.split(" (")[0]] += 1
        if self._first_skip is None:
            self._first_skip = row.where
        if sum(self.skipped.values()) <= _MAX_LOGGED_SKIPS:
            logger.warning("taskset %r: skipping %s: %s", self.name, row.where, why)

    # -- reading ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def limit(self) -> int | None:
        """Last position (exclusive) this reader hands out, ``None`` when bounded by steps."""
        return None if self.total_steps is not None else self.total_epochs * len(self.rows)

    @property
    def epoch(self) -> int:
        return self.position // len(self.rows)

    def remaining(self) -> int | None:
        """Tasks left before the end (``None``: unbounded, ``total_steps`` decides)."""
        return None if self.limit is None else max(0, self.limit - self.position)

    def take(self, count: int) -> list[Task]:
        """The next ``count`` tasks or fewer at the end (no step accounting; see read_batch)."""
        left = self.remaining()
        if left is not None:
            count = min(count, left)
        indices = self.selector.indices(self.position, count)
        self.position += count
        return [self._task(i) for i in indices]

    def read_batch(self, batch_size: int | None = None) -> list[Task]:
        """The next batch (the last one may be short); :class:`BufferExhausted` at the end."""
        if self.total_steps is not None and self.steps >= self.total_steps:
            raise BufferExhausted(f"taskset {self.name!r}: total_steps ({self.total_steps}) reached")
        tasks = self.take(batch_size or self.batch_size)
        if not tasks:
            raise BufferExhausted(f"taskset {self.name!r}: {self.total_epochs} epoch(s) done")
        self.steps += 1
        return tasks

    def _task(self, index: int) -> Task:
        from trinity.workflow import Task

        raw, workflow, reward_fn = self.rows[index]
        cfg = self.config
        return Task(
            workflow=workflow,
            reward_fn=reward_fn,
            raw_task=raw.value,
            format_args=cfg.format,
            rollout_args=cfg.rollout_args,
            workflow_args=dict(cfg.workflow_args),
            reward_fn_args=dict(cfg.reward_fn_args),
            repeat_times=cfg.repeat_times or 1,
            is_eval=self.is_eval,
            taskset_name=self.name,
            index=raw.row - 1,
        )

    def feedback(self, observed: Mapping[str, Mapping[int, float]]) -> None:
        """Pass ``observed[<this taskset's name>]``, ``{Task.index: observed value}`` of its
        finished tasks, to the selector as one :meth:`~trinity.buffer.selector.Selector.update`
        of row indices (none when there is nothing; unknown task indices are ignored)."""
        mine = observed.get(self.name) or {}
        if self._row_of_task is None:
            self._row_of_task = {raw.row - 1: i for i, (raw, _, _) in enumerate(self.rows)}
        pairs = [(self._row_of_task[t], float(v)) for t, v in mine.items() if t in self._row_of_task]
        if pairs:
            self.selector.update([i for i, _ in pairs], [v for _, v in pairs])

    def state_dict(self) -> dict[str, Any]:
        """``{"position", "steps"}``, plus ``"selector"`` when the selector has state of its own
        (what it learned from feedback): enough to continue exactly where reading stopped."""
        state: dict[str, Any] = {"position": self.position, "steps": self.steps}
        selector_state = self.selector.state_dict()
        if selector_state:
            state["selector"] = selector_state
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a position (and selector state) saved by :meth:`state_dict`."""
        self.position = int(state.get("position", 0))
        self.steps = int(state.get("steps", 0))
        if "selector" in state:
            self.selector.load_state_dict(state["selector"])

    def metrics(self) -> dict[str, float]:
        """``buffer/<taskset>/rows``, ``.../skipped_rows``, ``.../epoch``, one
        ``.../skipped/<reason>`` per reason."""
        prefix = f"buffer/{self.name}"
        out: dict[str, float] = {
            f"{prefix}/rows": len(self.rows),
            f"{prefix}/skipped_rows": sum(self.skipped.values()),
            f"{prefix}/epoch": self.epoch,
        }
        for why, n in self.skipped.items():
            out[f"{prefix}/skipped/{why}"] = n
        return out


class TasksetScheduler:
    """Interleaves several training tasksets into one stream of batches, task by task.

    Each batch takes tasks round-robin from the tasksets that still have tasks, so a batch mixes
    tasksets evenly; a taskset that ends drops out and the others continue. ``total_steps``
    (from the buffer config) bounds the number of batches.
    """

    def __init__(
        self,
        configs: Sequence[TasksetConfig],
        buffer_config: BufferConfig | None = None,
    ) -> None:
        if not configs:
            raise TasksetError("no tasksets: set buffer.explorer_input.tasksets")
        names = [c.name for c in configs]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TasksetError(f"taskset names must be unique; repeated: {', '.join(dupes)}")
        self.readers = [TasksetReader(c, buffer_config) for c in configs]
        first = self.readers[0]
        self.batch_size = first.batch_size
        self.total_steps = first.total_steps
        self.steps = 0
        self._next = 0

    def read_batch(self, batch_size: int | None = None) -> list[Task]:
        """The next batch of tasks; :class:`BufferExhausted` when all tasksets are done."""
        if self.total_steps is not None and self.steps >= self.total_steps:
            raise BufferExhausted(f"total_steps ({self.total_steps}) reached")
        want = batch_size or self.batch_size
        # Deal the batch's slots round-robin first, then ask each taskset once for its share:
        # a selector that draws a batch (without replacement, top-k) sees the whole request.
        left = {id(r): r.remaining() for r in self.readers}
        order: list[TasksetReader] = []
        while len(order) < want and any(n != 0 for n in left.values()):
            reader = self.readers[self._next % len(self.readers)]
            self._next += 1
            n = left[id(reader)]
            if n == 0:
                continue
            order.append(reader)
            left[id(reader)] = None if n is None else n - 1
        if not order:
            raise BufferExhausted("every taskset is done")
        shares = {id(r): iter(r.take(order.count(r))) for r in self.readers if r in order}
        tasks: list[Task] = [next(shares[id(r)]) for r in order]
        self.steps += 1
        return tasks

    def feedback(self, observed: Mapping[str, Mapping[int, float]]) -> None:
        """``{taskset name: {Task.index: observed value}}`` of an explore step's finished tasks,
        for every taskset's :meth:`TasksetReader.feedback` (unknown names ignored)."""
        for r in self.readers:
            r.feedback(observed)

    def state_dict(self) -> dict[str, Any]:
        """Steps, round-robin pointer and each taskset's position, by name."""
        return {
            "steps": self.steps,
            "next": self._next,
            "tasksets": {r.name: r.state_dict() for r in self.readers},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`; tasksets not in the state start from the beginning."""
        self.steps = int(state.get("steps", 0))
        self._next = int(state.get("next", 0))
        saved = state.get("tasksets", {})
        for r in self.readers:
            if r.name in saved:
                r.load_state_dict(saved[r.name])

    def metrics(self) -> dict[str, float]:
        """Every taskset's :meth:`TasksetReader.metrics`."""
        out: dict[str, float] = {}
        for r in self.readers:
            out.update(r.metrics())
        return out
