"""TensorBoard monitor (the default): event files under ``<job_dir>/monitor/tensorboard/<role>``."""

from __future__ import annotations

import os
import time
from typing import Any

from trinity.monitor.base import Monitor, histogram_metrics, scalar_metrics


def read_scalars(log_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files of ``log_dir`` (one role's folder): ``{tag: [(step, value)]}``.

    Points of a tag are in the order they were logged. For scripts and tests that check a
    finished run (``<job_dir>/monitor/tensorboard/explorer``) without a TensorBoard server.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not os.path.isdir(log_dir):
        raise FileNotFoundError(
            f"no tensorboard folder at {log_dir}; did the run use the tensorboard monitor?"
        )
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})  # 0 keeps every point
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def read_histograms(log_dir: str | os.PathLike[str]) -> dict[str, list[tuple[int, Any]]]:
    """Every histogram in the event files of ``log_dir``: ``{tag: [(step, value)]}``, each value
    TensorBoard's ``HistogramValue`` (``min``, ``max``, ``num``, ``bucket_limit``, ``bucket``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"histograms": 0})
    events.Reload()
    return {
        tag: [(e.step, e.histogram_value) for e in events.Histograms(tag)]
        for tag in events.Tags()["histograms"]
    }


class TensorboardMonitor(Monitor):
    """Writes every numeric metric as a scalar event (and every :class:`~trinity.monitor.base.Histogram`
    as a histogram), with the ``tensorboard`` package's own
    event-file writer (what ``torch.utils.tensorboard.SummaryWriter`` writes through; importing
    that would import torch into the driver: 1.9 s of every job's start-up here, against 0.3 s)."""

    def __init__(self, log_dir: str, role: str = "trainer") -> None:
        super().__init__(role)
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.log_dir = os.path.join(log_dir, role)
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = EventFileWriter(self.log_dir)

    def log(self, metrics: dict[str, Any], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=v) for k, v in scalar_metrics(metrics).items()]
        if histograms := histogram_metrics(metrics):
            from tensorboard.compat.proto.summary_pb2 import HistogramProto

            for key, h in histograms.items():
                proto = HistogramProto(
                    min=h.min, max=h.max, num=h.num, sum=h.sum, sum_squares=h.sum_squares,
                    bucket_limit=list(h.edges[1:]), bucket=[float(c) for c in h.counts],
                )  # fmt: skip
                values.append(Summary.Value(tag=key, histo=proto))
        if values:
            self._writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        # Flushing each step keeps the files current for a live TensorBoard and for crashes.
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def eval_curves(
    job_dir: str | os.PathLike[str], metric: str = "accuracy"
) -> dict[str, list[tuple[int, float]]]:
    """``{taskset: [(step, value), ...]}`` of the ``eval/<taskset>/<metric>`` scalars a stage's
    explorer logged under ``job_dir`` (its ``checkpoint_job_dir``); an error naming the folder
    when there is none."""
    folder = os.path.join(job_dir, "monitor", "tensorboard", "explorer")
    found = {
        tag.split("/")[1]: points
        for tag, points in read_scalars(folder).items()
        if tag.startswith("eval/") and tag.endswith(f"/{metric}") and tag.count("/") == 2
    }
    if not found:
        raise RuntimeError(f"no eval/<taskset>/{metric} in {folder}")
    return found


__all__ = ["TensorboardMonitor", "eval_curves", "read_histograms", "read_scalars"]
