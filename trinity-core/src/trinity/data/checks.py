"""What the data processor's operators need from the job, checked before it starts: each
operator is built and bound once with a dry-run context (nothing is started), so a recipe file
that is not there, a missing package or a scoring model without an address is one line from
``trinity run`` before Ray starts, not an error after the first explore step. (Names and
arguments are checked at config load, :mod:`trinity.config.pipelines`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

from trinity.config.errors import ConfigError
from trinity.config.pipelines import pipeline_operators

if TYPE_CHECKING:
    from trinity.config import Config


def check_operator_needs(config: Config) -> None:
    """Build and bind every operator of ``config``'s pipelines with a dry-run context; raise
    :class:`~trinity.config.ConfigError` naming the operator's key."""
    from trinity.data.operator import ExperienceOperator, TaskOperator
    from trinity.data.pipeline import build_operator, operator_context
    from trinity.data.served_models import dry_run_url

    operators = pipeline_operators(config)
    if not operators:
        return
    context = operator_context(config, dry_run_url(config.explorer.auxiliary_models), dry_run=True)
    for pipeline, key, op in operators:
        contract = TaskOperator if pipeline == "task_pipeline" else ExperienceOperator
        try:
            built = build_operator(op, contract, key)
        except LookupError as exc:
            raise ConfigError(str(exc).split(" More ")[0], key=f"{key}.name") from None
        except ValueError as exc:
            raise ConfigError(str(exc).removeprefix(f"{key}: "), key=key) from None
        try:
            built.bind(context)
        except ValueError as exc:
            raise ConfigError(str(exc), key=key) from None
        finally:
            built.close()
