"""The shipped toy assets: the digit classifier, the digits pipeline folder, and their rewards.

Everything here loads from the repository (no network, no hub) and runs in well under a minute on
2 CPU cores.
"""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
import torch

import reward_models
from helpers import ROOT
from pipelines.toy import (
    DIGITS_MODEL,
    GUIDANCE,
    MAX_SEQUENCE_LENGTH,
    NUM_STEPS,
    RESOLUTION,
    digit_prompt,
)
from reward_models import Media
from reward_models.digits import (
    digits_to_images,
    load_digit_classifier,
    load_digit_split,
    target_digits,
    to_digit_grid,
)

if TYPE_CHECKING:
    from diffusers import StableDiffusion3Pipeline

SCRIPTS = ROOT / "scripts"


def _script(name: str) -> ModuleType:
    """Import ``scripts/<name>.py`` as a module (scripts are not a package)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def heldout() -> tuple[torch.Tensor, torch.Tensor]:
    _, _, x_test, y_test = load_digit_split()
    return x_test, y_test


@pytest.fixture(scope="module")
def pipe() -> StableDiffusion3Pipeline:
    from diffusers import StableDiffusion3Pipeline

    pipeline = StableDiffusion3Pipeline.from_pretrained(DIGITS_MODEL)
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _sample(
    pipeline: StableDiffusion3Pipeline, digits: list[int], seeds: list[int], **kwargs: float
) -> torch.Tensor:
    settings = dict(height=RESOLUTION, width=RESOLUTION, num_inference_steps=NUM_STEPS,
                    guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH)
    settings.update(kwargs)
    return pipeline(
        prompt=[digit_prompt(d) for d in digits], output_type="pt",
        generator=[torch.Generator().manual_seed(s) for s in seeds], **settings,
    ).images


@pytest.mark.parametrize("size", [8, RESOLUTION, 28])
def test_classifier_heldout_accuracy(heldout, size: int) -> None:
    x_test, y_test = heldout
    model = load_digit_classifier()
    with torch.no_grad():
        predicted = model(to_digit_grid(digits_to_images(x_test, size))).argmax(dim=1)
    assert (predicted == y_test).float().mean().item() >= 0.97


def test_digit_reward_scores_real_digits(heldout) -> None:
    x_test, y_test = heldout
    images = digits_to_images(x_test, RESOLUTION)
    reward = reward_models.get("digit")
    right = [digit_prompt(int(d)) for d in y_test]
    wrong = [digit_prompt((int(d) + 3) % 10) for d in y_test]
    good = reward(Media("image", images), right, [{} for _ in right])
    bad = reward(Media("image", images), wrong, [{} for _ in wrong])
    assert good.scores.dtype == torch.float32 and good.scores.shape == (len(y_test),)
    assert good.scores.mean() > 0.85 and good.info["accuracy"] >= 0.97
    assert bad.scores.mean() < 0.05
    # metadata wins over the prompt; video is the mean over frames
    meta = reward(Media("image", images[:4]), wrong[:4], [{"digit": int(d)} for d in y_test[:4]])
    torch.testing.assert_close(meta.scores, good.scores[:4])
    video = torch.stack([images[:4], images[:4].flip(-1)], dim=1)  # [4, 2, 3, H, W]
    flipped = reward(Media("image", images[:4].flip(-1)), right[:4], [{}] * 4).scores
    frames = reward(Media("video", video), right[:4], [{}] * 4).scores
    torch.testing.assert_close(frames, (good.scores[:4] + flipped) / 2)


def test_target_digits_from_metadata_or_prompt() -> None:
    assert target_digits(["a handwritten digit 7", "x"], [{}, {"digit": 2}]).tolist() == [7, 2]
    with pytest.raises(ValueError, match="metadata"):
        target_digits(["a handwritten digit"], [{}])
    with pytest.raises(ValueError, match="metadata"):
        target_digits(["digits 12"], [{}])


def test_jpeg_rewards_rank_flat_above_noise() -> None:
    flat = torch.full((1, 3, 64, 64), 0.5)
    noise = torch.rand((1, 3, 64, 64), generator=torch.Generator().manual_seed(0))
    media = Media("image", torch.cat([flat, noise]))
    small = reward_models.get("jpeg_compressibility")(media, ["", ""], [{}, {}]).scores
    large = reward_models.get("jpeg_incompressibility")(media, ["", ""], [{}, {}]).scores
    assert small[0] > small[1] and large[1] > large[0]
    torch.testing.assert_close(small, -large)
    video = Media("video", torch.stack([flat, noise], dim=1))  # one clip, two frames
    clip = reward_models.get("jpeg_incompressibility")(video, [""], [{}]).scores
    torch.testing.assert_close(clip, large.mean(dim=0, keepdim=True))


def test_tokenizers_cover_prompts(pipe) -> None:
    tokenizer = pipe.tokenizer
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(digit_prompt(7)).input_ids)
    assert tokens == ["<|startoftext|>", "a</w>", "handwritten</w>", "digit</w>", "7</w>",
                      "<|endoftext|>"]
    # anything else falls back to byte-level characters; the unknown token is <|endoftext|>
    ids = tokenizer("Hello, wörld! 42").input_ids
    assert ids.count(tokenizer.unk_token_id) == 1 and ids[-1] == tokenizer.eos_token_id
    assert pipe.text_encoder.config.max_position_embeddings >= tokenizer.model_max_length


def test_pipeline_folder_loads_and_samples(pipe) -> None:
    from diffusers import StableDiffusion3Pipeline

    images = _sample(pipe, [3, 8], [0, 1])
    assert images.shape == (2, 3, RESOLUTION, RESOLUTION)
    assert torch.isfinite(images).all() and images.min() >= 0 and images.max() <= 1
    # the placeholder T5 outputs zeros: loading without it gives the same images
    no_t5 = StableDiffusion3Pipeline.from_pretrained(
        DIGITS_MODEL, text_encoder_3=None, tokenizer_3=None
    )
    no_t5.set_progress_bar_config(disable=True)
    torch.testing.assert_close(_sample(no_t5, [3, 8], [0, 1]), images)


def test_base_model_is_conditioned_with_headroom(pipe) -> None:
    digits = [d for d in range(10) for _ in range(4)]
    images = _sample(pipe, digits, list(range(4)) * 10)
    scores = reward_models.get("digit")(Media("image", images), [""] * 40,
                                        [{"digit": d} for d in digits]).scores
    assert 0.2 < scores.mean().item() < 0.85  # knows digits (chance is 0.1), leaves room for RL


@pytest.mark.slow
def test_make_scripts_are_reproducible() -> None:
    classifier = _script("make_digit_classifier")
    first = classifier.train_classifier(epochs=1).state_dict()
    second = classifier.train_classifier(epochs=1).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)

    model = _script("make_digits_model")
    runs = [model.make_digits_model(vae_steps=2, flow_steps=2, seed=0) for _ in range(2)]
    for name in ("vae", "transformer", "text_encoder", "text_encoder_2"):
        a, b = (getattr(run, name).state_dict() for run in runs)
        assert all(torch.equal(a[k], b[k]) for k in a), name
