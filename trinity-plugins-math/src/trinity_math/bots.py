"""BOTS (Bayesian Online Task Selection): the math workflows of Trinity-RFT's ``examples/bots``
and the tool that turns a reference model's evaluation into the pass-rate columns BOTS selects by.

* ``bots_math_boxed_workflow`` (also registered under Trinity-RFT's class path
  ``examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow``, which
  ``bots.yaml`` names): ``math_boxed_workflow`` for rows whose prompt (``format.prompt_key``)
  is already a chat (a list of messages, sent as it is; a text prompt works too) and whose keys
  may be dotted paths into nested columns (``reward_model.ground_truth``).
* ``bots_ref_eval_collect_math_boxed_workflow`` (``ref_eval_collect.yaml``): the same, and each
  task appends one JSON line to the file ``$BOTS_REF_EVAL_LOG_FILE`` (default
  ``./bots_ref_eval_log.jsonl``, relative to the runner's working folder): ``{"model_version",
  "rewards": [one per rollout], "question": the prompt, "truth"}``. Run with ``mode: explore``
  on the reference model, it records how that model does on every task of the taskset.
* ``python -m trinity_math.bots --data-path D --ref-eval-path LOG --ref-eval-key COLUMN``
  (:func:`merge_ref_eval`, Trinity-RFT's ``ref_eval_collect.py``): writes each row's mean
  reward in the log (its pass rate, for 0/1 rewards) into column ``COLUMN`` of the taskset file
  ``D`` (``.parquet`` or ``.jsonl``, rewritten in place). ``difficulty_based`` (BOTS, in
  trinity-plugins-algos) reads these columns through ``data_selector.feature_keys``.

Rows are matched to log lines by their whole prompt (Trinity-RFT's script matched the first
message's text only, which a shared system message would make ambiguous). A row the log does
not cover gets 0.0, as Trinity-RFT's script does, and is counted; all lines of one prompt are
pooled (a task split over runners, or logged twice, counts every rollout once).

The reward is ``math_boxed_reward`` (math-verify's equivalence) where Trinity-RFT's example used
its own grader adapted from Reasoning360.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from trinity.workflow import Task
from trinity_math.workflows import MathBoxedWorkflow

LOG_FILE_ENV = "BOTS_REF_EVAL_LOG_FILE"
"""Environment variable naming the reference-evaluation log (Trinity-RFT's name)."""
DEFAULT_LOG_FILE = "./bots_ref_eval_log.jsonl"
"""The log when ``$BOTS_REF_EVAL_LOG_FILE`` is not set (relative to the runner's folder)."""
logger = logging.getLogger(__name__)
# Tasksets already told that their system prompt / reply prefix does not apply to chat prompts.
_warned_unused_format: dict[str, bool] = {}

UPSTREAM_CLASS_PATH = "examples.bots.workflow.bots_math_boxed_workflow.BOTSMathBoxedWorkflow"
"""The class path Trinity-RFT's ``bots.yaml`` names as its workflow."""


def nested_value(row: Any, key: str) -> Any:
    """``row[key]``, or for a dotted ``key`` (``reward_model.ground_truth``) the value down that
    path of nested objects; ``None`` when a step is missing. A column whose own name holds the
    dots is found too."""
    if not isinstance(row, dict):
        return None
    if key in row:
        return row[key]
    value: Any = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _prompt_problem(prompt: Any, key: str) -> str | None:
    from trinity.buffer.rows import check_messages, type_name

    if prompt is None:
        return f"missing prompt {key!r}"
    if isinstance(prompt, str):
        return None if prompt.strip() else f"prompt {key!r} is empty"
    if isinstance(prompt, list):
        return check_messages(prompt, key)
    return f"prompt {key!r} must be a chat (list of messages) or a text, got {type_name(prompt)}"


class BOTSMathBoxedWorkflow(MathBoxedWorkflow):
    """``bots_math_boxed_workflow``: ``math_boxed_workflow`` on rows whose prompt is a chat,
    with dotted (nested) ``prompt_key`` / ``response_key`` (see the module doc).

    A chat prompt is sent as it is (the taskset's system prompt is not added: the chat has its
    own); a text prompt gets ``math_boxed_workflow``'s messages. ``workflow_args`` as
    ``math_boxed_workflow``'s (``use_base`` needs a text prompt).
    """

    @classmethod
    def row_problem(cls, row: dict[str, Any], format_args: Any) -> str | None:
        """A usable prompt under ``prompt_key`` and an answer under ``response_key`` (both may
        be dotted paths)."""
        problem = _prompt_problem(nested_value(row, format_args.prompt_key), format_args.prompt_key)
        if problem:
            return problem
        truth = nested_value(row, format_args.response_key)
        if truth is None or isinstance(truth, (dict, list)):
            return f"missing answer {format_args.response_key!r} (a text or number)"
        return None

    def read_prompt(self, task: Task) -> Any:
        prompt = nested_value(task.raw_task, task.format_args.prompt_key)
        return [dict(m) for m in prompt] if isinstance(prompt, list) else prompt

    def read_truth(self, task: Task) -> str | None:
        truth = nested_value(task.raw_task, task.format_args.response_key)
        return None if truth is None else str(truth)

    def _configure(self, workflow_args: dict[str, Any]) -> None:
        super()._configure(workflow_args)
        if self.use_base and not isinstance(self.task_desc, str):
            raise ValueError(
                f"{self.display_name}: workflow_args.use_base needs a text prompt, but task "
                f"{self.task.index} of taskset {self.task.taskset_name!r} has a chat"
            )

    def format_messages(self) -> list[dict[str, str]]:
        if isinstance(self.task_desc, list):
            fmt = self.task.format_args
            unused = [k for k in ("system_prompt", "reply_prefix") if getattr(fmt, k)]
            if unused and not _warned_unused_format.get(self.task.taskset_name):
                _warned_unused_format[self.task.taskset_name] = True
                logger.warning(
                    "taskset %r: format.%s not used: its prompts are chats, sent as they are",
                    self.task.taskset_name,
                    " and format.".join(unused),
                )
            return [dict(m) for m in self.task_desc]  # the prompts are chats already
        return super().format_messages()


class BOTSRefEvalCollectMathBoxedWorkflow(BOTSMathBoxedWorkflow):
    """``bots_ref_eval_collect_math_boxed_workflow``: ``bots_math_boxed_workflow`` that also
    appends each task's rewards to the reference-evaluation log (see the module doc)."""

    def run(self) -> list[Any]:
        responses = super().run()
        self.record(responses)
        return responses

    async def run_async(self) -> list[Any]:
        responses = await super().run_async()
        self.record(responses)
        return responses

    def record(self, responses: Sequence[Any]) -> None:
        """Append this task's line to the log (one write under an exclusive lock: runners in
        several processes share the file)."""
        entry = {
            "model_version": self.model.model_version,
            "rewards": [r.reward for r in responses],
            "question": self.task_desc,
            "truth": self.truth,
        }
        append_log_line(log_file_path(), json.dumps(entry, ensure_ascii=False))


def log_file_path() -> str:
    """The reference-evaluation log: ``$BOTS_REF_EVAL_LOG_FILE`` or :data:`DEFAULT_LOG_FILE`."""
    return os.path.abspath(os.environ.get(LOG_FILE_ENV) or DEFAULT_LOG_FILE)


def append_log_line(path: str, line: str) -> None:
    import fcntl

    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(line + "\n")
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


# -- merging a log into the taskset -------------------------------------------------------------


def _plain(value: Any) -> Any:
    """``value`` as JSON types (numpy arrays and scalars from a parquet reader become lists and numbers)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "tolist"):  # numpy array or scalar
        return _plain(value.tolist())
    return value


def prompt_key(prompt: Any) -> str:
    """The text a prompt is matched by: its canonical JSON."""
    return json.dumps(_plain(prompt), sort_keys=True, ensure_ascii=False)


def read_ref_eval_log(path: str) -> tuple[dict[str, list[float]], int]:
    """The log's rewards by prompt (:func:`prompt_key`), pooled over its lines, and the number
    of unreadable lines."""
    rewards: dict[str, list[float]] = defaultdict(list)
    bad = 0
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
                values = [float(r) for r in entry["rewards"]]
                rewards[prompt_key(entry["question"])].extend(v for v in values if math.isfinite(v))
            except (ValueError, KeyError, TypeError):
                bad += 1
    return dict(rewards), bad


class MergeError(ValueError):
    """The log cannot be merged into the taskset; the message says why (one line)."""


def merge_ref_eval(
    data_path: str, log_path: str, column: str, prompt_column: str = "prompt"
) -> dict[str, int]:
    """Write each row's mean reward in the log at ``log_path`` into ``column`` of the taskset
    file ``data_path`` (``.parquet`` or ``.jsonl``, rewritten in place); rows are matched by
    their prompt (``prompt_column``, a dotted path allowed). Returns counts: ``rows``,
    ``matched`` (rows the log covers), ``unmatched`` (rows set to 0.0), ``unknown_prompts``
    (log prompts no row has) and ``bad_lines`` (unreadable log lines). Raises
    :class:`MergeError` when no row matches (the wrong file or prompt column)."""
    from trinity.buffer.dataset import load_rows

    lower = data_path.lower()
    if not (lower.endswith(".parquet") or lower.endswith(".jsonl")) or not os.path.isfile(data_path):
        raise MergeError(f"{data_path}: give the taskset's .parquet or .jsonl file")
    rewards, bad_lines = read_ref_eval_log(log_path)
    # The rows as the taskset reader reads them, so that prompts compare equal to the logged ones.
    rows = load_rows(data_path)
    values: list[float] = []
    seen: set[str] = set()
    matched = 0
    for raw in rows:
        key = prompt_key(nested_value(raw.value, prompt_column)) if raw.error is None else None
        pooled = rewards.get(key) if key is not None else None
        if pooled:
            seen.add(key)
            matched += 1
        values.append(math.fsum(pooled) / len(pooled) if pooled else 0.0)
    report = {
        "rows": len(values),
        "matched": matched,
        "unmatched": len(values) - matched,
        "unknown_prompts": len(set(rewards) - seen),
        "bad_lines": bad_lines,
    }
    if not report["matched"]:
        raise MergeError(
            f"none of the {len(values)} rows of {data_path} has a prompt ({prompt_column!r}) found in "
            f"{log_path} ({len(rewards)} prompts): the wrong file, or the wrong --prompt-key"
        )
    if lower.endswith(".parquet"):
        _write_parquet_column(data_path, column, values)
    else:
        _write_jsonl_column(
            data_path, column, {raw.row: v for raw, v in zip(rows, values) if raw.error is None}
        )
    return report


def _write_parquet_column(path: str, column: str, values: list[float]) -> None:
    import pandas as pd

    frame = pd.read_parquet(path)
    if len(frame) != len(values):
        raise MergeError(f"{path}: read {len(values)} rows but pandas reads {len(frame)}")
    frame[column] = values
    tmp = f"{path}.tmp-{os.getpid()}"
    frame.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def _write_jsonl_column(path: str, column: str, by_line: dict[int, float]) -> None:
    with open(path, "rb") as fh:
        lines = fh.readlines()
    out = []
    for lineno, data in enumerate(lines, start=1):
        if lineno in by_line:
            row = json.loads(data.decode("utf-8-sig" if lineno == 1 else "utf-8"))
            row[column] = by_line[lineno]
            data = (json.dumps(row, ensure_ascii=False) + "\n").encode()
        out.append(data)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.writelines(out)
    os.replace(tmp, path)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trinity_math.bots``: merge a reference-evaluation log into a taskset."""
    parser = argparse.ArgumentParser(
        prog="python -m trinity_math.bots",
        description="Write a reference model's pass rates (a bots_ref_eval_collect_math_boxed_workflow "
        "log) into a column of the taskset, for BOTS's data_selector.feature_keys.",
    )
    parser.add_argument("--data-path", required=True, help="the taskset file (.parquet or .jsonl), rewritten")
    parser.add_argument("--ref-eval-path", required=True, help="the log ($BOTS_REF_EVAL_LOG_FILE)")
    parser.add_argument(
        "--ref-eval-key", required=True, help="the column to write, e.g. qwen2.5_7b_pass_rate"
    )
    parser.add_argument("--prompt-key", default="prompt", help="the prompt column (format.prompt_key)")
    args = parser.parse_args(argv)
    try:
        report = merge_ref_eval(args.data_path, args.ref_eval_path, args.ref_eval_key, args.prompt_key)
    except (MergeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"{args.data_path}: column {args.ref_eval_key!r} written for {report['rows']} rows "
        f"({report['matched']} evaluated, {report['unmatched']} not in the log: set to 0.0); "
        f"{report['unknown_prompts']} logged prompts match no row, {report['bad_lines']} log lines unreadable"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
