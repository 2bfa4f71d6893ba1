"""Hard texts for speech models: the built-in prompt set ``tts_hard``.

FlowTTS-GRPO trains on texts that a TTS model gets wrong most often. This set makes them from
templates, without any download: numbers, dates and times, rare words, tongue twisters and long
sentences, in equal shares. Each prompt is the written text the model reads; its metadata holds

- ``"text"``: the same text as spoken English words (lower case, digits spelled out, no
  punctuation): the reference an ASR transcript is scored against (``wer`` / ``cer``);
- ``"category"``: one of :data:`CATEGORIES`.

Everything is a pure function of ``(count, seed)``: the same call gives the same prompts.
"""

from __future__ import annotations

import random
import re

from flowgrpo import seeding

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth",
             "eight": "eighth", "nine": "ninth", "twelve": "twelfth"}
_MONTHS = ("January February March April May June July August September October November "
           "December").split()

_RARE_WORDS = (
    "quinoa", "epitome", "synecdoche", "worcestershire", "onomatopoeia", "anemone",
    "otorhinolaryngologist", "phenomenon", "isthmus", "hyperbole", "choir", "colonel",
    "quixotic", "ephemeral", "mischievous", "sesquipedalian", "bourgeoisie", "archipelago",
    "rhythm", "squirrel", "penguin", "thoroughly", "February", "Wednesday",
)
_RARE_FRAMES = (
    "The word {a} is often mispronounced, and so is {b}.",
    "Please say {a}, then {b}, then {c}, clearly.",
    "She wrote {a} and {b} on the board before class.",
)
_TWISTERS = (
    "She sells seashells by the seashore.",
    "Peter Piper picked a peck of pickled peppers.",
    "How much wood would a woodchuck chuck if a woodchuck could chuck wood?",
    "Red lorry, yellow lorry, red lorry, yellow lorry.",
    "Unique New York, you know you need unique New York.",
    "Six slippery snails slid slowly seaward.",
    "The sixth sick sheik's sixth sheep's sick.",
    "Fred fed Ted bread and Ted fed Fred bread.",
    "Irish wristwatch, Swiss wristwatch.",
    "A proper copper coffee pot.",
)
_CLAUSES = (
    "the committee met on a rainy afternoon to discuss the budget for the coming year",
    "although the train was late the passengers waited patiently on the crowded platform",
    "a small bird landed on the windowsill and looked curiously at the sleeping cat",
    "the engineers tested the bridge again after the storm had passed through the valley",
    "every morning the baker opens the shop before the first customers arrive",
    "the museum will close early tomorrow because the staff are preparing a new exhibition",
    "she read the letter twice before deciding to call her brother in the evening",
    "the old map showed a path through the forest that nobody had walked for years",
)


def spoken_number(n: int) -> str:
    """A non-negative integer below 10**12 in words: ``4372`` -> ``four thousand three hundred
    seventy two``."""
    if not 0 <= n < 10**12:
        raise ValueError(f"spoken_number covers 0 <= n < 10**12, got {n}")
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + spoken_number(rest))
    for scale, name in _SCALES:
        if n >= scale:
            rest = n % scale
            return (spoken_number(n // scale) + " " + name
                    + ("" if rest == 0 else " " + spoken_number(rest)))
    raise AssertionError("unreachable")


def spoken_ordinal(n: int) -> str:
    """``1`` -> ``first``, ``22`` -> ``twenty second``, ``30`` -> ``thirtieth``."""
    words = spoken_number(n).split()
    last = words[-1]
    if last in _ORDINALS:
        words[-1] = _ORDINALS[last]
    elif last.endswith("y"):
        words[-1] = last[:-1] + "ieth"
    else:
        words[-1] = last + "th"
    return " ".join(words)


def spoken_year(year: int) -> str:
    """Years as they are read: ``1987`` -> ``nineteen eighty seven``, ``2005`` -> ``two
    thousand five``, ``2024`` -> ``twenty twenty four``, ``1900`` -> ``nineteen hundred``."""
    if 2000 <= year < 2010:
        return spoken_number(year)
    high, low = divmod(year, 100)
    if low == 0:
        return spoken_number(high) + " hundred"
    return spoken_number(high) + " " + ("oh " + _ONES[low] if low < 10 else spoken_number(low))


def normalize(text: str) -> str:
    """Lower case, words only: how a reference text and an ASR transcript are compared."""
    return " ".join(re.sub(r"[^a-z' ]+", " ", text.lower().replace("-", " ")).split())


def _numbers(rng: random.Random) -> tuple[str, str]:
    kind = rng.randrange(4)
    if kind == 0:
        n = rng.randrange(1000, 1_000_000)
        return (f"The invoice lists {n:,} items in total.",
                f"the invoice lists {spoken_number(n)} items in total")
    if kind == 1:
        whole, cents = rng.randrange(2, 1000), rng.randrange(1, 100)
        return (f"The price rose to {whole}.{cents:02d} dollars.",
                f"the price rose to {spoken_number(whole)} point "
                + " ".join(_ONES[int(d)] for d in f"{cents:02d}") + " dollars")
    if kind == 2:
        digits = "".join(str(rng.randrange(10)) for _ in range(7))
        return (f"Call {digits[:3]} {digits[3:]} before noon.",
                "call " + " ".join(_ONES[int(d)] for d in digits) + " before noon")
    a, b = rng.randrange(11, 100), rng.randrange(101, 10_000)
    return (f"Room {a} holds {b} books.",
            f"room {spoken_number(a)} holds {spoken_number(b)} books")


def _dates(rng: random.Random) -> tuple[str, str]:
    month, day = rng.randrange(12), rng.randrange(1, 29)
    year = rng.choice((rng.randrange(1900, 2000), rng.randrange(2000, 2031)))
    if rng.randrange(2):
        hour, minute = rng.randrange(1, 13), rng.randrange(10, 60)
        return (f"The meeting is on {_MONTHS[month]} {day}, {year}, at {hour}:{minute}.",
                f"the meeting is on {_MONTHS[month].lower()} {spoken_ordinal(day)} "
                f"{spoken_year(year)} at {spoken_number(hour)} {spoken_number(minute)}")
    return (f"She was born on {_MONTHS[month]} {day}, {year}.",
            f"she was born on {_MONTHS[month].lower()} {spoken_ordinal(day)} "
            f"{spoken_year(year)}")


def _rare_words(rng: random.Random) -> tuple[str, str]:
    a, b, c = rng.sample(_RARE_WORDS, 3)
    text = rng.choice(_RARE_FRAMES).format(a=a, b=b, c=c)
    return text, normalize(text)


def _tongue_twisters(rng: random.Random) -> tuple[str, str]:
    text = rng.choice(_TWISTERS)
    return text, normalize(text)


def _long_sentences(rng: random.Random) -> tuple[str, str]:
    first, second, third = rng.sample(_CLAUSES, 3)
    text = f"{first.capitalize()}, and {second}, while {third}."
    return text, normalize(text)


_MAKERS = {"numbers": _numbers, "dates": _dates, "rare_words": _rare_words,
           "tongue_twisters": _tongue_twisters, "long_sentences": _long_sentences}
CATEGORIES = tuple(_MAKERS)


def hard_prompts(count: int = 100, seed: int = 0) -> list[tuple[str, dict]]:
    """``count`` prompts, the categories in turn (equal shares), reproducible from ``seed``:
    ``[(written text, {"text": spoken words, "category": name})]``. Repeats are redrawn, so
    every prompt is distinct (within what the templates can make)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    rng = seeding.python_random("tts_hard_prompts", seed)
    out: list[tuple[str, dict]] = []
    seen: set[str] = set()
    for i in range(count):
        category = CATEGORIES[i % len(CATEGORIES)]
        for _ in range(50):
            written, spoken = _MAKERS[category](rng)
            if written not in seen:
                break
        seen.add(written)
        out.append((written, {"text": spoken, "category": category}))
    return out
