"""The one error summary every one-line report uses (``flowgrpo.errors.one_line``)."""

from __future__ import annotations

from flowgrpo.errors import one_line


def test_the_first_line_of_the_message():
    err = ValueError("  bad value\nTraceback (most recent call last):\n  ...\n")
    assert one_line(err) == "bad value"
    assert one_line(err, with_type=True) == "ValueError: bad value"


def test_an_error_without_a_message_is_its_type():
    assert one_line(KeyError()) == "KeyError"
    assert one_line(RuntimeError(" \n")) == "RuntimeError"
    assert one_line(AssertionError(), with_type=True) == "AssertionError"
