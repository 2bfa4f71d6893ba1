"""The shared checks: one parameter checker with its did-you-mean hint (``Registry.build``,
config loading) and the value checks of :mod:`flowgrpo.validation`."""

from __future__ import annotations

import pytest

from flowgrpo.registry import ParameterError, Registry, check_params
from flowgrpo.validation import integer, is_integer, is_number, one_of


def _registry() -> Registry:
    registry: Registry = Registry("thing")

    @registry.register("scaled")
    def scaled(x, scale: float = 1.0, *, url: str):
        return x * scale, url

    return registry


def test_build_checks_the_parameters_then_constructs():
    registry = _registry()
    assert registry.build("scaled", 2, scale=3.0, url="u") == (6.0, "u")
    with pytest.raises(ParameterError, match=r"thing 'scaled' got an unknown parameter 'scal' "
                                             r"\(did you mean scale\?\); valid parameters: "
                                             r"scale, url"):
        registry.build("scaled", 2, scal=3.0, url="u")
    with pytest.raises(ParameterError, match="thing 'scaled' is missing parameter 'url'"):
        registry.build("scaled", 2)


def test_a_parameter_error_is_caught_as_a_type_error_and_as_a_value_error():
    assert issubclass(ParameterError, TypeError) and issubclass(ParameterError, ValueError)


def test_check_params_skips_the_callers_arguments_and_names_supplied_ones():
    def estimator(rewards, groups, gamma: float = 1.0, progress: float = 0.0):
        return rewards

    check_params(estimator, {"gamma": 2.0}, skip=2, supplied=("progress",))
    with pytest.raises(ParameterError, match=r"'progress' \(supplied by the trainer\)"):
        check_params(estimator, {"progress": 0.5}, skip=2, supplied=("progress",))
    with pytest.raises(ParameterError, match="valid: none"):
        check_params(lambda x: x, {"y": 1}, skip=1)
    with pytest.raises(ParameterError, match="must be a dict"):
        check_params(estimator, [1])
    check_params(lambda x, **kw: x, {"anything": 1}, skip=1)  # open-ended: nothing to check


def test_value_checks_refuse_bools_as_numbers():
    assert is_integer(3) and not is_integer(True) and not is_integer(3.0)
    assert is_number(0.5) and is_number(2) and not is_number(False) and not is_number("1")
    assert integer("draws", 2, 1) == 2
    with pytest.raises(ValueError, match="draws must be an integer >= 1, got True"):
        integer("draws", True, 1)
    assert one_of("level", "group", ("group", "sample")) == "group"
    with pytest.raises(ValueError, match="level must be one of group, sample, got 'token'"):
        one_of("level", "token", ("group", "sample"))
