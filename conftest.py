"""The repository's test-suite policy, for the tests of every package.

``nox -s tests`` and ``nox -s unit`` run on two pytest-xdist workers (``-n 2 --dist loadfile``:
a test module runs whole on one worker, so an end-to-end module's job, a module-scoped fixture,
runs once). Under xdist the modules go out longest first, by their markers: end-to-end modules
with slow tests, the other end-to-end modules, modules with slow tests, then the rest, so that
the long jobs do not start last and leave one worker running alone at the end.
"""

from __future__ import annotations

import pytest


def _weight(item: pytest.Item) -> int:
    e2e, slow = item.get_closest_marker("e2e") is not None, item.get_closest_marker("slow") is not None
    return 0 if e2e and slow else 1 if e2e else 2 if slow else 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not hasattr(config, "workerinput"):
        return  # not an xdist worker (the workers collect; the controller schedules their order)
    # Per module (its heaviest test), so that a module's tests stay together and in their order.
    module_weight: dict[str, int] = {}
    for item in items:
        module = item.nodeid.split("::")[0]
        module_weight[module] = min(module_weight.get(module, 3), _weight(item))
    items.sort(key=lambda item: module_weight[item.nodeid.split("::")[0]])
