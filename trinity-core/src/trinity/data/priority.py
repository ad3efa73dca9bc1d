"""``task_pipeline.priority_weights``: order the processed tasks by a weighted priority, as
Trinity-RFT's Data-Juicer task pipeline does, before ``top_k`` keeps the first ones.

Each row's stats (Data-Juicer's ``__dj__stats__`` and the row's own numeric fields, e.g.
``difficulty_score`` from ``llm_difficulty_score_filter``) are grouped into two scores in
[0, 1], each the mean of the normalised stats present:

- ``quality``: ``alnum_ratio``, ``stopwords_ratio``, ``llm_quality_score`` (higher is better) and
  ``char_rep_ratio``, ``flagged_words_ratio``, ``special_char_ratio``, ``word_rep_ratio`` (lower is);
- ``difficulty``: ``llm_difficulty_score`` / ``difficulty_score`` and ``perplexity`` (min-max over
  the rows) (higher is harder), ``lang_score`` (lower is).

``priority = weights["quality"] * quality + weights["difficulty"] * difficulty
+ weights["usage_frequency"] * uses`` (``uses``: the row's ``consumed_cnt``, 0 for new tasks).
Rows are sorted by it, highest first (ties keep their order), and carry it as ``priority``.
A weighted score no row has a stat for is neutral (0.5 everywhere) and said once in the log;
``diversity`` (in upstream's defaults) is computed by no one, upstream included: a weight for it
is refused.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

from trinity.config.pipelines import PRIORITY_SCORES, check_weights

logger = logging.getLogger(__name__)

STATS = "__dj__stats__"
#: score -> {stat: (higher_is_better, (low, high) or None for min-max over the rows)}
GROUPS: dict[str, dict[str, tuple[bool, tuple[float, float] | None]]] = {
    "quality": {
        "alnum_ratio": (True, (0.0, 1.0)),
        "char_rep_ratio": (False, (0.0, 1.0)),
        "flagged_words_ratio": (False, (0.0, 1.0)),
        "special_char_ratio": (False, (0.0, 1.0)),
        "stopwords_ratio": (True, (0.0, 1.0)),
        "word_rep_ratio": (False, (0.0, 1.0)),
        "llm_quality_score": (True, (0.0, 1.0)),
    },
    "difficulty": {
        "perplexity": (True, None),
        "lang_score": (False, (0.0, 1.0)),
        "llm_difficulty_score": (True, (0.0, 1.0)),
        "difficulty_score": (True, (0.0, 1.0)),
    },
}
KNOWN = PRIORITY_SCORES
assert set(KNOWN) == {*GROUPS, "usage_frequency"}, "trinity.config.pipelines.PRIORITY_SCORES is out of date"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _stats(row: Mapping[str, Any]) -> dict[str, float]:
    out = {k: v for k, v in ((k, _number(v)) for k, v in row.items()) if v is not None}
    nested = row.get(STATS)
    if isinstance(nested, Mapping):
        out.update({k: v for k, v in ((k, _number(v)) for k, v in nested.items()) if v is not None})
    return out


def order_by_priority(
    rows: list[dict[str, Any]], weights: Mapping[str, float]
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """``rows`` with ``priority`` set, highest first, and counts of the stats found."""
    check_weights(weights)
    stats = [_stats(row) for row in rows]
    spans: dict[str, tuple[float, float]] = {}
    for group in GROUPS.values():
        for key, (_, fixed) in group.items():
            values = [s[key] for s in stats if key in s]
            if fixed is None and values:
                spans[key] = (min(values), max(values))
            elif fixed is not None:
                spans[key] = fixed
    found = {name: 0 for name in GROUPS}
    scored = []
    for index, (row, s) in enumerate(zip(rows, stats)):
        priority = weights.get("usage_frequency", 0.0) * s.get("consumed_cnt", 0.0)
        for name, group in GROUPS.items():
            parts = []
            for key, (higher, _) in group.items():
                if key in s and key in spans:
                    low, high = spans[key]
                    x = (s[key] - low) / (high - low) if high > low else 0.5
                    x = min(1.0, max(0.0, x))
                    parts.append(x if higher else 1.0 - x)
            if parts:
                found[name] += 1
            priority += weights.get(name, 0.0) * (sum(parts) / len(parts) if parts else 0.5)
        scored.append((-priority, index, {**row, "priority": priority}))
    for name, count in found.items():
        if weights.get(name) and count == 0:
            stat_names = ", ".join(GROUPS[name])
            logger.warning(
                "task pipeline: priority_weights.%s has no effect: no row has a %s stat (%s)",
                name,
                name,
                stat_names,
            )
    scored.sort(key=lambda item: item[:2])
    counts = {f"priority/rows_with_{name}": float(n) for name, n in found.items()}
    return [row for _, _, row in scored], counts
