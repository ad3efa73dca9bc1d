"""The ``data_juicer`` operator: a Data-Juicer recipe run in-process, on task rows or on the
experiences of an explore step (optional extra: ``pip install './trinity-core[data-juicer]'``).

The recipe is Trinity-RFT's: ``config_path`` (a Data-Juicer YAML with a ``process:`` list, and
``np`` its worker count) or an inline ``process:`` list. Each experience becomes a row with
``prompt_text``, ``response_text``, ``reward`` and ``text`` (the field ``text_field`` names,
``response_text`` by default: Data-Juicer's text operators read ``text`` unless given a
``text_key``). Rows a filter removes drop their experiences (counted by the pipeline); the
numeric stats the operators computed (``text_len``, ``llm_quality_score``, ...) are copied into
``Experience.info``, where ``reward_shaping_mapper`` can use them. Task rows pass through as
they are, stats under Data-Juicer's ``__dj__stats__`` key.

With ``service.data_juicer`` the recipe runs in a Data-Juicer service instead (auto-started on
127.0.0.1, or at ``server_url``; :mod:`trinity.data.dj_client`); the rows and their stats are
the same either way.

A recipe operator that calls an LLM (``llm_quality_score_filter``, ``llm_difficulty_score_filter``,
...) through the API and whose ``api_or_hf_model`` names one of ``explorer.auxiliary_models`` is
pointed at that model, served by this job (``model_params.base_url``); one whose model is
neither served here nor given an address (``model_params.base_url``, ``$OPENAI_BASE_URL``) stops
the job in one line instead of scoring every row 0.

Data-Juicer installs a missing dependency of an operator with pip when the operator first
needs it; here that is refused (nothing is downloaded while a job runs): the error names the
package to install.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trinity.data.operator import ExperienceOperator, OperatorContext, TaskOperator

if TYPE_CHECKING:
    from trinity.data.dj_client import DataJuicerClient
    from trinity.experience import Experience

_INDEX = "__trinity_row__"
_STATS = "__dj__stats__"


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
        from trinity.plugins import install_hint

        hint = install_hint("trinity-core", extra="data-juicer")
        raise ValueError(f"the data_juicer operator needs Data-Juicer ({exc}): {hint}") from None
    LazyLoader._install_package = classmethod(_no_runtime_install)
    return load_ops, NestedDataset


def data_juicer_version() -> str | None:
    """The installed Data-Juicer's version (``None``: not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("py-data-juicer")
    except PackageNotFoundError:
        return None


def _known_operators() -> set[str] | None:
    """Data-Juicer's operator names; ``None`` when it is not installed in this process (a
    Data-Juicer service may still run the recipe)."""
    try:
        from data_juicer.ops.base_op import OPERATORS
    except ImportError:
        return None
    return set(OPERATORS.modules)


def check_recipe(process: Any) -> list[dict[str, Any]]:
    """``process`` as a list of one-key ``{op_name: args}`` dicts naming Data-Juicer operators
    (``ValueError`` otherwise; names are checked where Data-Juicer is installed)."""
    if not isinstance(process, list) or not process:
        raise ValueError("data_juicer: the recipe's process must be a non-empty list of {op_name: args}")
    for i, step in enumerate(process):
        if not (isinstance(step, Mapping) and len(step) == 1):
            raise ValueError(f"data_juicer: process[{i}] must be one {{op_name: args}} mapping, got {step!r}")
    known = _known_operators()
    for i, step in enumerate(process):
        (name,) = step
        if known is not None and name not in known:
            close = difflib.get_close_matches(str(name), sorted(known), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"data_juicer: process[{i}]: Data-Juicer has no operator {name!r}{hint}")
    return [dict(step) for step in process]


class Recipe:
    """A Data-Juicer recipe run in this process: :meth:`run` maps rows to the rows it keeps,
    each with an index key and its stats (``__dj__stats__``). The service runs these too."""

    def __init__(self, process: Any, np: int = 1) -> None:
        self.steps = check_recipe(process)
        self.np = int(np)
        self._ops: list[Any] | None = None

    def load(self) -> list[Any]:
        if self._ops is None:
            load_ops, _ = _load_data_juicer()
            steps = []
            for step in self.steps:
                ((name, args),) = step.items()
                steps.append({name: {"num_proc": self.np, **dict(args or {})}})
            self._ops = load_ops(steps)
        return self._ops

    def run(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        ops = self.load()
        _, dataset_cls = _load_data_juicer()
        dataset = dataset_cls.from_list(rows)
        for op in ops:
            dataset = op.run(dataset)
        return list(dataset.to_list())


def _calls_api_model(args: Mapping[str, Any]) -> bool:
    """Whether a recipe operator with ``args`` reaches its model through the OpenAI API (not
    a local Hugging Face / vLLM model it loads itself)."""
    return (
        isinstance(args.get("api_or_hf_model"), str)
        and not args.get("is_hf_model")
        and not args.get("enable_vllm")
    )


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
        self.recipe = check_recipe(process)
        self.text_field = text_field
        self._local: Recipe | None = None
        self._client: DataJuicerClient | None = None
        self._session: str | None = None
        self.models_served: dict[str, str] = {}  # recipe model name -> URL this job serves it at

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        return {"np": 1, "text_field": "response_text"}

    def bind(self, context: OperatorContext) -> None:
        """Point the recipe's API-model operators at the auxiliary models this job serves, then
        open a session with the Data-Juicer service when ``service.data_juicer`` is set."""
        steps = []
        for step in self.recipe:
            ((name, args),) = step.items()
            args = dict(args or {})
            if _calls_api_model(args):
                args = self._bind_model(name, args, context)
            steps.append({name: args})
        self.recipe = steps
        service = context.data_juicer
        if context.dry_run or service is None or not (service.auto_start or service.server_url):
            return
        from trinity.data.dj_client import connect

        self._client = connect(service)
        if not self._client.local and any(
            u.startswith("http://127.0.0.1") for u in self.models_served.values()
        ):
            url = self._client.url
            self.close()
            raise ValueError(
                f"data_juicer: the service at {url} runs on another machine and cannot reach the "
                "auxiliary models this job serves on 127.0.0.1; use auto_start, or give the recipe's "
                "operators model_params.base_url"
            )
        self._session = self._client.create(self.recipe, self.np)

    def _bind_model(self, op: str, args: dict[str, Any], context: OperatorContext) -> dict[str, Any]:
        model = args["api_or_hf_model"]
        params = dict(args.get("model_params") or {})
        if params.get("base_url"):
            return args
        url = context.model_url(model)
        if url is None:
            if os.environ.get("OPENAI_BASE_URL"):
                return args  # Data-Juicer's API models read it themselves
            raise ValueError(
                f"data_juicer: {op} calls model {model!r}, which is not one of explorer.auxiliary_models "
                "(by name or model_path) and has no address: add it as an auxiliary model, or set the "
                "operator's model_params.base_url or $OPENAI_BASE_URL"
            )
        self.models_served[model] = url
        params["base_url"] = url
        params.setdefault("api_key", "EMPTY")  # the openai client insists on one
        return {**args, "model_params": params}

    def _run(self, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        indexed = [{**row, _INDEX: i} for i, row in enumerate(rows)]
        if self._client is not None and self._session is not None:
            return self._client.process(self._session, indexed)
        if self._local is None:
            self._local = Recipe(self.recipe, self.np)
        return self._local.run(indexed)

    def close(self) -> None:
        if self._client is not None:
            from trinity.data.dj_client import release

            if self._session is not None:
                self._client.close(self._session)
            release(self._client)
            self._client, self._session = None, None

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
