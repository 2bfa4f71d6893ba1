"""The built-in hard-text prompt set for speech models (``data.prompts: tts_hard``)."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from flowgrpo.data.prompts import load_prompts
from flowgrpo.data.tts_prompts import (
    CATEGORIES,
    hard_prompts,
    normalize,
    spoken_number,
    spoken_ordinal,
    spoken_year,
)


@pytest.mark.parametrize("n,words", [
    (0, "zero"), (13, "thirteen"), (40, "forty"), (42, "forty two"), (105, "one hundred five"),
    (1001, "one thousand one"), (4372, "four thousand three hundred seventy two"),
    (1_000_000, "one million"), (2_500_019, "two million five hundred thousand nineteen"),
])
def test_numbers_are_spelled_out(n, words):
    assert spoken_number(n) == words


def test_ordinals_and_years_are_read_as_people_say_them():
    assert [spoken_ordinal(d) for d in (1, 2, 3, 5, 12, 20, 22, 28)] == [
        "first", "second", "third", "fifth", "twelfth", "twentieth", "twenty second",
        "twenty eighth"]
    assert spoken_year(1987) == "nineteen eighty seven"
    assert spoken_year(2005) == "two thousand five"
    assert spoken_year(2024) == "twenty twenty four"
    assert spoken_year(1900) == "nineteen hundred"
    assert spoken_year(1905) == "nineteen oh five"
    with pytest.raises(ValueError, match="10\\*\\*12"):
        spoken_number(-1)


def test_the_set_is_balanced_reproducible_and_its_references_are_words_only():
    prompts = hard_prompts(100, seed=0)
    assert prompts == hard_prompts(100, seed=0) != hard_prompts(100, seed=1)
    assert Counter(meta["category"] for _, meta in prompts) == {c: 20 for c in CATEGORIES}
    for written, meta in prompts:
        assert written.strip() and meta["text"]
        assert re.fullmatch(r"[a-z' ]+", meta["text"]), meta["text"]  # what ASR can output
    numbers = [(w, m["text"]) for w, m in prompts if m["category"] == "numbers"]
    assert all(re.search(r"\d", w) for w, _ in numbers)  # the written text has digits to read
    longs = [m["text"] for _, m in prompts if m["category"] == "long_sentences"]
    assert min(len(t.split()) for t in longs) >= 30
    # every template but the 10 tongue twisters gives distinct prompts
    assert len({w for w, m in prompts if m["category"] != "tongue_twisters"}) == 80


def test_a_date_prompt_and_its_spoken_reference_agree():
    written, meta = next((w, m) for w, m in hard_prompts(50, seed=3)
                         if m["category"] == "dates")
    month, day, year = re.search(r"on (\w+) (\d+), (\d{4})", written).groups()
    assert meta["text"].startswith(("the meeting is on", "she was born on"))
    assert f"{month.lower()} {spoken_ordinal(int(day))} {spoken_year(int(year))}" in meta["text"]
    assert normalize("She sells sea-shells, by the SEASHORE!") == (
        "she sells sea shells by the seashore")


def test_tts_hard_is_a_builtin_prompt_set():
    prompts = load_prompts("tts_hard", "data.prompts")
    assert len(prompts) == 100 and prompts == hard_prompts(100, seed=0)
