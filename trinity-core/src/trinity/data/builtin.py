"""The core's own operators, registered through the ``register_operators`` hook before any
plugin (see :data:`trinity.plugins.CORE_PLUGINS`), so their names always resolve."""

from __future__ import annotations

from trinity.hookspecs import Register, hookimpl


@hookimpl
def register_operators(register: Register) -> None:
    """The built-in experience and task operators (Trinity-RFT's names), and ``data_juicer``
    (both kinds; Data-Juicer itself is the optional extra ``data-juicer``), and
    ``human_preference_annotation_mapper`` (its page is Trinity Studio's)."""
    from trinity.data.annotation import HumanPreferenceAnnotationMapper
    from trinity.data.data_juicer import DataJuicerOperator
    from trinity.data.experience_ops import EXPERIENCE_OPERATORS
    from trinity.data.task_ops import TASK_OPERATORS

    for name, cls in {
        **EXPERIENCE_OPERATORS,
        **TASK_OPERATORS,
        "data_juicer": DataJuicerOperator,
        "human_preference_annotation_mapper": HumanPreferenceAnnotationMapper,
    }.items():
        register(name, cls)
