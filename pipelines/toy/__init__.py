"""The shipped toy: a tiny text-to-image flow model of handwritten digits.

``DIGITS_MODEL`` is a complete diffusers ``StableDiffusion3Pipeline`` folder (safetensors weights),
so it loads through the same code path as SD3.5::

    from diffusers import StableDiffusion3Pipeline
    from pipelines.toy import DIGITS_MODEL, digit_prompt

    pipe = StableDiffusion3Pipeline.from_pretrained(DIGITS_MODEL)
    images = pipe([digit_prompt(7)], height=16, width=16, num_inference_steps=10,
                  guidance_scale=1.0, max_sequence_length=8, output_type="pt").images

It was trained on scikit-learn's bundled 8x8 digits (upsampled to 16x16, gray on 3 channels) by
``scripts/make_digits_model.py``, which reproduces the folder from a fixed seed. The model is
deliberately undertrained: its samples are recognisable digits often enough for the ``digit``
reward to sit mid-range, which leaves GRPO visible headroom.

``text_encoder_3`` is a placeholder T5 whose output is exactly zero (its final norm has zero
weight): the same T5 part SD3 computes when loaded with ``text_encoder_3=None``, but the folder
loads with a plain ``from_pretrained``. Its ``max_sequence_length`` only sets how many of those
zero tokens join the text sequence; the model was trained with 1 to 256 of them, and the short
default below keeps each transformer call cheap.

The video toy (``DIGITS_VIDEO_MODEL``, family ``wan``) is a ``WanPipeline`` of the same digits
crossing a 16x16 frame in 5 frames, in the direction its caption asks
(:func:`digit_video_prompt`; ``scripts/make_digits_video_model.py``).

The discrete toy (``DIGITS_DISCRETE_MODELS``, family ``digits_discrete``) models the same digits
as 8x8 tokens of intensity 0..16, one folder per token path (masked, uniform, metric).
"""

from __future__ import annotations

from pathlib import Path

DIGITS_MODEL = str((Path(__file__).parent / "digits-sd3").resolve())
"""Absolute path of the shipped pipeline folder (pass it to ``from_pretrained``)."""

DIGIT_EDITS_MODEL = str((Path(__file__).parent / "digit-edits-kontext").resolve())
"""The shipped toy editing model (a ``FluxKontextPipeline`` folder, made by
``scripts/make_digit_edit_model.py``): it rewrites the right-hand digit of a 16x32 image."""

DIGITS_VIDEO_MODEL = str((Path(__file__).parent / "digits-video-wan").resolve())
"""The shipped toy video model (a ``WanPipeline`` folder, made by
``scripts/make_digits_video_model.py``): 5 frames of 16x16, a digit moving right, left, down or
up, latents ``[4, 3, 8, 8]``."""

DIGITS_DISCRETE_MODELS = {
    kind: str((Path(__file__).parent / f"digits-discrete-{kind}").resolve())
    for kind in ("masked", "uniform", "metric")
}
"""The shipped discrete toy models by token path (``digits_discrete`` family folders, made by
``scripts/make_digits_discrete_model.py``): 8x8 intensity tokens, one model per path."""

TOY_NAMES = {
    "digits": DIGITS_MODEL,
    "digit_edits": DIGIT_EDITS_MODEL,
    "digits_video": DIGITS_VIDEO_MODEL,
    "digits_discrete": DIGITS_DISCRETE_MODELS["masked"],
    "digits_discrete_masked": DIGITS_DISCRETE_MODELS["masked"],
    "digits_discrete_uniform": DIGITS_DISCRETE_MODELS["uniform"],
    "digits_discrete_metric": DIGITS_DISCRETE_MODELS["metric"],
}
"""The short names ``model.path`` may give for the shipped toy folders (``digits_discrete`` is
the masked model)."""

RESOLUTION = 16
"""Image side in pixels the model was trained at (latents are 4 x 8 x 8)."""

NUM_STEPS = 10
"""Euler steps the base reward below was measured with."""

GUIDANCE = 1.0
"""CFG scale the base reward was measured with (1.0: no CFG, one model call per step)."""

MAX_SEQUENCE_LENGTH = 8
"""T5 length to pass as ``max_sequence_length`` (the pipeline's default 256 works but is slow)."""


VIDEO_SIZE = 16
"""Frame side in pixels of the video toy."""

VIDEO_FRAMES = 5
"""Frames per clip of the video toy (``2k + 1``: its VAE keeps the first frame, then pairs)."""

VIDEO_NUM_STEPS = 10
"""Euler steps the video toy's base reward was measured with."""

VIDEO_MAX_SEQUENCE_LENGTH = 16
"""UMT5 tokens of the video toy's captions (the pipeline's default 512 works but is slow)."""

VIDEO_DIRECTIONS = ("right", "left", "down", "up")
"""The directions the video toy's captions name."""


def digit_prompt(d: int) -> str:
    """The prompt the toy was trained on for digit ``d`` (0-9): ``"a handwritten digit 7"``."""
    if not 0 <= int(d) <= 9:
        raise ValueError(f"digit must be 0-9, got {d}")
    return f"a handwritten digit {int(d)}"


def digit_video_prompt(d: int, direction: str) -> str:
    """The video toy's caption: ``"a handwritten digit 7 moving left"``."""
    if direction not in VIDEO_DIRECTIONS:
        raise ValueError(f"direction must be one of {', '.join(VIDEO_DIRECTIONS)}, got "
                         f"{direction!r}")
    return f"{digit_prompt(d)} moving {direction}"


__all__ = [
    "DIGITS_MODEL",
    "DIGITS_DISCRETE_MODELS",
    "DIGITS_VIDEO_MODEL",
    "DIGIT_EDITS_MODEL",
    "GUIDANCE",
    "MAX_SEQUENCE_LENGTH",
    "NUM_STEPS",
    "RESOLUTION",
    "TOY_NAMES",
    "VIDEO_DIRECTIONS",
    "VIDEO_FRAMES",
    "VIDEO_MAX_SEQUENCE_LENGTH",
    "VIDEO_NUM_STEPS",
    "VIDEO_SIZE",
    "digit_prompt",
    "digit_video_prompt",
]
