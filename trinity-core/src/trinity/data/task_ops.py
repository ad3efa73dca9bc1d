"""Built-in task operators: filters over task rows (dicts) run by the task pipeline."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from trinity.data.operator import OperatorContext, TaskOperator

logger = logging.getLogger(__name__)


def _keys(keys: str | Sequence[str]) -> list[str]:
    return [keys] if isinstance(keys, str) else list(keys)


def _text(row: dict[str, Any], keys: Sequence[str]) -> str:
    return "\n".join(str(row.get(k, "")) for k in keys)


class LengthFilter(TaskOperator):
    """Keep rows whose text (the ``text_keys`` joined) has ``min_len`` to ``max_len`` characters
    (``max_len`` unset: no upper bound). Metric: ``too_short``, ``too_long``."""

    def __init__(
        self, text_keys: str | Sequence[str] = "question", min_len: int = 0, max_len: int | None = None
    ) -> None:
        self.text_keys, self.min_len, self.max_len = _keys(text_keys), int(min_len), max_len

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"text_keys": "question", "min_len": 0, "max_len": None}

    def process(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        kept, short, long = [], 0, 0
        for row in rows:
            n = len(_text(row, self.text_keys))
            if n < self.min_len:
                short += 1
            elif self.max_len is not None and n > self.max_len:
                long += 1
            else:
                kept.append(row)
        return kept, {"too_short": float(short), "too_long": float(long)}


class Deduplicator(TaskOperator):
    """Keep the first of rows whose ``text_keys`` are equal (case and runs of white space
    ignored unless ``lowercase`` / ``collapse_whitespace`` are false)."""

    whole_dataset = True

    def __init__(
        self,
        text_keys: str | Sequence[str] = "question",
        lowercase: bool = True,
        collapse_whitespace: bool = True,
    ) -> None:
        self.text_keys, self.lowercase, self.collapse = _keys(text_keys), lowercase, collapse_whitespace

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"text_keys": "question", "lowercase": True, "collapse_whitespace": True}

    def _key(self, row: dict[str, Any]) -> str:
        text = _text(row, self.text_keys)
        if self.lowercase:
            text = text.lower()
        if self.collapse:
            text = " ".join(text.split())
        return text

    def process(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        seen: set[str] = set()
        kept = []
        for row in rows:
            key = self._key(row)
            if key not in seen:
                seen.add(key)
                kept.append(row)
        return kept, {}


_SCORE = re.compile(r"-?\d+(?:\.\d+)?")

_PROMPT = (
    "Rate how difficult the following task is for a strong student, from 0.0 (trivial) to 1.0 "
    '(extremely hard). Answer with a JSON object {{"difficulty": <number>}} and nothing else.\n\n{task}'
)


class LLMDifficultyScoreFilter(TaskOperator):
    """Score each task's difficulty with an auxiliary model through an OpenAI-compatible API and
    keep rows whose score lies in ``[min_score, max_score]`` (Trinity-RFT's / Data-Juicer's
    ``llm_difficulty_score_filter``). The score is stored in the row as ``difficulty_score``.

    ``api_or_hf_model`` is the scoring model's name. When it names one of
    ``explorer.auxiliary_models`` (its ``name`` or ``model_path``) the job serves that model and
    the filter uses it; otherwise ``base_url`` / ``api_key`` default to ``$OPENAI_BASE_URL`` /
    ``$OPENAI_API_KEY`` (as Data-Juicer's API operators read them). An explicit ``base_url`` wins.
    ``input_keys`` are shown to the model under ``field_names``. A row whose reply holds no
    number is kept or dropped as ``keep_unscored`` says, and counted (``unscored``).
    """

    batch_size = 32

    def __init__(
        self,
        api_or_hf_model: str = "",
        min_score: float = 0.0,
        max_score: float = 1.0,
        input_keys: Sequence[str] = ("question",),
        field_names: Sequence[str] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        concurrency: int = 8,
        keep_unscored: bool = False,
        timeout: float = 120.0,
        **_: Any,  # Data-Juicer's other arguments (sampling params, prompt templates) are not used
    ) -> None:
        if not api_or_hf_model:
            raise ValueError("llm_difficulty_score_filter needs api_or_hf_model (the scoring model's name)")
        self.model = api_or_hf_model
        self.min_score, self.max_score = float(min_score), float(max_score)
        self.input_keys = list(input_keys)
        self.field_names = list(field_names or self.input_keys)
        if len(self.field_names) != len(self.input_keys):
            raise ValueError("field_names must name each of input_keys")
        self.base_url = base_url  # or the served auxiliary model's, or $OPENAI_BASE_URL: see bind
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.concurrency, self.keep_unscored, self.timeout = max(1, int(concurrency)), keep_unscored, timeout
        import importlib.util

        if importlib.util.find_spec("openai") is None:
            raise ValueError("llm_difficulty_score_filter needs the openai package: pip install openai")

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"api_or_hf_model": "", "min_score": 0.0, "max_score": 1.0, "input_keys": ["question"]}

    def bind(self, context: OperatorContext) -> None:
        if self.base_url:
            return
        served = context.model_url(self.model)
        if served is not None:
            self.base_url = served
            if not context.dry_run:
                logger.info(
                    "llm_difficulty_score_filter: scoring with %r served by this job at %s",
                    self.model,
                    served,
                )
            return
        self.base_url = os.environ.get("OPENAI_BASE_URL")
        if not self.base_url:
            raise ValueError(
                f"llm_difficulty_score_filter: model {self.model!r} is not one of explorer.auxiliary_models "
                "(by name or model_path) and has no address: add it as an auxiliary model, or set "
                "args.base_url or $OPENAI_BASE_URL"
            )

    def _ask(self, client: Any, row: dict[str, Any]) -> float | None:
        task = "\n".join(
            f"{name}: {row.get(key, '')}" for key, name in zip(self.input_keys, self.field_names)
        )
        reply = client.chat.completions.create(
            model=self.model,
            messages=[{"role": "user", "content": _PROMPT.format(task=task)}],
            temperature=0.0,
            max_tokens=32,
        )
        text = reply.choices[0].message.content or ""
        try:
            value = json.loads(text).get("difficulty")
            return float(value)
        except (ValueError, AttributeError, TypeError):
            match = _SCORE.search(text)
            return float(match.group()) if match else None

    def process(self, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, float]]:
        import openai

        if not self.base_url:
            self.bind(OperatorContext())  # used outside a pipeline: $OPENAI_BASE_URL or one line
        client = openai.OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout)
        with ThreadPoolExecutor(self.concurrency) as pool:
            scores = list(pool.map(lambda row: self._ask(client, row), rows))
        kept, unscored, out_of_range = [], 0, 0
        for row, score in zip(rows, scores):
            if score is None:
                unscored += 1
                if self.keep_unscored:
                    kept.append(row)
                continue
            if self.min_score <= score <= self.max_score:
                kept.append({**row, "difficulty_score": score})
            else:
                out_of_range += 1
        return kept, {"unscored": float(unscored), "out_of_range": float(out_of_range)}


#: The built-in task operators.
TASK_OPERATORS: dict[str, type[TaskOperator]] = {
    "length_filter": LengthFilter,
    "deduplicator": Deduplicator,
    "llm_difficulty_score_filter": LLMDifficultyScoreFilter,
}
