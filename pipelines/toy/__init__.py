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
"""

from __future__ import annotations

from pathlib import Path

DIGITS_MODEL = str((Path(__file__).parent / "digits-sd3").resolve())
"""Absolute path of the shipped pipeline folder (pass it to ``from_pretrained``)."""

DIGIT_EDITS_MODEL = str((Path(__file__).parent / "digit-edits-kontext").resolve())
"""The shipped toy editing model (a ``FluxKontextPipeline`` folder, made by
``scripts/make_digit_edit_model.py``): it rewrites the right-hand digit of a 16x32 image."""

RESOLUTION = 16
"""Image side in pixels the model was trained at (latents are 4 x 8 x 8)."""

NUM_STEPS = 10
"""Euler steps the base reward below was measured with."""

GUIDANCE = 1.0
"""CFG scale the base reward was measured with (1.0: no CFG, one model call per step)."""

MAX_SEQUENCE_LENGTH = 8
"""T5 length to pass as ``max_sequence_length`` (the pipeline's default 256 works but is slow)."""


def digit_prompt(d: int) -> str:
    """The prompt the toy was trained on for digit ``d`` (0-9): ``"a handwritten digit 7"``."""
    if not 0 <= int(d) <= 9:
        raise ValueError(f"digit must be 0-9, got {d}")
    return f"a handwritten digit {int(d)}"


__all__ = [
    "DIGITS_MODEL",
    "DIGIT_EDITS_MODEL",
    "GUIDANCE",
    "MAX_SEQUENCE_LENGTH",
    "NUM_STEPS",
    "RESOLUTION",
    "digit_prompt",
]
