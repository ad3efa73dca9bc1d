"""The Explorer: reads tasks, runs workflows on the rollout engines, writes Experiences.

A plain class (the launcher wraps it in a Ray actor). One explore step:

1. read ``buffer.batch_size`` tasks from the training tasksets;
2. run them on the runner pool (``explorer.runner_per_model`` runners per engine);
   with ``explorer.over_rollout`` the step goes on once ``ceil((1 - ratio) * batch_size)``
   tasks finished (and the rest had ``wait_after_min`` more seconds); the others are dropped,
   or with ``over_rollout.partial_rollout`` the started ones are carried into the next step: the
   engines are paused there (a sync point: their samples keep the tokens they have) and resume,
   with whatever weights were loaded in between, when the explorer next works (a sync, an eval
   or the next step); carried tasks whose weights are more than ``max_staleness`` versions old
   by then are dropped (``rollout/partial_rollout/...`` metrics);
3. stamp every Experience with its ``eid`` (batch = step, task = position in the batch,
   run = repeat index) and the model version, write them to the experience buffer;
4. return metrics (``rollout/...``, ``timing/...``).

:meth:`Explorer.eval` runs the eval tasksets (``eval/<taskset>/...``), :meth:`Explorer.bench`
evaluates saved checkpoints, :meth:`Explorer.sync_weights` loads new weights into every
engine, and :meth:`Explorer.receive_weights` has them receive a broadcast from the trainer
(``sync_method: nccl``, after :meth:`Explorer.init_weight_group`). When to explore, evaluate
and sync is the launcher's step loop's decision (:mod:`trinity.launcher`), not the explorer's.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity.explorer.runner import DynamicTimeout, RunnerPool, TaskResult, failure_report, summarize_results

if TYPE_CHECKING:
    from trinity.buffer.base import BufferWriter
    from trinity.config import Config
    from trinity.experience import Experience
    from trinity.explorer.partial_rollout import PartialRollouts
    from trinity.rollout.base import RolloutEngine
    from trinity.sync.group import GroupSpec
    from trinity.workflow import Task

logger = logging.getLogger(__name__)

# Key of the one-line failure report in a step's metrics (a string, so monitors skip it).
FAILURES_KEY = "rollout/failures"
#: Most workflow runners per engine an eval uses: an eval taskset's tasks run at once (up to
#: this many), so the engine batches their calls into a few large generate calls instead of
#: waves of ``runner_per_model``.
EVAL_RUNNERS_PER_ENGINE = 128


def _stats(prefix: str, values: list[float]) -> dict[str, float]:
    """Mean, std, max and min of the finite ``values`` (plain floats: ``statistics.pstdev``
    goes through exact fractions and fails on NaN or infinity)."""
    values = [v for v in values if math.isfinite(v)]
    if not values:
        return {}
    mean = math.fsum(values) / len(values)
    return {
        f"{prefix}_mean": mean,
        f"{prefix}_std": math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values)),
        f"{prefix}_max": max(values),
        f"{prefix}_min": min(values),
    }


def _as_float(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if math.isfinite(number) else None


def rollout_metrics(
    experiences: list[Experience], seconds: float, prefix: str = "rollout"
) -> dict[str, float]:
    """Reward and length statistics, throughput, the experiences the token limits touched
    (``prompt_truncated_experiences``: placeholders of prompts over ``max_prompt_tokens``, masked
    out of training; ``response_truncated_experiences``: conversations cut at ``max_model_len``),
    and the mean of every workflow metric (values that are not finite numbers are left out)."""
    rewards = [float(e.reward) for e in experiences if e.reward is not None]
    status = [(e.info or {}).get("truncate_status") for e in experiences]
    out = {
        f"{prefix}/num_experiences": float(len(experiences)),
        f"{prefix}/prompt_truncated_experiences": float(status.count("prompt_truncated")),
        f"{prefix}/response_truncated_experiences": float(status.count("response_truncated")),
        **_stats(f"{prefix}/reward", rewards),
        **_stats(f"{prefix}/response_length", [float(e.response_length) for e in experiences]),
        **_stats(f"{prefix}/prompt_length", [float(e.prompt_length) for e in experiences]),
    }
    tokens = sum(e.response_length for e in experiences)
    if seconds > 0:
        out[f"{prefix}/tokens_per_second"] = tokens / seconds
    per_name: dict[str, list[float]] = defaultdict(list)
    for e in experiences:
        for name, value in (e.metrics or {}).items():
            number = _as_float(value)
            if number is not None:
                per_name[name].append(number)
    for name, values in per_name.items():
        out.setdefault(f"{prefix}/{name}", math.fsum(values) / len(values))
    return out


def accuracy_metrics(results: list[TaskResult], prefix: str) -> dict[str, float]:
    """``<prefix>/accuracy`` (= mean@k), ``mean@k``, ``pass@k`` (best of k), ``worst@k``.

    A rollout's accuracy is its ``metrics["accuracy"]`` when the workflow reports one, else its
    reward; for 0/1 accuracies the best of k is pass@k. ``k`` is the tasks' ``repeat_times``.
    """
    per_task = []
    k = 1
    for r in results:
        if not r.ok or not r.experiences:
            per_task.append([0.0])  # a task that failed counts as unsolved
            continue
        k = max(k, r.task.repeat_times)
        runs: dict[int, list[float]] = defaultdict(list)
        for e in r.experiences:
            runs[e.eid.run].append(_as_float(e.metrics.get("accuracy", e.reward or 0.0)) or 0.0)
        per_task.append([max(v) for v in runs.values()])  # multi-step runs: the best step
    if not per_task:
        return {}
    mean_k = statistics.fmean(statistics.fmean(a) for a in per_task)
    return {
        f"{prefix}/accuracy": mean_k,
        f"{prefix}/accuracy/mean@{k}": mean_k,
        f"{prefix}/accuracy/pass@{k}": statistics.fmean(max(a) for a in per_task),
        f"{prefix}/accuracy/worst@{k}": statistics.fmean(min(a) for a in per_task),
    }


class Explorer:
    """Explores with the rollout engines of ``config``.

    Args:
        config: a resolved :class:`~trinity.config.Config`.
        engines: rollout engines to use instead of creating them from
            ``explorer.rollout_model`` (tests, or engines living in other actors).
        auxiliary_engines: likewise for ``explorer.auxiliary_models`` (``engine_num`` engines
            per configured model, in config order).
        writer: experience writer instead of the one from ``buffer.trainer_input``.
        taskset_reader: training task source (``read_batch()``, ``metrics()``, ``state_dict()``,
            optionally ``feedback()``) instead of the configured one.
    """

    def __init__(
        self,
        config: Config,
        *,
        engines: list[RolloutEngine] | None = None,
        auxiliary_engines: list[RolloutEngine] | None = None,
        writer: BufferWriter | None = None,
        taskset_reader: Any = None,
    ) -> None:
        from trinity.explorer.model_wrapper import model_wrappers_for
        from trinity.rollout import create_engines

        self.config = config
        ex = config.explorer
        self.engines = engines if engines is not None else create_engines(ex.rollout_model)
        aux_configs = ex.auxiliary_models
        if auxiliary_engines is None:
            aux_groups = [create_engines(aux) for aux in aux_configs]
        else:
            aux_groups = _group_by_config(auxiliary_engines, aux_configs)
        self.auxiliary_engines = [e for group in aux_groups for e in group]
        self._auxiliary_engine_groups = aux_groups
        # One wrapper per runner (sharing the engine): a wrapper's history and OpenAI server
        # then belong to one workflow at a time, never to two tasks running concurrently.
        per_engine = ex.runner_per_model
        runners = len(self.engines) * per_engine
        self.models = model_wrappers_for(
            ex.rollout_model, [e for e in self.engines for _ in range(per_engine)], name="rollout"
        )
        self.auxiliary_model_groups = [
            model_wrappers_for(
                aux, [group[k % len(group)] for k in range(runners)], name=aux.name or f"auxiliary_{i}"
            )
            for i, (aux, group) in enumerate(zip(aux_configs, aux_groups))
        ]
        self.auxiliary_models = [m for group in self.auxiliary_model_groups for m in group]
        dynamic = ex.dynamic_timeout
        # over_rollout: a step goes on once this many of its tasks finished (as Trinity-RFT).
        over = ex.over_rollout
        self.min_finished = math.ceil(config.buffer.batch_size * (1 - over.ratio)) if over.ratio > 0 else None
        partial = bool(over.partial_rollout and self.min_finished is not None)
        if partial and not all(getattr(e, "supports_partial_rollout", False) for e in self.engines):
            partial = False
            logger.warning(
                "explorer.over_rollout.partial_rollout: the %s rollout engine cannot pause and resume "
                "its samples; unfinished tasks are dropped at the end of a step instead",
                ex.rollout_model.engine_type,
            )
        pool_class = RunnerPool
        if partial:
            from trinity.explorer.partial_rollout import CarryingRunnerPool

            pool_class = CarryingRunnerPool
        self.pool = pool_class(
            [self.models[i * per_engine : (i + 1) * per_engine] for i in range(len(self.engines))],
            auxiliary_models=self.auxiliary_model_groups,
            runner_per_model=ex.runner_per_model,
            max_timeout=ex.max_timeout,
            max_retry_times=ex.max_retry_times,
            env_vars=ex.env_vars,
            dynamic_timeout=DynamicTimeout(
                ex.max_timeout, dynamic.ratio, dynamic.warmup_min_steps * config.buffer.batch_size
            )
            if dynamic.enable
            else None,
            return_partial_tasks=ex.over_rollout.return_partial_tasks,
        )
        #: Partial rollouts (``over_rollout.partial_rollout``): carry the tasks a step ends without.
        self.partial: PartialRollouts | None = None
        if partial:
            from trinity.explorer.partial_rollout import PartialRollouts

            self.partial = PartialRollouts(self.engines, self.pool, over.max_staleness)
        self._writer = writer
        self._reader = taskset_reader
        self._eval_pool: tuple[int, RunnerPool, list[Any]] | None = None  # (runners, pool, wrappers)
        self.explore_step_num = 0
        self.finished = False

    # -- lazily built buffer ends (so eval/bench need no experience buffer) --------------

    @property
    def writer(self) -> BufferWriter:
        if self._writer is None:
            from trinity.buffer.factory import get_buffer_writer, run_name
            from trinity.data.pipeline import with_experience_pipeline
            from trinity.serving.auxiliary import ServedModels

            buffer = self.config.buffer
            writer = get_buffer_writer(
                buffer.trainer_input.experience_buffer, cache_dir=buffer.cache_dir, run=run_name(self.config)
            )
            # data_processor.experience_pipeline runs here, on each step's experiences; its LLM
            # operators may call the auxiliary models loaded above (served on first request).
            groups = self._auxiliary_engine_groups
            served = ServedModels(self.config.explorer.auxiliary_models, engine_for=lambda i: groups[i][0])
            self._writer = with_experience_pipeline(self.config, writer, served)
        return self._writer

    @property
    def taskset_reader(self) -> Any:
        if self._reader is None:
            from trinity.buffer.factory import get_taskset_reader

            self._reader = get_taskset_reader(self.config.buffer.explorer_input.tasksets, self.config.buffer)
        return self._reader

    @property
    def model_version(self) -> int:
        return self.engines[0].model_version if self.engines else 0

    # -- explore ---------------------------------------------------------------------------

    def explore_step(self) -> dict[str, Any] | None:
        """Run one batch of training tasks; ``None`` (and the writer finished) when the
        tasksets are exhausted. The metrics are numbers, but for :data:`FAILURES_KEY`: one line
        about failed, timed-out and empty tasks when there were any."""
        from trinity.buffer.base import BufferExhausted

        if self.finished:
            return None
        start = time.monotonic()
        try:
            tasks = self.taskset_reader.read_batch(self.config.buffer.batch_size)
        except BufferExhausted as exc:
            logger.info("tasksets exhausted after step %d: %s", self.explore_step_num, exc)
            self.finished = True
            if self.partial is not None:  # no later step to finish the carried tasks in
                self.partial.drop_all(self.model_version)
            self.writer.finish()
            return None
        read_done = time.monotonic()
        step = self.explore_step_num + 1
        generated = self._generate_seconds()
        self._resume()
        results = self.pool.run_tasks(
            tasks,
            min_finished=self.min_finished,
            wait_after_min=self.config.explorer.over_rollout.wait_after_min,
            **({"version": self.model_version} if self.partial is not None else {}),
        )
        if self.partial is not None:
            self.partial.pause()  # the sync point: carried tasks' samples stop where they are
        run_done = time.monotonic()
        cut = [r for r in results if r.cancelled]
        if cut:
            logger.info(
                "explore step %d: over_rollout ended %d of %d tasks early (%d kept partial runs)",
                step,
                len(cut),
                len(results),
                sum(r.partial for r in cut),
            )
        experiences = self._stamp(results, step)
        partial = (
            {} if self.partial is None else self.partial.metrics(results, experiences, self.model_version)
        )
        if experiences:
            self.writer.write(experiences)
        # Readers waiting for a full batch learn that this step will bring no more (tasks that
        # failed or were dropped): the trainer trains on what arrived instead of waiting.
        self.writer.end_step(step)
        self._feed_selectors(results)
        end = time.monotonic()
        self.explore_step_num = step
        report = failure_report(results)
        if report:
            logger.warning("explore step %d: %s", step, report)
        metrics: dict[str, Any] = {
            **rollout_metrics(experiences, run_done - read_done),
            **summarize_results(results),
            "rollout/num_tasks": float(len(tasks)),
            "rollout/model_version": float(self.model_version),
            "timing/read_tasks": read_done - start,
            "timing/rollout": run_done - read_done,
            "timing/write_experiences": end - run_done,
            "timing/explore_step": end - start,
            **partial,
        }
        if generated is not None:
            # The engines' share of the rollout (the rest: workflows, rewards, runner threads).
            metrics["timing/generate"] = self._generate_seconds() - generated
        if self.pool.dynamic_timeout is not None:
            metrics["rollout/task_timeout"] = self.pool.dynamic_timeout.seconds
        metrics.update(self.taskset_reader.metrics())
        metrics.update(self.writer.metrics())  # written / duplicates skipped (redone steps)
        if report:
            metrics[FAILURES_KEY] = report  # a string: printed by the launcher, not plotted
        return metrics

    def _resume(self) -> None:
        """Partial rollouts: resume the engines paused at the last step's end (see
        :class:`~trinity.explorer.partial_rollout.PartialRollouts`)."""
        if self.partial is not None:
            self.partial.resume(self.model_version)

    def _generate_seconds(self) -> float | None:
        """Seconds the rollout engines have spent generating so far; ``None`` when an engine
        does not count them (vLLM's run in their own processes)."""
        counts = [getattr(engine, "generate_seconds", None) for engine in self.engines]
        if not counts or any(c is None for c in counts):
            return None
        return float(sum(counts))

    def _feed_selectors(self, results: list[TaskResult]) -> None:
        """Tell the tasksets' selectors how the step's tasks went (what adaptive selectors such
        as ``difficulty_based`` learn from): per task, the mean reward of all its experiences,
        as upstream's pass-rate feedback. Failed and empty tasks, and rewards that are not
        finite numbers, are left out rather than counted as zeros; a task read twice in the
        step gets one value over both."""
        feedback = getattr(self.taskset_reader, "feedback", None)
        if feedback is None:  # a task source of its own, without selectors
            return
        rewards: dict[tuple[str, int], list[float]] = defaultdict(list)
        for result in results:
            if not result.ok:
                continue
            for exp in result.experiences:
                reward = _as_float(exp.reward)
                if reward is not None:
                    rewards[(result.task.taskset_name, result.task.index)].append(reward)
        observed: dict[str, dict[int, float]] = defaultdict(dict)
        for (taskset, index), values in rewards.items():
            observed[taskset][index] = math.fsum(values) / len(values)
        feedback(dict(observed))

    def _stamp(self, results: list[TaskResult], step: int | str) -> list[Experience]:
        import torch

        version = self.model_version
        out = []
        for position, result in enumerate(results):
            for exp in result.experiences:
                exp.eid.batch = step
                # A workflow puts experiences in a group of their own within the task by setting
                # eid.task to a label (Trinity-RFT's trainable RULER: its judging turns, "-ruler").
                label = exp.eid.task
                exp.eid.task = f"{position}{label}" if isinstance(label, str) and label else position
                if result.resumed and exp.token_versions is None:
                    # Sampled in one go (say, an earlier turn, before the sync point): it keeps its
                    # version; never older than the task (a workflow's own Experience says 0).
                    sampled = max(exp.model_version, result.started_version or 0)
                    exp.token_versions = torch.full((exp.response_length,), sampled, dtype=torch.long)
                exp.model_version = version
                exp.info.setdefault("taskset", result.task.taskset_name)
                exp.info.setdefault("task_index", result.task.index)
                out.append(exp)
        return out

    # -- eval / bench ----------------------------------------------------------------------

    def eval(self) -> dict[str, float]:
        """Run every eval taskset once; ``eval/<taskset>/...`` metrics. Nothing is written."""
        from trinity.buffer.taskset import TasksetReader

        self._resume()  # eval calls would wait for paused engines
        metrics: dict[str, float] = {}
        for cfg in self.config.buffer.explorer_input.eval_tasksets:
            reader = TasksetReader(cfg, self.config.buffer)
            tasks: list[Task] = reader.take(len(reader))
            start = time.monotonic()
            pool = self.eval_pool(len(tasks))
            results = pool.run_tasks(tasks, observe=False)  # eval tasks never end early
            seconds = time.monotonic() - start
            prefix = f"eval/{reader.name}"
            experiences = self._stamp(results, f"eval_{self.explore_step_num}")
            metrics.update(rollout_metrics(experiences, seconds, prefix))
            metrics.update(accuracy_metrics(results, prefix))
            metrics.update(summarize_results(results, prefix))
            metrics[f"timing/eval/{reader.name}"] = seconds
        # The weights evaluated (the trainer step they come from), so a plotted eval says
        # which model it measured.
        metrics["eval/model_version"] = float(self.model_version)
        return metrics

    def eval_pool(self, tasks: int) -> RunnerPool:
        """The runners an eval of ``tasks`` tasks uses: enough for all of them to run at once
        (at most :data:`EVAL_RUNNERS_PER_ENGINE` per engine), each with wrappers of its own
        (history and per-task seeds stay per task); the training pool when it has as many."""
        ex = self.config.explorer
        per_engine = min(EVAL_RUNNERS_PER_ENGINE, math.ceil(tasks / max(1, len(self.engines))))
        if per_engine <= ex.runner_per_model and self.partial is None:  # carried tasks hold runners
            return self.pool
        if self._eval_pool is not None and self._eval_pool[0] >= per_engine:
            return self._eval_pool[1]
        from trinity.explorer.model_wrapper import model_wrappers_for

        self._close_eval_pool()
        # No OpenAI server of their own at start (a workflow that asks for one starts it) and no
        # fixed ports: those belong to the training runners' wrappers.
        plain = {"enable_openai_api": False, "base_port": None}
        runners = per_engine * len(self.engines)
        models = model_wrappers_for(
            ex.rollout_model.model_copy(update=plain),
            [e for e in self.engines for _ in range(per_engine)],
            name="rollout",
        )
        groups = [
            model_wrappers_for(
                aux.model_copy(update=plain),
                [group[k % len(group)] for k in range(runners)],
                name=aux.name or f"auxiliary_{i}",
            )
            for i, (aux, group) in enumerate(zip(ex.auxiliary_models, self._auxiliary_engine_groups))
        ]
        pool = RunnerPool(
            [models[i * per_engine : (i + 1) * per_engine] for i in range(len(self.engines))],
            auxiliary_models=groups,
            runner_per_model=per_engine,
            max_timeout=ex.max_timeout,
            max_retry_times=ex.max_retry_times,
        )
        self._eval_pool = (per_engine, pool, [*models, *(m for g in groups for m in g)])
        return pool

    def _close_eval_pool(self) -> None:
        if self._eval_pool is not None:
            for wrapper in self._eval_pool[2]:
                wrapper.close()
            self._eval_pool = None

    def bench(self, checkpoint_dir: str | Path | None = None) -> dict[int, dict[str, float]]:
        """Evaluate every ``global_step_N`` checkpoint (only the latest with
        ``explorer.bench_on_latest_checkpoint``): ``{N: eval metrics}``."""
        root = Path(checkpoint_dir or self.config.checkpoint_job_dir or ".")
        found = sorted(
            (int(m.group(1)), p)
            for p in root.glob("global_step_*")
            if p.is_dir() and (m := re.fullmatch(r"global_step_(\d+)", p.name))
        )
        if not found:
            raise FileNotFoundError(f"bench: no global_step_N checkpoint folders in {root}")
        if self.config.explorer.bench_on_latest_checkpoint:
            found = found[-1:]
        out = {}
        for step, path in found:
            self.sync_weights(checkpoint_path=path, version=step)
            out[step] = self.eval()
            logger.info("bench step %d: %s", step, out[step])
        return out

    # -- weights ---------------------------------------------------------------------------

    def sync_weights(
        self,
        state_dict: Mapping[str, Any] | None = None,
        *,
        checkpoint_path: str | Path | None = None,
        version: int,
    ) -> None:
        """Load new weights into every rollout engine (from a state dict or a checkpoint: its HF
        weights, at the top or in a ``huggingface`` / ``actor`` subfolder)."""
        if (state_dict is None) == (checkpoint_path is None):
            raise ValueError("sync_weights needs exactly one of state_dict and checkpoint_path")
        if checkpoint_path is not None:
            from trinity.trainer.checkpoint import hf_weights_dir

            checkpoint_path = hf_weights_dir(checkpoint_path)
        for engine in self.engines:
            if state_dict is not None:
                engine.update_weights(state_dict, version)
            else:
                engine.load_checkpoint(str(checkpoint_path), version)
        self._resume()  # carried tasks go on under the new weights

    # -- broadcast weight sync (sync_method nccl) ---------------------------------------------

    def weight_sync_devices(self) -> list[list[str]]:
        """Per rollout engine, the devices of the ranks it puts into the weight-sync group."""
        return [list(engine.weight_sync_devices()) for engine in self.engines]

    def init_weight_group(self, spec: GroupSpec) -> None:
        """Join every rollout engine to the trainer's weight-sync group (the trainer is rank 0).

        Engines take consecutive ranks from 1 in engine order, as many as they reported in
        :meth:`weight_sync_devices`; they join concurrently, since joining blocks until the whole
        group is there.
        """
        sizes = [len(devices) for devices in self.weight_sync_devices()]
        if 1 + sum(sizes) != spec.world_size:
            raise ValueError(
                f"weight-sync group of {spec.world_size} ranks, but the trainer and the rollout engines "
                f"need {1 + sum(sizes)} (engines: {sizes})"
            )
        offsets = [1 + sum(sizes[:i]) for i in range(len(sizes))]
        self._on_every_engine(
            "joining the weight-sync group", lambda i, engine: engine.init_weight_group(spec, offsets[i])
        )

    def receive_weights(self, metas: list[Any], version: int) -> None:
        """Every rollout engine receives one broadcast of the trainer's weights as ``version``."""
        self._on_every_engine(
            f"receiving weights version {version}", lambda i, engine: engine.receive_weights(metas, version)
        )
        self._resume()

    def close_weight_group(self) -> None:
        for engine in self.engines:
            engine.close_weight_group()

    def _on_every_engine(self, doing: str, call: Any) -> None:
        """Run ``call(index, engine)`` for all engines at once (collectives need every rank in
        flight together); raise the first failure, naming the engine."""
        if len(self.engines) == 1:
            call(0, self.engines[0])
            return
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=len(self.engines), thread_name_prefix="weight-sync") as pool:
            futures = [pool.submit(call, i, engine) for i, engine in enumerate(self.engines)]
            errors = [(i, f.exception()) for i, f in enumerate(futures) if f.exception() is not None]
        if errors:
            index, error = errors[0]
            raise RuntimeError(f"rollout engine {index} failed {doing}: {error}") from error

    def shutdown(self) -> None:
        """Stop OpenAI servers and engines."""
        if self.partial is not None:
            self.partial.drop_all(self.model_version)
            self.partial.pool.close()
        self._close_eval_pool()
        for model in [*self.models, *self.auxiliary_models]:
            model.close()
        for engine in [*self.engines, *self.auxiliary_engines]:
            engine.shutdown()


def _group_by_config(engines: list[RolloutEngine], configs: list[Any]) -> list[list[RolloutEngine]]:
    """Split a flat list of auxiliary engines into ``engine_num``-sized groups, one per config."""
    expected = sum(c.engine_num for c in configs)
    if len(engines) != expected:
        raise ValueError(
            f"Explorer got {len(engines)} auxiliary engine(s) but explorer.auxiliary_models configures "
            f"{expected} (the sum of their engine_num)"
        )
    groups, start = [], 0
    for c in configs:
        groups.append(list(engines[start : start + c.engine_num]))
        start += c.engine_num
    return groups
