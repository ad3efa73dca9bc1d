"""Every hook kind has a conformance check (like datasette's hook-coverage test)."""

from __future__ import annotations

import pytest

from trinity.experience import BufferReader
from trinity.plugins import KINDS
from trinity.testing import CHECKS, ListReader, check_component, make_experiences


def test_every_kind_has_a_conformance_check():
    missing = sorted(set(KINDS) - set(CHECKS))
    assert not missing, f"kinds without a check in trinity.testing.conformance.CHECKS: {missing}"
    assert not set(CHECKS) - set(KINDS), "CHECKS names a kind no hook registers"


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_check_rejects_a_class_of_the_wrong_kind(kind):
    class Unrelated:
        pass

    # commands are click.Command objects, every other kind a class
    with pytest.raises(AssertionError, match=r"must be (a subclass|an instance) of"):
        check_component(kind, Unrelated)


def test_unknown_kind_is_named():
    with pytest.raises(ValueError, match="unknown component kind 'policy'"):
        check_component("policy", object)


def test_list_reader_is_a_buffer_reader():
    reader = ListReader(make_experiences(3))
    assert isinstance(reader, BufferReader)
    reader.expect_step(1)
    assert len(reader.read(2)) == 2 and reader.short_reason is None
