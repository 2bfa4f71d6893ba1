"""``Registry.registered`` and ``Registry.snapshot``: a temporary registration leaves the
registry exactly as it found it (objects and origins), on a normal exit and on an error; the
tests use them instead of the registry's private tables."""

from __future__ import annotations

import pytest

from flowgrpo.registry import Registry, UnknownNameError, origin_of


def first():
    return 1


def second():
    return 2


def fresh() -> Registry:
    """A registry holding ``kept`` (a kind no installed distribution has entry points for)."""
    registry = Registry("temporary test thing")
    registry.register("kept")(first)
    return registry


def test_registered_adds_a_name_for_the_block_only():
    registry = fresh()
    with registry.registered("temporary", second) as obj:
        assert obj is second
        assert registry.get("temporary") is second
        assert "temporary" in registry.names()
    assert "temporary" not in registry
    assert registry.names() == ["kept"]
    assert registry.origins() == {"kept": origin_of(first)}
    with pytest.raises(UnknownNameError):
        registry.get("temporary")


def test_registered_restores_a_replaced_name_and_its_origin():
    registry = fresh()
    name = registry.add(second, "added")  # an origin other than the one registered() records
    with registry.registered("kept", second), registry.registered(name, first):
        assert registry.get("kept") is second
        assert registry.get(name) is first
        assert registry.origin("kept") == origin_of(second)
    assert registry.get("kept") is first
    assert registry.get(name) is second
    assert registry.origins() == {"added": origin_of(second), "kept": origin_of(first)}


def test_registered_restores_on_an_error():
    registry = fresh()
    with pytest.raises(RuntimeError), registry.registered("temporary", second):
        raise RuntimeError("inside")
    assert "temporary" not in registry


def test_snapshot_drops_what_the_block_added():
    registry = fresh()
    with registry.snapshot() as same:
        assert same is registry
        registry.register("new")(second)
        name = registry.add(lambda: 3)
        assert registry.get("math:sqrt")(4.0) == 2.0  # a reference, resolved and kept
        assert {"new", name, "math:sqrt"} <= set(registry.origins())
    assert registry.names() == ["kept"]
    assert registry.get("kept") is first
    assert registry.origins() == {"kept": origin_of(first)}


def test_snapshot_restores_on_an_error():
    registry = fresh()
    with pytest.raises(RuntimeError), registry.snapshot():
        registry.register("new")(second)
        raise RuntimeError("inside")
    assert registry.names() == ["kept"]
