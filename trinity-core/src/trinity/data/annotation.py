"""Human preference labels: the store of pairs people label, and the task operator that asks
for them (``human_preference_annotation_mapper``, Trinity-RFT's / Data-Juicer's name).

The operator puts each task row's prompt and two answers into a :class:`PreferenceStore` (an
SQLite file, by default ``<job dir>/annotation/<project>.db``), serves the Labels page of Trinity
Studio (``trinity-studio``) where a person picks the better answer or skips the pair, waits for
the labels and returns each labelled pair as a DPO row: ``chosen`` / ``rejected`` (the configured
keys) plus ``labelled_by`` and ``labelled_at``.

The store is the record of what was decided: a pair is keyed by its prompt and answers, so a
restarted job (or studio) finds the labels already given and asks only for the rest, and a pair
is labelled at most once (a second label of the same pair is refused with who gave the first).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sqlite3
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, ClassVar
from urllib.parse import urlparse

from trinity.data.operator import OperatorContext, TaskOperator

logger = logging.getLogger(__name__)

#: The three decisions a person can make about a pair.
CHOICES = ("answer1", "answer2", "skip")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pairs (
    pair_id TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    prompt TEXT NOT NULL,
    answer1 TEXT NOT NULL,
    answer2 TEXT NOT NULL,
    row TEXT NOT NULL,
    added_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS labels (
    pair_id TEXT PRIMARY KEY REFERENCES pairs(pair_id),
    choice TEXT NOT NULL CHECK (choice IN ('answer1', 'answer2', 'skip')),
    labelled_by TEXT NOT NULL,
    labelled_at TEXT NOT NULL
);
"""


def utc_now() -> str:
    """The current time as ISO 8601 UTC with seconds (``2026-01-31T12:00:00Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pair_id(prompt: str, answer1: str, answer2: str) -> str:
    """The key of a pair: the same prompt and answers are the same pair (labelled once)."""
    text = json.dumps([prompt, answer1, answer2], ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


class AlreadyLabelled(ValueError):
    """The pair has a label already; ``label`` is that first one (it stands)."""

    def __init__(self, label: Label) -> None:
        self.label = label
        super().__init__(
            f"pair {label.pair_id} was labelled already by {label.labelled_by} at {label.labelled_at}"
        )


@dataclass(frozen=True)
class Label:
    """One person's decision about one pair."""

    pair_id: str
    choice: str  # one of CHOICES
    labelled_by: str
    labelled_at: str  # ISO 8601 UTC


@dataclass(frozen=True)
class Pair:
    """A prompt with two answers to compare, and its label when it has one."""

    pair_id: str
    position: int
    prompt: str
    answer1: str
    answer2: str
    row: dict[str, Any]
    label: Label | None = None

    def to_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("pair_id", "position", "prompt", "answer1", "answer2")}
        out["label"] = None if self.label is None else self.label.__dict__.copy()
        return out


class PreferenceStore:
    """The pairs of one labelling project and their labels, in an SQLite file.

    Safe to use from several processes at once (the job that waits and the studio that labels):
    every call is one short transaction, and a label is inserted only where the pair has none,
    so two people clicking the same pair give one label.

    Args:
        path: the ``.db`` file (created with its folder when missing).
        project: the project's name, recorded in the file (shown by the studio).
    """

    def __init__(self, path: str, project: str | None = None) -> None:
        self.path = os.path.abspath(os.path.expanduser(path))
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with self._connect() as db:
            for statement in filter(str.strip, _SCHEMA.split(";")):
                db.execute(statement)
            if project:
                db.execute("INSERT OR IGNORE INTO meta VALUES ('project', ?)", (project,))
        self.project = self.meta().get("project") or os.path.splitext(os.path.basename(self.path))[0]

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")  # readers never block the writer, nor it them
            db.execute("BEGIN IMMEDIATE")
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.close()

    def meta(self) -> dict[str, str]:
        """The file's recorded settings (``project``, and what the operator records)."""
        with self._connect() as db:
            return dict(db.execute("SELECT key, value FROM meta").fetchall())

    def set_meta(self, **values: str) -> None:
        """Record settings (the page shows ``answer1_key`` / ``answer2_key`` as the answers' names)."""
        with self._connect() as db:
            db.executemany("INSERT OR REPLACE INTO meta VALUES (?, ?)", list(values.items()))

    def add_pairs(self, pairs: Sequence[tuple[str, str, str, Mapping[str, Any]]]) -> list[str]:
        """Add ``(prompt, answer1, answer2, row)`` pairs (those already there stay as they are,
        labels included); returns the ids, in order."""
        ids = []
        now = utc_now()
        with self._connect() as db:
            (start,) = db.execute("SELECT COALESCE(MAX(position), -1) + 1 FROM pairs").fetchone()
            for prompt, answer1, answer2, row in pairs:
                pid = pair_id(prompt, answer1, answer2)
                cursor = db.execute(
                    "INSERT OR IGNORE INTO pairs VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (pid, start, prompt, answer1, answer2, json.dumps(dict(row), ensure_ascii=False), now),
                )
                start += cursor.rowcount
                ids.append(pid)
        return ids

    def label(self, pid: str, choice: str, labelled_by: str) -> Label:
        """Record ``labelled_by``'s ``choice`` (``answer1``, ``answer2`` or ``skip``) for pair
        ``pid``, stamped with the current UTC time.

        Raises:
            KeyError: no such pair.
            AlreadyLabelled: the pair has a label (the first one stands).
            ValueError: an unknown choice or an empty name.
        """
        if choice not in CHOICES:
            raise ValueError(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        labelled_by = str(labelled_by or "").strip()
        if not labelled_by:
            raise ValueError("say who labels: a name is recorded with each label")
        with self._connect() as db:
            if db.execute("SELECT 1 FROM pairs WHERE pair_id = ?", (pid,)).fetchone() is None:
                raise KeyError(f"no pair {pid} in {self.path}")
            found = db.execute("SELECT * FROM labels WHERE pair_id = ?", (pid,)).fetchone()
            if found is not None:
                raise AlreadyLabelled(Label(*found))
            label = Label(pid, choice, labelled_by, utc_now())
            db.execute(
                "INSERT INTO labels VALUES (?, ?, ?, ?)", (pid, choice, labelled_by, label.labelled_at)
            )
        return label

    def pairs(self, ids: Sequence[str] | None = None, *, pending: bool = False) -> list[Pair]:
        """The pairs (``ids`` only, when given), in the order they were added, with their labels;
        ``pending``: only those without a label."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT p.pair_id, p.position, p.prompt, p.answer1, p.answer2, p.row, "
                "l.choice, l.labelled_by, l.labelled_at FROM pairs p "
                "LEFT JOIN labels l ON l.pair_id = p.pair_id ORDER BY p.position"
            ).fetchall()
        wanted = set(ids) if ids is not None else None
        out = []
        for pid, position, prompt, a1, a2, row, choice, by, at in rows:
            if wanted is not None and pid not in wanted:
                continue
            label = Label(pid, choice, by, at) if choice is not None else None
            if pending and label is not None:
                continue
            out.append(Pair(pid, position, prompt, a1, a2, json.loads(row), label))
        return out

    def next_pending(self, after: int = -1) -> Pair | None:
        """The first pair without a label whose position is after ``after`` (else the first
        one at all): what the page asks next."""
        with self._connect() as db:
            query = (
                "SELECT p.pair_id FROM pairs p LEFT JOIN labels l ON l.pair_id = p.pair_id "
                "WHERE l.pair_id IS NULL AND p.position > ? ORDER BY p.position LIMIT 1"
            )
            found = db.execute(query, (after,)).fetchone() or db.execute(query, (-1,)).fetchone()
        return self.pairs([found[0]])[0] if found else None

    def counts(self, ids: Sequence[str] | None = None) -> dict[str, int]:
        """``pairs``, ``labelled`` (chosen/rejected decided), ``skipped`` and ``pending``."""
        pairs = self.pairs(ids)
        labelled = sum(1 for p in pairs if p.label and p.label.choice != "skip")
        skipped = sum(1 for p in pairs if p.label and p.label.choice == "skip")
        return {
            "pairs": len(pairs),
            "labelled": labelled,
            "skipped": skipped,
            "pending": len(pairs) - labelled - skipped,
        }

    def dpo_rows(
        self,
        ids: Sequence[str] | None = None,
        *,
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
    ) -> list[dict[str, Any]]:
        """The labelled pairs (skipped ones left out) as DPO rows: the pair's task row with
        ``chosen_key`` / ``rejected_key`` set to the preferred and the other answer, and
        ``labelled_by`` / ``labelled_at``; in the order the pairs were added."""
        rows = []
        for pair in self.pairs(ids):
            if pair.label is None or pair.label.choice == "skip":
                continue
            first = pair.label.choice == "answer1"
            chosen, rejected = (pair.answer1, pair.answer2) if first else (pair.answer2, pair.answer1)
            rows.append(
                {
                    **pair.row,
                    chosen_key: chosen,
                    rejected_key: rejected,
                    "labelled_by": pair.label.labelled_by,
                    "labelled_at": pair.label.labelled_at,
                }
            )
        return rows


def find_stores(folder: str) -> list[str]:
    """The label stores (``annotation/*.db``) of the run folder ``folder``."""
    sub = os.path.join(folder, "annotation")
    try:
        names = sorted(os.listdir(sub))
    except OSError:
        return []
    return [os.path.join(sub, n) for n in names if n.endswith(".db")]


def _safe_name(name: str) -> str:
    return re.sub(r"[^\w.-]", "_", name).strip("._") or "labels"


class HumanPreferenceAnnotationMapper(TaskOperator):
    """People pick the better of two answers to each prompt, on the Labels page of Trinity
    Studio; each labelled pair becomes a DPO row (Trinity-RFT's ``human_preference_annotation_mapper``,
    which shows the pairs in Label Studio instead).

    Each row's ``prompt_key``, ``answer1_key`` and ``answer2_key`` go into the project's
    :class:`PreferenceStore` (``store_path``, else ``<job dir>/annotation/<project>.db``), at
    most ``max_tasks_per_batch`` pairs at a time. With ``wait_for_annotations`` the operator
    serves the Labels page at ``api_url`` (or uses the studio already serving that store there),
    says what it waits for and how far it got every ``poll_interval`` seconds, and waits up to
    ``timeout`` seconds per batch for every pair to be labelled or skipped before adding the next
    batch. It returns the labelled pairs as rows with ``chosen_key`` / ``rejected_key``,
    ``labelled_by`` and ``labelled_at``; skipped pairs, and pairs still unlabelled at the timeout
    (or without waiting), are left out and counted (``skipped``, ``unlabelled``). A restarted job
    asks only for the pairs not decided yet.

    ``api_key`` is the page's access token (required of every request when given; one is made
    for a ``api_url`` reachable from other machines). Label Studio's ``label_config_file``,
    ``project_id`` and notifications have no counterpart here: set, they are reported once.
    """

    whole_dataset = True  # waits for people: runs once, in the main process
    reusable_output = False  # the labels grow while the job waits: never reuse an older output

    #: Data-Juicer / Label Studio settings this operator has no use for, and why.
    _UNUSED: ClassVar[dict[str, str]] = {
        "label_config_file": "the Labels page has its own layout (prompt, two answers, skip)",
        "project_id": "projects are named by project_name_prefix and kept in store_path",
        "notification_config": "no notifications are sent; the log says what the operator waits for",
        "notification_events": "no notifications are sent",
    }

    def __init__(
        self,
        project_name_prefix: str = "Human_Preference_Annotation",
        wait_for_annotations: bool = False,
        timeout: float = 3600,
        poll_interval: float = 60,
        max_tasks_per_batch: int = 100,
        samples_per_task: int = 1,
        api_url: str = "http://127.0.0.1:7070",
        api_key: str | None = None,
        prompt_key: str = "prompt",
        answer1_key: str = "answer1",
        answer2_key: str = "answer2",
        chosen_key: str = "chosen",
        rejected_key: str = "rejected",
        store_path: str | None = None,
        label_config_file: str | None = None,
        project_id: int | str | None = None,
        notification_config: Mapping[str, Any] | None = None,
        notification_events: Mapping[str, bool] | None = None,
        text_key: str | None = None,  # Data-Juicer's: the prompt_key here
    ) -> None:
        if float(timeout) <= 0 or float(poll_interval) <= 0:
            raise ValueError("timeout and poll_interval must be positive (seconds)")
        if int(max_tasks_per_batch) < 1:
            raise ValueError("max_tasks_per_batch must be at least 1")
        parsed = urlparse(api_url)
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise ValueError(
                f"api_url must be an http URL (where the Labels page is served), got {api_url!r}"
            )
        self.project = _safe_name(project_name_prefix)
        self.wait, self.timeout, self.poll = bool(wait_for_annotations), float(timeout), float(poll_interval)
        self.batch = int(max_tasks_per_batch)
        self.api_url, self.api_key = api_url.rstrip("/"), api_key or None
        self.prompt_key, self.answer1_key, self.answer2_key = prompt_key, answer1_key, answer2_key
        self.chosen_key, self.rejected_key = chosen_key, rejected_key
        self.store_path = store_path
        self.root: str | None = None
        self._server: Any = None
        notify = bool((notification_config or {}).get("enabled"))  # upstream's example: enabled: false
        unused = {
            "label_config_file": label_config_file,
            "project_id": project_id,
            "notification_config": notification_config if notify else None,
            "notification_events": notification_events,
        }
        self._notes = [
            f"{key} has no effect here ({self._UNUSED[key]})" for key, value in unused.items() if value
        ]
        if int(samples_per_task) != 1:
            self._notes.append("samples_per_task is 1 here, as in Label Studio (one pair per page)")
        if text_key not in (None, prompt_key):
            self._notes.append(f"text_key has no effect here: the prompt is prompt_key ({prompt_key!r})")

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {
            "project_name_prefix": "Human_Preference_Annotation",
            "wait_for_annotations": False,
            "timeout": 3600,
            "poll_interval": 60,
            "max_tasks_per_batch": 100,
            "api_url": "http://127.0.0.1:7070",
            "prompt_key": "prompt",
            "answer1_key": "answer1",
            "answer2_key": "answer2",
            "chosen_key": "chosen",
            "rejected_key": "rejected",
        }

    def input_fields(self) -> list[str]:
        return [self.prompt_key, self.answer1_key, self.answer2_key]

    def bind(self, context: OperatorContext) -> None:
        import importlib.util

        from trinity.install_hints import install_hint

        if self.wait and importlib.util.find_spec("trinity_studio") is None:
            raise ValueError(
                "human_preference_annotation_mapper shows the pairs on the Labels page of Trinity Studio, "
                f"which is not installed: {install_hint('trinity-studio')}"
            )
        if self.store_path is None:
            if context.job_dir is None:
                raise ValueError(
                    "human_preference_annotation_mapper: no job folder to keep the labels in; set args.store_path"
                )
            self.store_path = os.path.join(context.job_dir, "annotation", f"{self.project}.db")
        self.store_path = os.path.abspath(os.path.expanduser(self.store_path))
        self.root = context.checkpoint_root or os.path.dirname(self.store_path)
        if not context.dry_run:
            for note in self._notes:
                logger.warning("human_preference_annotation_mapper: %s", note)

    def process(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        if self.store_path is None:
            self.bind(OperatorContext())  # used outside a pipeline: store_path must be given
        store = PreferenceStore(self.store_path, self.project)  # type: ignore[arg-type]
        store.set_meta(
            prompt_key=self.prompt_key,
            answer1_key=self.answer1_key,
            answer2_key=self.answer2_key,
            chosen_key=self.chosen_key,
            rejected_key=self.rejected_key,
        )
        pairs, missing = [], 0
        for row in rows:
            fields = [row.get(k) for k in (self.prompt_key, self.answer1_key, self.answer2_key)]
            if any(f is None for f in fields):
                missing += 1
                continue
            pairs.append((*(str(f) for f in fields), row))
        if missing:
            logger.warning(
                "human_preference_annotation_mapper: %d rows without %s, %s or %s left out",
                missing, self.prompt_key, self.answer1_key, self.answer2_key,
            )  # fmt: skip
        ids: list[str] = []
        timed_out = 0
        try:
            for start in range(0, len(pairs), self.batch):
                batch = store.add_pairs(pairs[start : start + self.batch])
                ids.extend(batch)
                if self.wait:
                    timed_out += self._wait_for(store, batch, start // self.batch + 1, len(pairs))
        finally:
            self.close()
        ids = list(dict.fromkeys(ids))  # a pair given twice is labelled (and returned) once
        counts = store.counts(ids)
        out = store.dpo_rows(ids, chosen_key=self.chosen_key, rejected_key=self.rejected_key)
        if counts["pending"]:
            why = (
                f"still unlabelled after waiting {self.timeout:g} s"
                if self.wait
                else "not labelled yet (wait_for_annotations is false)"
            )
            logger.warning(
                "human_preference_annotation_mapper: %d of %d pairs %s are left out; label them on the "
                "Labels page and run the job again to include them",
                counts["pending"], counts["pairs"], why,
            )  # fmt: skip
        metrics = {
            "pairs": float(counts["pairs"]),
            "labelled": float(counts["labelled"]),
            "skipped": float(counts["skipped"]),
            "unlabelled": float(counts["pending"]),
            "missing_fields": float(missing),
            "timed_out_batches": float(timed_out),
        }
        return out, metrics

    def _wait_for(self, store: PreferenceStore, batch: list[str], number: int, total: int) -> int:
        """Wait until every pair of ``batch`` is decided, up to ``timeout``; 1 when it timed out."""
        counts = store.counts(batch)
        if not counts["pending"]:
            return 0
        url = self._serve(store)
        deadline = time.monotonic() + self.timeout
        logger.info(
            "human_preference_annotation_mapper: waiting up to %g s for %d labels of batch %d "
            "(%d pairs in all) of project %r: label them at %s (store %s)",
            self.timeout, counts["pending"], number, total, store.project, url, store.path,
        )  # fmt: skip
        last, said = counts, time.monotonic()
        while counts["pending"]:
            left = deadline - time.monotonic()
            if left <= 0:
                return 1
            time.sleep(min(self.poll, left))
            counts = store.counts(batch)
            # Progress when it changes, and at least once a minute while nothing happens.
            if counts != last or time.monotonic() - said >= 60:
                said = time.monotonic()
                logger.info(
                    "human_preference_annotation_mapper: %d of %d pairs of batch %d decided (%d skipped), "
                    "waiting for %d more at %s (%d s left)",
                    counts["pairs"] - counts["pending"], counts["pairs"], number, counts["skipped"],
                    counts["pending"], url, max(0, int(deadline - time.monotonic())),
                )  # fmt: skip
            last = counts
        return 0

    def _serve(self, store: PreferenceStore) -> str:
        """Where the Labels page of ``store`` is: a studio already serving it at ``api_url``, else
        one started here (stopped by :meth:`close`)."""
        if self._server is None:
            from trinity_studio.labels import serve_labels

            self._server = serve_labels(store.path, self.api_url, token=self.api_key, root=self.root)
        return self._server.page_url

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
