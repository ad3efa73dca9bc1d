"""The task pipeline: ``data_processor.task_pipeline`` turns raw task files into the explorer's
taskset before the job explores.

The driver runs it before starting the actors: it reads ``inputs`` (jsonl, json, parquet, csv
or dataset folders; unreadable rows are skipped and counted), keeps ``target_fields``, runs the
operators in order and writes ``<job dir>/task_pipeline/<split>.jsonl``. The output taskset
(``task_pipeline.output``, else the first training taskset) then reads that folder. A
``manifest.json`` beside it records what produced it (inputs' sizes and times, the operators
and their arguments): a resumed or repeated job whose pipeline did not change reuses the file
instead of recomputing it (LLM scoring can take hours).

``priority_weights`` orders the rows by a weighted priority of their stats before ``top_k``
(:mod:`trinity.data.priority`). ``config_path`` (a Data-Juicer recipe) replaces ``operators`` with one ``data_juicer`` operator
running that recipe, as in Trinity-RFT. An operator scoring with one of
``explorer.auxiliary_models`` gets that model served here, in the driver, for the pipeline's
run: the caller passes the job's model server (the launcher passes
:class:`trinity.serving.auxiliary.ServedModels`; see :mod:`trinity.data.served_models`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Any

from trinity.config.pipelines import pipeline_output, task_operators, trains_on_pipeline_output

if TYPE_CHECKING:
    from trinity.config import Config, InferenceModelConfig
    from trinity.config.sections.data import TaskPipelineConfig
    from trinity.data.operator import TaskOperator
    from trinity.data.served_models import ModelServer

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"


def _fingerprint(tp: TaskPipelineConfig, inputs: list[str]) -> str:
    def stat(path: str) -> list[Any]:
        try:
            st = os.stat(path)
        except OSError:
            return [path, None, None]
        return [os.path.abspath(path), st.st_size, int(st.st_mtime)]

    desc = {
        "inputs": [stat(p) for p in inputs],
        "operators": [{"name": op.name, "args": op.args} for op in task_operators(tp)],
        "target_fields": list(tp.target_fields),
        "top_k": tp.top_k,
        "priority_weights": dict(tp.priority_weights),
    }
    return hashlib.sha256(json.dumps(desc, sort_keys=True, default=str).encode()).hexdigest()


def _run_batches(
    op: TaskOperator, rows: list[dict[str, Any]], workers: int
) -> tuple[list[dict], dict[str, float]]:
    if op.whole_dataset or len(rows) <= op.batch_size:
        kept, metrics = op.process(list(rows))
        return list(kept), dict(metrics or {})
    batches = [rows[i : i + op.batch_size] for i in range(0, len(rows), op.batch_size)]
    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            results = list(pool.map(op.process, batches))
    else:
        results = [op.process(batch) for batch in batches]
    kept: list[dict[str, Any]] = []
    totals: dict[str, float] = {}
    for batch_rows, metrics in results:
        kept.extend(batch_rows)
        for key, value in (metrics or {}).items():
            totals[key] = totals.get(key, 0.0) + float(value)
    return kept, totals


def read_inputs(inputs: list[str], target_fields: list[str], split: str) -> tuple[list[dict[str, Any]], int]:
    """The rows of ``inputs`` (only ``target_fields`` when given) and how many were unusable."""
    from trinity.buffer.dataset import load_rows

    rows, skipped = [], 0
    for path in inputs:
        for raw in load_rows(path, split=split):
            if raw.error or not isinstance(raw.value, dict):
                skipped += 1
                logger.warning("task pipeline: skipped %s: %s", raw.where, raw.error or "not a JSON object")
                continue
            row = raw.value
            if target_fields:
                missing = [f for f in target_fields if f not in row]
                if missing:
                    skipped += 1
                    logger.warning("task pipeline: skipped %s: no field %s", raw.where, ", ".join(missing))
                    continue
                row = {f: row[f] for f in target_fields}
            rows.append(row)
    return rows, skipped


def run_task_pipeline(
    config: Config, served: ModelServer | None = None
) -> tuple[str, dict[str, float]] | None:
    """Run ``config``'s task pipeline (or reuse its cached output); returns the output folder and
    the pipeline's counts, or ``None`` when there is no task pipeline to run.

    ``served`` serves the ``explorer.auxiliary_models`` an operator asks for (the caller closes
    it); without it an operator naming one of them fails with one line."""
    from trinity.data.operator import TaskOperator
    from trinity.data.pipeline import bind_operators, build_operator, operator_context

    tp = config.data_processor.task_pipeline if config.data_processor else None
    if tp is None or not task_operators(tp):
        return None
    output = pipeline_output(config)
    if output is None:
        raise ValueError(
            "data_processor.task_pipeline has no output taskset: add buffer.explorer_input.taskset"
        )
    split = output.split or "train"
    inputs = [os.path.expanduser(p) for p in tp.inputs]
    if not inputs:
        raise ValueError("data_processor.task_pipeline.inputs names no input file")
    folder = os.path.join(config.checkpoint_job_dir, "task_pipeline")
    out_file = os.path.join(folder, f"{split}.jsonl")
    manifest_file = os.path.join(folder, MANIFEST)
    fingerprint = _fingerprint(tp, inputs)
    key = "data_processor.task_pipeline.operators"
    ops = [
        (op.name, build_operator(op, TaskOperator, f"{key}[{i}]")) for i, op in enumerate(task_operators(tp))
    ]
    reusable = all(op.reusable_output for _, op in ops)  # type: ignore[attr-defined]
    if reusable and os.path.isfile(out_file) and os.path.isfile(manifest_file):
        with open(manifest_file) as f:
            manifest = json.load(f)
        if manifest.get("fingerprint") == fingerprint:
            logger.info("task pipeline: reusing %s (inputs and operators unchanged)", out_file)
            for _, op in ops:
                op.close()
            return folder, {k: float(v) for k, v in manifest.get("counts", {}).items()}
    fields = list(tp.target_fields)
    if fields:  # what the operators read stays in the rows too
        fields += [f for _, op in ops for f in op.input_fields() if f not in fields]  # type: ignore[attr-defined]
    rows, skipped = read_inputs(inputs, fields, split)
    counts: dict[str, float] = {"input_rows": float(len(rows) + skipped), "skipped_rows": float(skipped)}
    model_url = served.url if served is not None else _not_served(config.explorer.auxiliary_models)
    bind_operators(ops, operator_context(config, model_url), key)
    try:
        for name, op in ops:
            before = len(rows)
            rows, metrics = _run_batches(op, rows, tp.num_process)  # type: ignore[arg-type]
            counts[f"{name}/dropped"] = float(before - len(rows))
            counts.update({f"{name}/{k}": float(v) for k, v in metrics.items()})
    finally:
        for _, op in ops:
            op.close()
    if tp.priority_weights:
        from trinity.data.priority import order_by_priority

        rows, ordered = order_by_priority(rows, tp.priority_weights)
        counts.update(ordered)
    if tp.top_k > 0:
        rows = rows[: tp.top_k]
    counts["output_rows"] = float(len(rows))
    os.makedirs(folder, exist_ok=True)
    tmp = out_file + ".tmp"
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp, out_file)  # a crash never leaves half a taskset that looks finished
    with open(manifest_file, "w") as f:
        json.dump({"fingerprint": fingerprint, "counts": counts}, f, indent=1)
    logger.info(
        "task pipeline: %d rows -> %d (%s)",
        int(counts["input_rows"]),
        len(rows),
        ", ".join(f"{name} dropped {int(counts[f'{name}/dropped'])}" for name, _ in ops),
    )
    return folder, counts


def _not_served(configs: Sequence[InferenceModelConfig]) -> Callable[[str], str | None]:
    """``model_url`` without a model server: an auxiliary model's name is an error, not a
    silent fall-back to ``$OPENAI_BASE_URL``."""
    from trinity.data.served_models import find_auxiliary

    def url(name: str) -> str | None:
        if find_auxiliary(configs, name) is not None:
            raise ValueError(
                f"auxiliary model {name!r} is not served in this process (the task pipeline was run "
                "without a model server)"
            )
        return None

    return url


def apply_task_pipeline(config: Config, served: ModelServer | None = None) -> Config:
    """``config`` with its output taskset reading the task pipeline's output (run or reused);
    ``config`` itself when it has no task pipeline. ``served``: see :func:`run_task_pipeline`."""
    result = run_task_pipeline(config, served)
    if result is None:
        return config
    folder, counts = result
    print(
        f"[trinity] task pipeline: {int(counts['input_rows'])} rows -> {int(counts['output_rows'])} "
        f"tasks in {folder}",
        flush=True,
    )
    trains_on_it = trains_on_pipeline_output(config)
    config = config.model_copy(deep=True)
    tp = config.data_processor.task_pipeline
    if trains_on_it:
        target = config.buffer.trainer_input.experience_buffer
    else:
        target = tp.output if tp.output is not None else config.buffer.explorer_input.tasksets[0]
    target.path = folder
    target.subset_name = None
    if tp.output is not None and config.buffer.explorer_input.tasksets:
        # The output taskset is the explorer's first training taskset (Trinity-RFT's rule).
        config.buffer.explorer_input.tasksets[0].path = folder
        config.buffer.explorer_input.tasksets[0].subset_name = None
    return config
