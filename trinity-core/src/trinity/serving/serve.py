"""``mode: serve``: the explorer serves the current policy to applications and learns from their
feedback.

Two jobs share one config (same ``project``/``name``, so the same checkpoint folder and buffer):

- ``mode: serve`` (this module) serves the rollout model through the OpenAI-compatible API
  (:mod:`trinity.serving.openai_api`) on ``explorer.listen_address:explorer.proxy_port``
  (127.0.0.1 unless set: the API has no authentication beyond ``api_key``). Every call is kept
  in its conversation until the application sends feedback; committed conversations go to
  the experience buffer (:mod:`trinity.serving.serve_feedback` has the rules).
- ``mode: train`` trains on that buffer and saves checkpoints every ``trainer.save_interval``
  steps. Every ``explorer.service_status_check_interval`` seconds the serve job looks for a
  newer checkpoint in the job folder and loads it into the engine. The engine swaps weights
  between two generation batches, so no request is dropped: a batch being sampled finishes on
  the old weights, the next one samples with the new (each Experience records its
  ``model_version``).

Routes added to the OpenAI API (errors in OpenAI's shape):

- ``POST /v1/feedback`` (also ``/feedback``): ``{"reward": 1.0, "conversation_id": "c1"}`` or
  ``{"reward": 1.0, "response_ids": ["chatcmpl-..."]}`` (``msg_ids`` as in Trinity-RFT's
  client), optional ``"task_id"`` (the conversation's group) and ``"commit": true``.
- ``POST /v1/commit`` (also ``/commit``): ``{"conversation_id": "c1"}`` or ``{"response_ids":
  [...]}`` closes those conversations; an empty body commits every rewarded conversation and
  ends the explorer step (Trinity-RFT's commit).
- ``GET /v1/status``: the served weights' ``model_version``, the explorer step and counters.

A call joins a conversation through the ``X-Trinity-Conversation`` header or a
``conversation_id`` body field (``extra_body`` in the ``openai`` client); without either it is
a conversation of its own, named by its response id.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import Request  # route signatures are read at run time (importing this module serves)

from trinity.serving.serve_feedback import FeedbackError, FeedbackLedger

if TYPE_CHECKING:
    from fastapi import FastAPI

    from trinity.config import Config
    from trinity.experience import Experience
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.job import StageResult
    from trinity.rollout.base import RolloutEngine
    from trinity.serving.openai_api.server import CallContext, OpenAIServer

logger = logging.getLogger("trinity.serving.serve")

CONVERSATION_HEADER = "x-trinity-conversation"
CONVERSATION_FIELD = "conversation_id"
#: Conversations without a call or feedback for this long are closed (rewarded ones committed).
IDLE_CLOSE_S = 3600.0


def conversation_of(headers: Mapping[str, str], extra: Mapping[str, Any]) -> str | None:
    """The conversation id a request names (header first, then the body field)."""
    value = headers.get(CONVERSATION_HEADER) or extra.get(CONVERSATION_FIELD)
    if value is None or value == "":
        return None
    return str(value)


def build_serve_app(model: ModelWrapper, ledger: FeedbackLedger) -> FastAPI:
    """The OpenAI API of ``model`` recording into ``ledger``, plus the feedback routes."""
    from fastapi.responses import JSONResponse

    from trinity.serving.openai_api.schema import APIError
    from trinity.serving.openai_api.server import build_app

    def admit(headers: Mapping[str, str], extra: Mapping[str, Any]) -> None:
        conversation = conversation_of(headers, extra)
        if conversation is not None and ledger.is_committed(conversation):
            raise APIError(
                409,
                f"conversation {conversation!r} is committed (its experiences are in the buffer); "
                "continue under a new conversation id",
                param=CONVERSATION_FIELD,
                code="already_committed",
            )

    def record(experiences: list[Experience], context: CallContext) -> None:
        ledger.record(experiences, context.response_id, conversation_of(context.headers, context.extra))

    app = build_app(model, recorder=record, admit=admit)

    async def body_of(request: Request) -> dict[str, Any]:
        raw = await request.body()
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise APIError(400, f"the body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the body must be a JSON object")
        return body

    async def answer(call: Any) -> JSONResponse:
        import asyncio

        try:
            # In a worker thread: a commit writes to the buffer, and the event loop keeps
            # streaming other replies meanwhile.
            return JSONResponse(await asyncio.to_thread(call))
        except FeedbackError as exc:
            raise APIError(exc.status, exc.message, param=exc.param, code=exc.code) from None

    async def feedback(request: Request) -> JSONResponse:
        body = await body_of(request)
        _only(
            body, {"reward", "conversation_id", "response_id", "response_ids", "msg_ids", "task_id", "commit"}
        )
        if "reward" not in body:
            raise APIError(400, "reward is required", param="reward")
        commit = body.get("commit", False)
        if not isinstance(commit, bool):
            raise APIError(400, "commit must be true or false", param="commit")
        task_id = body.get("task_id")
        if task_id is not None and not isinstance(task_id, (str, int)):
            raise APIError(400, "task_id must be a string or an integer", param="task_id")
        return await answer(
            lambda: ledger.feedback(
                body["reward"],
                conversation_id=_string(body, "conversation_id"),
                response_ids=_response_ids(body),
                task_id=None if task_id is None else str(task_id),
                commit=commit,
            )
        )

    async def commit(request: Request) -> JSONResponse:
        body = await body_of(request)
        _only(body, {"conversation_id", "response_id", "response_ids", "msg_ids"})
        return await answer(
            lambda: {
                "object": "trinity.commit",
                **ledger.commit(_string(body, "conversation_id"), _response_ids(body)),
            }
        )

    async def status() -> JSONResponse:
        return JSONResponse(
            {
                "object": "trinity.serve.status",
                "model": model.name,
                "model_version": model.model_version,
                **ledger.status(),
            }
        )

    for path in ("/v1/feedback", "/feedback"):
        app.add_api_route(path, feedback, methods=["POST"])
    for path in ("/v1/commit", "/commit"):
        app.add_api_route(path, commit, methods=["POST"])
    app.add_api_route("/v1/status", status, methods=["GET"])
    return app


def _only(body: Mapping[str, Any], allowed: set[str]) -> None:
    from trinity.serving.openai_api.schema import APIError

    unknown = sorted(set(body) - allowed)
    if unknown:
        raise APIError(
            400,
            f"unknown field {unknown[0]!r}; this route takes {', '.join(sorted(allowed))}",
            param=unknown[0],
        )


def _string(body: Mapping[str, Any], key: str) -> str | None:
    from trinity.serving.openai_api.schema import APIError

    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise APIError(400, f"{key} must be a non-empty string", param=key)
    return value


def _response_ids(body: Mapping[str, Any]) -> list[str]:
    """``response_id``, ``response_ids`` and ``msg_ids`` (Trinity-RFT's name), together."""
    from trinity.serving.openai_api.schema import APIError

    ids: list[str] = []
    single = _string(body, "response_id")
    if single is not None:
        ids.append(single)
    for key in ("response_ids", "msg_ids"):
        value = body.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
            raise APIError(400, f"{key} must be a non-empty list of response ids (strings)", param=key)
        ids.extend(value)
    return ids


class CheckpointWatcher:
    """Loads the train job's newest checkpoint into ``engine`` when it is newer than what it serves."""

    def __init__(self, engine: RolloutEngine, job_dir: str | Path) -> None:
        self.engine = engine
        self.job_dir = Path(job_dir)

    def poll(self) -> int | None:
        """Load a newer checkpoint if there is one; returns its step (``None``: nothing new)."""
        from trinity.trainer.checkpoint import find_latest_checkpoint, hf_weights_dir

        found = find_latest_checkpoint(self.job_dir)
        if found is None or found[0] <= self.engine.model_version:
            return None
        step, path = found
        self.engine.load_checkpoint(str(hf_weights_dir(path)), step)
        return step


def first_step_after(config: Config, trainer_step: int) -> int:
    """The explorer step a serve job starting on the weights of ``trainer_step`` writes first:
    the one after those the trainer has trained on (``config.geometry``), so its next train step
    finds it."""
    return config.geometry.explore_steps_through(trainer_step) + 1


class ServeJob:
    """A serving rollout engine, its OpenAI API with the feedback routes, the feedback ledger
    writing to the experience buffer, and the checkpoint watcher.

    ``engine`` and ``writer`` replace the configured ones (tests)."""

    def __init__(self, config: Config, *, engine: RolloutEngine | None = None, writer: Any = None) -> None:
        self.config = config
        self._own_engine = engine is None
        if engine is None:
            from trinity.rollout import create_engines

            [engine] = create_engines(config.explorer.rollout_model)
        self._writer = writer
        self.engine = engine
        try:
            self._build(config)
        except BaseException:
            if self._own_engine:
                engine.shutdown()
            raise

    def _build(self, config: Config) -> None:
        from trinity.explorer.model_wrapper import ModelWrapper
        from trinity.serving.openai_api.server import OpenAIServer

        ex, rm, engine = config.explorer, config.explorer.rollout_model, self.engine
        self.watcher = CheckpointWatcher(engine, config.checkpoint_job_dir)
        self._failed_checkpoint: str | None = None
        # The weights the trainer left (a restart): served from the start, and the next explorer
        # step is the one its next train step expects.
        self.watcher.poll()
        writer = self._writer
        if writer is None:
            from trinity.buffer.factory import get_buffer_writer, run_name

            writer = get_buffer_writer(
                config.buffer.trainer_input.experience_buffer,
                cache_dir=config.buffer.cache_dir,
                run=run_name(config),
            )
        self.ledger = FeedbackLedger(
            writer,
            trajectories_per_step=config.geometry.rollouts_per_explore_step,
            first_step=first_step_after(config, engine.model_version),
        )
        self.model = ModelWrapper(
            engine,
            name=config.model.model_path,
            model_path=config.model.model_path,
            api_key=rm.api_key,
            tool_call_parser=rm.tool_call_parser,
            reasoning_parser=rm.reasoning_parser,
            enable_auto_tool_choice=rm.enable_auto_tool_choice,
            log_requests=rm.enable_log_requests,
            aliases=rm.model_aliases,
        )
        try:
            self.server: OpenAIServer = OpenAIServer(
                self.model,
                port=ex.proxy_port,
                host=ex.listen_address,
                app=build_serve_app(self.model, self.ledger),
            )
        except OSError as exc:
            raise OSError(
                f"cannot serve on {ex.listen_address}:{ex.proxy_port}: {exc.strerror or exc}; "
                "set explorer.proxy_port to a free port (0: any)"
            ) from exc

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def start(self) -> None:
        self.server.start()

    def tick(self) -> None:
        """Periodic work: newer weights, idle conversations."""
        try:
            step = self.watcher.poll()
        except Exception as exc:  # a checkpoint being deleted, a bad file: keep serving, retry later
            if str(exc) != self._failed_checkpoint:  # once per problem, not every interval
                logger.warning("serve: could not load the newest checkpoint (will retry): %s", exc)
            self._failed_checkpoint = str(exc)
        else:
            self._failed_checkpoint = None
            if step is not None:
                print(f"[trinity] serving the weights of trainer step {step}", flush=True)
        self.ledger.close_idle(IDLE_CLOSE_S)

    def stop(self) -> dict[str, Any]:
        """Stop serving (requests in flight get a few seconds), then commit what is rewarded,
        end the open step and finish the writer."""
        self.server.stop()
        closed = self.ledger.finish()
        if self._own_engine:
            self.engine.shutdown()
        return closed


def run_serve(config: Config) -> StageResult:
    """Serve until SIGINT or SIGTERM; the launcher's ``run_stage`` hands ``mode: serve`` here."""
    from trinity.job import StageResult

    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    job = None
    try:
        try:
            job = ServeJob(config)
            job.start()
        except (OSError, ValueError, RuntimeError) as exc:  # port taken, bad buffer...: one line
            from trinity.job import JobFailed

            raise JobFailed(f"serve: {exc}") from exc
        interval = config.explorer.service_status_check_interval
        print(
            f"[trinity] serving {config.model.model_path} (weights version {job.engine.model_version}) at "
            f"{job.base_url}; feedback: POST {job.base_url}/feedback, commit: POST {job.base_url}/commit; "
            f"new checkpoints of {config.checkpoint_job_dir} are loaded every {interval}s; stop with Ctrl-C",
            flush=True,
        )
        while not stop.wait(interval):
            job.tick()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if job is not None:
            job.stop()
        _shutdown_ray()
    counts = job.ledger.counts
    print(
        f"[trinity] serve stopped: {counts['calls']} calls, {counts['conversations_committed']} conversations "
        f"committed, {counts['experiences_written']} experiences written in {counts['steps_ended']} steps, "
        f"{counts['calls_dropped_unrewarded']} calls without a reward not trained; "
        f"last weights version {job.engine.model_version}",
        flush=True,
    )
    metrics = {f"serve/{k}": float(v) for k, v in counts.items()}
    return StageResult(config.name, 0, counts["steps_ended"], None, metrics)


def _shutdown_ray() -> None:
    import sys

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()
