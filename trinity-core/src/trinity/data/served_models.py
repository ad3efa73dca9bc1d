"""Auxiliary models served to the data processor's operators on the OpenAI-compatible API: the
data side (which model a name means, the dry-run placeholder, what a model server offers).

An LLM operator (``llm_difficulty_score_filter``, a Data-Juicer recipe's
``llm_quality_score_filter``, ...) names its model with ``api_or_hf_model``. When that name is
an ``explorer.auxiliary_models`` entry's ``name`` (or its ``model_path``), the job serves that
model itself and points the operator at it, so a pipeline needs no second server:

- in the explorer actor (experience pipeline) the engine the explorer already loaded is served;
- in the driver (task pipeline, before any actor starts) the model is loaded with its configured
  engine for the pipeline's run and released afterwards.

A model is served only when an operator asks for it. The server itself,
:class:`trinity.serving.auxiliary.ServedModels`, loads engines and starts OpenAI servers, so it
lives with serving; the data processor only sees a :class:`ModelServer` (the explorer and the
launcher pass one in), and ``data/`` imports nothing above it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from trinity.config import InferenceModelConfig


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


class ModelServer(Protocol):
    """What the data processor needs of the job's model server
    (:class:`trinity.serving.auxiliary.ServedModels`)."""

    def url(self, name: str) -> str | None:
        """Base URL (``.../v1``) serving auxiliary model ``name`` (started on first request);
        ``None`` when no auxiliary model has that name."""

    def close(self) -> None:
        """Stop what was started."""
