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

DIGITS_DISCRETE_MODELS = {
    kind: str((Path(__file__).parent / f"digits-discrete-{kind}").resolve())
    for kind in ("masked", "uniform", "metric")
}
"""The shipped discrete toy models by token path (``digits_discrete`` family folders, made by
``scripts/make_digits_discrete_model.py``): 8x8 intensity tokens, one model per path."""

TOY_NAMES = {
    "digits": DIGITS_MODEL,
    "digit_edits": DIGIT_EDITS_MODEL,
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


def digit_prompt(d: int) -> str:
    """The prompt the toy was trained on for digit ``d`` (0-9): ``"a handwritten digit 7"``."""
    if not 0 <= int(d) <= 9:
        raise ValueError(f"digit must be 0-9, got {d}")
    return f"a handwritten digit {int(d)}"


__all__ = [
    "DIGITS_MODEL",
    "DIGITS_DISCRETE_MODELS",
    "DIGIT_EDITS_MODEL",
    "GUIDANCE",
    "MAX_SEQUENCE_LENGTH",
    "NUM_STEPS",
    "RESOLUTION",
    "TOY_NAMES",
    "digit_prompt",
]
