"""The contract every registered reward keeps (tiny models built in code, no hub, no network).

For each reward: ``[B]`` float32 finite scores (and well-shaped regions / components), the same
scores for the same input, scores that follow a permutation of the batch (groups permuted with
their samples), and a ValueError/TypeError naming the media kind it cannot score.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import os
import shutil
import tempfile

import pytest
import torch

import reward_models
from helpers.tiny_rewards import (
    tiny_aesthetic_head,
    tiny_clap_dir,
    tiny_hf_clip_dir,
    tiny_open_clip,
)
from reward_models import Media
from reward_models.ocr import render_text

WORDS = ["OPEN", "EXIT", "SALE", "MENU"]
PROMPTS = [f'the digit {d} on a sign that says "{w}"' for d, w in zip((3, 1, 4, 1), WORDS)]
METADATA = [  # "direction": which way the video reward's digits should move
    {"group": g, "boxes": [[0, 0, 0.5, 0.5], [0.25, 0.25, 1, 1]], "direction": d}
    for g, d in zip(("a", "a", "b", "b"), ("right", "left", "down", "up"))
]
PERM = [2, 0, 3, 1]  # mixes the groups: metadata travels with its sample


def clip_params() -> dict:
    return {"model": tiny_open_clip(), "pretrained": None, "device": "cpu"}


def seeded(build):
    """Random-init models: the same weights however often and in whatever order cases build."""

    def wrapper():
        torch.manual_seed(0)
        return build()

    return wrapper


@functools.cache
def served_clip_url() -> str:
    from reward_models.server import serve

    server = serve(seeded(lambda: reward_models.get("clip", **clip_params()))())
    atexit.register(server.close)
    return server.url


def get(name: str, **params):
    return lambda: reward_models.get(name, **params)


SPEECH = "tests/assets/speech"


def speech(name: str, package: str, **params):
    """A speech reward, skipped with a reason when its optional package is absent (looked up,
    not imported: resemblyzer is only a source of weights and does not import everywhere)."""

    def build():
        if importlib.util.find_spec(package) is None:
            pytest.skip(f"{package} is not installed (pip install -e '.[speech]')")
        return reward_models.get(name, **params)

    return build


CASES = {
    "clip": ("image", lambda: reward_models.get("clip", **clip_params())),
    "pickscore": ("image", lambda: reward_models.get(
        "pickscore", model=tiny_hf_clip_dir(), processor=tiny_hf_clip_dir(), device="cpu")),
    "aesthetic": ("image", lambda: reward_models.get(
        "aesthetic", head=tiny_aesthetic_head(), clip_model=tiny_hf_clip_dir(), device="cpu")),
    "ocr": ("image", get("ocr", threads=1)),
    "region": ("image", lambda: reward_models.get("region", inner="clip",
                                                 inner_params=clip_params(), grid=(4, 4))),
    "winrate": ("image", lambda: reward_models.get("winrate", inner="clip",
                                                  inner_params=clip_params())),
    "rank": ("image", lambda: reward_models.get("rank", inner="clip", inner_params=clip_params())),
    "mix": ("image", lambda: reward_models.get("mix", components=[
        {"name": "clip", "weight": 0.5, "params": clip_params()},
        {"name": "ocr", "weight": 2.0, "params": {"threads": 1}},
    ])),
    "remote": ("image", lambda: reward_models.get("remote", url=served_clip_url(), retries=0)),
    "clap": ("audio", lambda: reward_models.get("clap", model=tiny_clap_dir(), device="cpu")),
    "digit": ("image", get("digit")),
    "digit_motion": ("video", get("digit_motion")),
    "jpeg_compressibility": ("image", get("jpeg_compressibility")),
    "jpeg_incompressibility": ("image", get("jpeg_incompressibility")),
    "wer": ("audio", speech("wer", "pocketsphinx")),
    "cer": ("audio", speech("cer", "pocketsphinx", vocabulary=f"{SPEECH}/vocabulary.txt")),
    "speaker_sim": ("audio", speech("speaker_sim", "resemblyzer", speaker_wav=f"{SPEECH}/t0_a.wav",
                                    device="cpu")),
    "mcd": ("audio", get("mcd", reference_wav=f"{SPEECH}/t0_a.wav")),
}
TEST_ONLY = {"brightness_test"}  # registered by a conftest fixture for single tests


@functools.cache
def inputs(kind: str) -> Media:
    if kind == "audio":
        t = torch.arange(16000) / 16000
        tones = [torch.sin(2 * torch.pi * f * t) * (0.2 + 0.1 * i) for i, f in
                 enumerate((110.0, 330.0, 550.0, 990.0))]
        return Media("audio", torch.stack(tones)[:, None], sample_rate=16000)
    gen = torch.Generator().manual_seed(0)
    if kind == "video":  # the prompts' digits crossing a 16x16 frame, one direction each
        from reward_models.digits import load_digit_split, moving_digits

        grids, labels, _, _ = load_digit_split()
        first = [int(torch.nonzero(labels == d)[0]) for d in (3, 1, 4, 1)]
        video = moving_digits(grids[first], [m["direction"] for m in METADATA])
        noisy = (video + 0.05 * torch.randn(video.shape, generator=gen)).clamp(0, 1)
        return Media("video", (noisy * 255).round() / 255)
    signs = torch.stack([render_text(w, (64, 32), font_size=16) for w in WORDS])
    noisy = (signs + 0.05 * torch.randn(signs.shape, generator=gen)).clamp(0, 1)
    return Media("image", (noisy * 255).round() / 255)  # 8-bit exact: PNG transport is lossless


@functools.cache
def edit_source() -> str:
    """The editing rewards' source image: the first contract sign, as a PNG on disk."""
    from reward_models.media import to_pil

    folder = tempfile.mkdtemp(prefix="flowgrpo-edit-")
    atexit.register(shutil.rmtree, folder, True)
    path = os.path.join(folder, "source.png")
    to_pil(inputs("image").data[:1])[0].save(path)
    return path


CASES.update({
    "preserve": ("image", lambda: reward_models.get("preserve", image=edit_source())),
    "region_ocr": ("image", get("region_ocr", threads=1)),
    "edit_regions": ("image", lambda: reward_models.get(
        "edit_regions", inner="region_ocr", inner_params={"threads": 1}, grid=(4, 4),
        image=edit_source())),
})


def test_every_registered_reward_has_a_contract_case():
    missing = set(reward_models.names()) - set(CASES) - TEST_ONLY
    assert not missing, f"add contract cases for {sorted(missing)}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_reward_contract(name: str):
    if name not in reward_models.names():
        pytest.skip(f"reward {name!r} is not registered (its module is not imported)")
    kind, build = CASES[name]
    reward = seeded(build)()
    media = inputs(kind)
    b = len(media)
    out = reward(media, list(PROMPTS), [dict(m) for m in METADATA])
    assert out.scores.shape == (b,) and out.scores.dtype == torch.float32
    assert torch.isfinite(out.scores).all()
    if out.regions is not None:
        assert out.regions.shape[0] == b and out.regions.dim() == 3
        assert torch.isfinite(out.regions).all()
    for key, value in (out.components or {}).items():
        assert isinstance(key, str) and value.shape == (b,)
    assert isinstance(getattr(reward, "groupwise", False), bool)

    again = reward(media, list(PROMPTS), [dict(m) for m in METADATA])
    assert torch.equal(again.scores, out.scores), "same input, different scores"

    permuted = reward(media.index(PERM), [PROMPTS[i] for i in PERM], [METADATA[i] for i in PERM])
    torch.testing.assert_close(permuted.scores, out.scores[PERM], atol=1e-5, rtol=1e-5)
    if out.regions is not None:
        torch.testing.assert_close(permuted.regions, out.regions[PERM], atol=1e-5, rtol=1e-5)

    wrong = inputs("image") if kind == "audio" else inputs("audio")
    with pytest.raises((ValueError, TypeError), match=wrong.kind):
        reward(wrong, list(PROMPTS), [dict(m) for m in METADATA])
