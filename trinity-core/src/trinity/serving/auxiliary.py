"""The job's server of auxiliary models for the data processor's operators
(see :mod:`trinity.data.served_models` for when an operator's model is one of them)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trinity.data.served_models import find_auxiliary

if TYPE_CHECKING:
    from trinity.config import InferenceModelConfig
    from trinity.explorer.model_wrapper import ModelWrapper
    from trinity.rollout import RolloutEngine

logger = logging.getLogger(__name__)


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
