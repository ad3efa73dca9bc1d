"""Task selectors: which dataset row is read at each read position (component kind ``selector``).

A reader keeps one integer, its *position* (rows handed out so far, across epochs), and asks its
selector for the rows of the next positions: ``selector.indices(start, count)``. The built-in
selectors (``sequential``, ``shuffle``, ``random``) are pure functions of ``(seed, position)``,
so restoring the position restores the order, shuffles included. Plugins register more through
the ``register_selectors`` hook (see ``docs/plugins.md``); a selector that learns from what it
observes (``update``) saves what it learned in ``state_dict()``, which the taskset reader stores
beside its position.

The core registers the built-ins itself (:func:`register_selectors` below is a hook
implementation the plugin manager loads before any plugin), so ``get_component("selector",
"shuffle")`` works without any plugin installed.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from trinity.hookspecs import Register, hookimpl

logger = logging.getLogger(__name__)

# Constructor arguments the taskset reader supplies; never part of ``data_selector.kwargs``.
INJECTED_ARGS = ("size", "seed", "features")


class Selector:
    """Base class of task selectors: maps read positions to row indices of ``size`` rows.

    Built by the taskset reader as ``cls(size, seed=seed, features=features, **kwargs)``:

    * ``size``: number of usable rows (indices are ``0 .. size - 1``, in file order);
    * ``seed``: ``data_selector.seed``;
    * ``features``: ``{key: [value of that column in every row]}`` for each of
      ``data_selector.feature_keys``, in that order (``None`` where a row lacks the key);
    * ``kwargs``: ``data_selector.kwargs`` merged over :meth:`default_args`.

    Override :meth:`index` (a pure function of the position) or :meth:`indices` (a batch, for
    selectors that draw several rows at once, e.g. without replacement). A reader asks once
    per explore step for its share of the batch; ``start`` is the position of the first row.
    Equal ``(state, start, count)`` must give equal rows: resume relies on it.

    Adaptive selectors implement :meth:`update` (fed once per explore step with the observed
    reward of the tasks that finished) and keep what they learn in :meth:`state_dict`, which must
    be JSON-serialisable (it is saved in ``explorer_state.json``) and restored by
    :meth:`load_state_dict`. :func:`make_selector` builds a registered selector by name.
    """

    def __init__(
        self,
        size: int,
        *,
        seed: int = 42,
        features: Mapping[str, Sequence[Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"a selector needs at least one row (size={size!r})")
        self.size = size
        self.seed = int(seed)
        self.features: dict[str, list[Any]] = {k: list(v) for k, v in (features or {}).items()}
        for key, values in self.features.items():
            if len(values) != size:
                raise ValueError(f"feature {key!r} has {len(values)} values for {size} rows")
        if kwargs:
            logger.warning(
                "selector %s ignores data_selector.kwargs %s",
                type(self).__name__,
                ", ".join(sorted(map(str, kwargs))),
            )

    @classmethod
    def default_args(cls) -> dict[str, Any]:
        """The keyword arguments ``__init__`` takes from ``data_selector.kwargs``, with their
        defaults (read off the signature; the injected ``size``/``seed``/``features`` excluded)."""
        args: dict[str, Any] = {}
        for name, param in inspect.signature(cls.__init__).parameters.items():
            if name == "self" or name in INJECTED_ARGS:
                continue
            if param.kind in (param.VAR_KEYWORD, param.VAR_POSITIONAL):
                continue
            if param.default is not inspect.Parameter.empty:
                args[name] = param.default
        return args

    def index(self, position: int) -> int:
        """Row index read at ``position``."""
        if type(self).indices is not Selector.indices:
            return self.indices(position, 1)[0]
        raise NotImplementedError(f"{type(self).__name__} must override index() or indices()")

    def indices(self, start: int, count: int) -> list[int]:
        """Row indices for positions ``start .. start + count - 1``."""
        return [self.index(p) for p in range(start, start + count)]

    def update(self, indices: Sequence[int], values: Sequence[float]) -> None:
        """Feedback: ``values[i]`` was observed for row ``indices[i]`` (the mean reward of that
        task's rollouts in the last explore step). No-op by default."""

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`update` learned (JSON-serialisable); ``{}`` for stateless selectors."""
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`."""


class SequentialSelector(Selector):
    """``sequential``: file order, epoch after epoch."""

    def index(self, position: int) -> int:
        return position % self.size


class ShuffleSelector(Selector):
    """``shuffle``: a fresh permutation each epoch, seeded by ``(seed, epoch)``."""

    def __init__(self, size: int, **kwargs: Any) -> None:
        super().__init__(size, **kwargs)
        self._perm_epoch: int | None = None
        self._perm: Any = None

    def index(self, position: int) -> int:
        epoch, offset = divmod(position, self.size)
        if self._perm_epoch != epoch:
            import numpy as np

            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            self._perm_epoch = epoch
        return int(self._perm[offset])


class RandomSelector(Selector):
    """``random``: each position draws a row uniformly (with replacement), seeded by
    ``(seed, position)``; "epochs" then count ``size`` draws."""

    def index(self, position: int) -> int:
        import numpy as np

        return int(np.random.default_rng([self.seed, position]).integers(self.size))


#: The selectors of trinity-core, by name.
BUILTIN_SELECTORS: dict[str, type[Selector]] = {
    "sequential": SequentialSelector,
    "shuffle": ShuffleSelector,
    "random": RandomSelector,
}


@hookimpl
def register_selectors(register: Register) -> None:
    """sequential, shuffle, random (the core's own; loaded before any plugin)."""
    for name, cls in BUILTIN_SELECTORS.items():
        register(name, cls)


def build_selector(
    cls: type[Selector],
    size: int,
    *,
    seed: int = 42,
    features: Mapping[str, Sequence[Any]] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> Selector:
    """``cls(size, seed=..., features=..., **{**cls.default_args(), **kwargs})``; a reserved
    name in ``kwargs`` is a ValueError."""
    kwargs = dict(kwargs or {})
    reserved = sorted(k for k in kwargs if k in INJECTED_ARGS)
    if reserved:
        raise ValueError(
            f"data_selector.kwargs may not set {', '.join(reserved)} (set data_selector.seed / feature_keys)"
        )
    return cls(size, seed=seed, features=features, **{**cls.default_args(), **kwargs})


def make_selector(
    selector_type: str,
    size: int,
    *,
    seed: int = 42,
    features: Mapping[str, Sequence[Any]] | None = None,
    kwargs: Mapping[str, Any] | None = None,
) -> Selector:
    """The registered selector named ``selector_type`` (``UnknownComponentError`` otherwise)."""
    from trinity.plugins import get_component

    return build_selector(
        get_component("selector", selector_type), size, seed=seed, features=features, kwargs=kwargs
    )
