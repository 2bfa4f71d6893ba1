"""Every random stream is declared once in ``flowgrpo.seeding`` and keeps the value of the formula
it had before it was declared there (docs/design.md, "Randomness"): recorded runs rest on them."""

from __future__ import annotations

import hashlib
import random
import re
from pathlib import Path

import pytest
import torch

from flowgrpo import seeding
from flowgrpo.seeding import hash_seed

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flowgrpo", "samplers", "reward_models", "pipelines")


def _blake_unit(key: str) -> float:
    digest = hashlib.blake2b(key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64


# name -> (the formula the code used before, a few inputs)
LEGACY = {
    "prompt_groups": (lambda s, e: hash_seed(s, e), [(0, 0), (42, 3), (7, 1000)]),
    "rollout_noise": (lambda s, e, i: hash_seed(s, e, i, 1), [(0, 0, 0), (42, 3, 17), (7, 9, 255)]),
    "minibatch_order": (lambda s, e: hash_seed(s, e, 2), [(0, 0), (42, 3), (7, 1000)]),
    "objective_draws": (lambda s, t, i: hash_seed(s, t, i, 3), [(0, 0, 0), (42, 3, 17)]),
    "pruning": (lambda s, e: hash_seed(s, e, 4), [(0, 0), (42, 3), (7, 1000)]),
    "process": (lambda s, r: s + r, [(0, 0), (42, 1), (7, 3)]),
    "flash_step": (lambda s, t, g: f"flowgrpo-flash:{s}:{t}:{g}", [(0, 0, 0), (42, 3, 5)]),
    "window_start": (lambda s, t: f"flowgrpo-window:{s}:{t}", [(0, 0), (42, 3)]),
    "views": (lambda s, t: s * 1_000_003 + t, [(0, 0), (42, 3), (7, 1000)]),
    "enhancer_shuffle": (lambda s, p: f"{s}\x00{p}", [(0, "a cat"), (42000129, "two dogs")]),
    "mix_draw": (lambda s, t, i: f"{s}/{t}/{i}", [(0, 0, 0), (42, 3, 17)]),
    "mix_eval_draw": (lambda s, g, p: f"{s}/eval/{g}/{p}", [(0, 0, 0), (42, "", 5), (7, 3, 1)]),
    "eval_noise": (lambda i: 2**31 - 1 + i, [(0,), (5,), (123,)]),
    "sample_noise": (lambda s, i: s + i, [(0, 0), (42, 3)]),
    "tts_hard_prompts": (lambda s: s, [(0,), (5,)]),
    # streams declared after the table was pinned: their own formula, kept from then on
    "posterior_draws": (lambda s, t, i: hash_seed(s, t, i, 6), [(0, 0, 0), (42, 3, 17)]),
    "image_steps": (lambda n: hash_seed(n, 5), [(2**31 - 1,), (7,)]),
    "forward_states": (lambda s, t, i: hash_seed(s, t, i, 7), [(0, 0, 0), (42, 3, 17)]),
    "kl_steps": (lambda s, t: hash_seed(s, t, 8), [(0, 0), (42, 3)]),
    "preference_pairs": (lambda s, t: hash_seed(s, t, 9), [(0, 0), (42, 3)]),
}


def _sources() -> str:
    """The project's code, ``flowgrpo/seeding.py`` (where streams are declared) left out."""
    skip = ROOT / "flowgrpo" / "seeding.py"
    return "\n".join(f.read_text() for package in PACKAGES
                     for f in sorted((ROOT / package).rglob("*.py")) if f != skip)


def test_stream_names_are_unique():
    names = [s.name for s in seeding.STREAMS.values()]
    assert len(names) == len(set(names))
    assert list(seeding.STREAMS) == names  # each entry is filed under its own name
    with pytest.raises(ValueError, match="declared twice"):
        seeding._declare(*seeding.STREAMS.values(), seeding.STREAMS["views"])


def test_every_stream_is_drawn_somewhere():
    code = _sources()
    drawn = set(re.findall(r'\b(?:stream_seed|generator|python_random|uniform)\(\s*"(\w+)"', code))
    unused = [name for name in seeding.STREAMS if name not in drawn]
    assert not unused, f"declared but never drawn: {unused}"


def test_every_stream_is_pinned_here():
    assert set(LEGACY) == set(seeding.STREAMS)


@pytest.mark.parametrize("name", sorted(LEGACY))
def test_stream_keeps_its_legacy_value(name):
    formula, inputs = LEGACY[name]
    for parts in inputs:
        legacy = formula(*parts)
        assert seeding.key(name, *parts) == legacy
        assert random.Random(legacy).random() == seeding.python_random(name, *parts).random()
        if isinstance(legacy, int):
            assert seeding.stream_seed(name, *parts) == legacy
            expected = torch.rand(3, generator=torch.Generator().manual_seed(legacy))
            assert torch.equal(torch.rand(3, generator=seeding.generator(name, *parts)), expected)
        else:
            assert seeding.uniform(name, *parts) == _blake_unit(legacy)


def test_misuse_is_one_clear_error():
    with pytest.raises(KeyError, match="unknown random stream 'noise'"):
        seeding.key("noise", 0)
    with pytest.raises(TypeError, match=r"keyed by \(seed, epoch, sample\), got 2"):
        seeding.stream_seed("rollout_noise", 0, 1)
    with pytest.raises(TypeError, match="string key"):
        seeding.stream_seed("flash_step", 0, 1, 2)
