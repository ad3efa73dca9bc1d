"""The ``data_juicer`` operator: a Data-Juicer recipe run in-process, on task rows or on the
experiences of an explore step (optional extra: ``pip install 'trinity-core[data-juicer]'``).

The recipe is Trinity-RFT's: ``config_path`` (a Data-Juicer YAML with a ``process:`` list, and
``np`` its worker count) or an inline ``process:`` list. Each experience becomes a row with
``prompt_text``, ``response_text``, ``reward`` and ``text`` (the field ``text_field`` names,
``response_text`` by default: Data-Juicer's text operators read ``text`` unless given a
``text_key``). Rows a filter removes drop their experiences (counted by the pipeline); the
numeric stats the operators computed (``text_len``, ``llm_quality_score``, ...) are copied into
``Experience.info``, where ``reward_shaping_mapper`` can use them. Task rows pass through as
they are, stats under Data-Juicer's ``__dj__stats__`` key.

Data-Juicer installs a missing dependency of an operator with pip when the operator first
needs it; here that is refused (nothing is downloaded while a job runs): the error names the
package to install.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.data.operator import ExperienceOperator, TaskOperator

if TYPE_CHECKING:
    from trinity.experience import Experience

_INDEX = "__trinity_row__"
_STATS = "__dj__stats__"
_EXTRA = "pip install 'trinity-core[data-juicer]'"


def _no_runtime_install(cls: Any, package_spec: str, pip_args: Any = None) -> None:
    raise ImportError(
        f"a Data-Juicer operator needs {package_spec!r}, which is not installed; nothing is installed "
        f"while a job runs: pip install {package_spec!r} first"
    )


def _load_data_juicer() -> tuple[Any, Any]:
    """``(load_ops, NestedDataset)``, with Data-Juicer's run-time pip installs refused."""
    try:
        from data_juicer.core.data import NestedDataset
        from data_juicer.ops import load_ops
        from data_juicer.utils.lazy_loader import LazyLoader
    except ImportError as exc:
        raise ValueError(f"the data_juicer operator needs Data-Juicer ({exc}): {_EXTRA}") from None
    LazyLoader._install_package = classmethod(_no_runtime_install)
    return load_ops, NestedDataset


class DataJuicerOperator(ExperienceOperator, TaskOperator):
    """Run a Data-Juicer recipe (see the module docstring). Works in both pipelines.

    Args:
        config_path: a Data-Juicer recipe (YAML with ``process`` and optionally ``np``).
        process: the recipe's operators inline, ``[{op_name: {args}}, ...]``.
        np: worker processes for each operator (``num_proc``); the recipe's ``np`` wins.
        text_field: the experience field given to Data-Juicer as ``text``.
    """

    whole_dataset = True  # the recipe sees all rows at once (Data-Juicer spreads them itself)

    def __init__(
        self,
        config_path: str | None = None,
        process: Sequence[Mapping[str, Any]] | None = None,
        np: int = 1,
        text_field: str = "response_text",
        **_: Any,  # other keys of a recipe (project_name, ...) are not used
    ) -> None:
        if (config_path is None) == (process is None):
            raise ValueError(
                "data_juicer needs exactly one of config_path (a recipe file) and process (inline)"
            )
        self.np = int(np)
        if config_path is not None:
            import yaml

            if not os.path.isfile(config_path):
                raise ValueError(f"data_juicer: no recipe at {config_path}")
            with open(config_path) as f:
                recipe = yaml.safe_load(f) or {}
            process = recipe.get("process")
            self.np = int(recipe.get("np", self.np))
        if not isinstance(process, list) or not process:
            raise ValueError("data_juicer: the recipe's process must be a non-empty list of {op_name: args}")
        for i, step in enumerate(process):
            if not (isinstance(step, Mapping) and len(step) == 1):
                raise ValueError(
                    f"data_juicer: process[{i}] must be one {{op_name: args}} mapping, got {step!r}"
                )
        self.recipe = [dict(step) for step in process]
        self.text_field = text_field
        self._ops: list[Any] | None = None

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"np": 1, "text_field": "response_text"}

    def _run(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        load_ops, dataset_cls = _load_data_juicer()
        if self._ops is None:
            steps = []
            for step in self.recipe:
                ((name, args),) = step.items()
                steps.append({name: {"num_proc": self.np, **dict(args or {})}})
            self._ops = load_ops(steps)
        indexed = [{**row, _INDEX: i} for i, row in enumerate(rows)]
        dataset = dataset_cls.from_list(indexed)
        for op in self._ops:
            dataset = op.run(dataset)
        return list(dataset.to_list())

    def process(self, items: list[Any]) -> tuple[list[Any], dict[str, float]]:  # type: ignore[override]
        from trinity.experience import Experience

        if not items:
            return [], {}
        if isinstance(items[0], Experience):
            return self._process_experiences(items)
        out = self._run(items)
        return [{k: v for k, v in row.items() if k != _INDEX} for row in out], {}

    def _process_experiences(
        self, experiences: list[Experience]
    ) -> tuple[list[Experience], dict[str, float]]:
        rows = [
            {
                "prompt_text": exp.prompt_text or "",
                "response_text": exp.response_text or "",
                "reward": exp.reward,
                "text": getattr(exp, self.text_field, None) or "",
            }
            for exp in experiences
        ]
        kept = []
        for row in self._run(rows):
            exp = experiences[row[_INDEX]]
            for key, value in (row.get(_STATS) or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    exp.info[key] = float(value)
            kept.append(exp)
        return kept, {}
