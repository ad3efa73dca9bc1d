"""Auxiliary models served to the data processor's operators on the OpenAI-compatible API.

An LLM operator (``llm_difficulty_score_filter``, a Data-Juicer recipe's
``llm_quality_score_filter``, ...) names its model with ``api_or_hf_model``. When that name is
an ``explorer.auxiliary_models`` entry's ``name`` (or its ``model_path``), the job serves that
model itself and points the operator at it, so a pipeline needs no second server:

- in the explorer actor (experience pipeline) the engine the explorer already loaded is served;
- in the driver (task pipeline, before any actor starts) the model is loaded with its configured
  engine for the pipeline's run and released afterwards.

A model is served only when an operator asks for it (:meth:`ServedModels.url`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trinity.config import InferenceModelConfig
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout import RolloutEngine

logger = logging.getLogger(__name__)


def find_auxiliary(configs: Sequence[InferenceModelConfig], name: str) -> int | None:
    """Index of the auxiliary model called ``name`` (its ``name``, else its ``model_path``)."""
    for i, aux in enumerate(configs):
        if aux.name and aux.name == name:
            return i
    for i, aux in enumerate(configs):
        if aux.model_path and aux.model_path == name:
            return i
    return None


def dry_run_url(configs: Sequence[InferenceModelConfig]) -> Callable[[str], str | None]:
    """``model_url`` of a config check: a placeholder for each model the job would serve."""

    def url(name: str) -> str | None:
        i = find_auxiliary(configs, name)
        return None if i is None else f"http://127.0.0.1/auxiliary_models[{i}]/v1 (served when the job runs)"

    return url


class ServedModels:
    """Serves auxiliary models on the OpenAI API on first request; :meth:`close` stops them.

    Args:
        configs: the ``explorer.auxiliary_models`` entries.
        engine_for: the engine serving entry ``i`` (the explorer passes its loaded engines);
            ``None`` loads one engine per requested entry here and shuts it down on close.
    """

    def __init__(
        self,
        configs: Sequence[InferenceModelConfig],
        engine_for: Callable[[int], RolloutEngine] | None = None,
    ) -> None:
        self.configs = list(configs)
        self._engine_for = engine_for
        self._owned: list[RolloutEngine] = []
        self._wrappers: dict[int, ModelWrapper] = {}

    def url(self, name: str) -> str | None:
        """Base URL (``http://127.0.0.1:PORT/v1``) serving model ``name``; ``None`` when no
        auxiliary model has that name."""
        i = find_auxiliary(self.configs, name)
        if i is None:
            return None
        if i not in self._wrappers:
            self._wrappers[i] = self._serve(i)
        return self._wrappers[i].openai_base_url

    def _serve(self, i: int) -> ModelWrapper:
        from trinity.explorer.model_wrapper import model_wrappers_for

        aux = self.configs[i]
        label = aux.name or f"auxiliary_{i}"
        if self._engine_for is not None:
            engine = self._engine_for(i)
        else:
            from trinity.rollout import create_engines

            print(
                f"[trinity] loading auxiliary model {label!r} ({aux.model_path}) for the data processor",
                flush=True,
            )
            [engine] = create_engines(aux.model_copy(update={"engine_num": 1}))
            self._owned.append(engine)
        # A wrapper of its own (no history): the operators' calls never mix with a workflow's.
        [wrapper] = model_wrappers_for(
            aux.model_copy(update={"enable_history": False, "enable_openai_api": False, "base_port": None}),
            [engine],
            name=label,
        )
        url = wrapper.start_openai_server()
        logger.info("data processor: auxiliary model %r served at %s", label, url)
        return wrapper

    def close(self) -> None:
        for wrapper in self._wrappers.values():
            wrapper.close()
        self._wrappers.clear()
        for engine in self._owned:
            _shutdown(engine)
        self._owned.clear()

    def __enter__(self) -> ServedModels:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _shutdown(engine: Any) -> None:
    try:
        engine.shutdown()
    except Exception as exc:  # releasing is best effort; the pipeline's result stands
        logger.warning("could not shut down an auxiliary engine: %r", exc)
