"""Z-Image (base and Turbo) against diffusers' ``ZImagePipeline`` on tiny models built in code:
Euler parity within 1e-5 without CFG, with CFG (default and named negative prompts, the
pipeline's CFG renormalisation and truncation) and on the Turbo few-step schedule; the initial
noise; the schedules; decoding; per-prompt encodings; a LoRA round trip through the adapter and
through diffusers' ``load_lora_weights``; option errors. The family contract (one training step
through the unchanged trainer) runs from ``CASES`` in tests/families/test_family_contract.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from helpers.family_cases import CASES, PROMPTS, euler_rollout
from helpers.lora import assert_folder_and_lora_round_trip
from helpers.tiny_z_image import Z_IMAGE, tiny_z_image_pipeline
from pipelines.base import Cond
from pipelines.z_image import ZImageAdapter

TOL = 1e-5
CASE = CASES["z_image"]
TURBO_STEPS = 8  # Z-Image-Turbo: 8 function evaluations, guidance_scale 0


def make(turbo: bool = False, **options: Any) -> ZImageAdapter:
    return CASE.make({"turbo": turbo}, **options)


def pipeline_latents(adapter: ZImageAdapter, x: torch.Tensor, guidance_scale: float, steps: int,
                     **extra: Any) -> torch.Tensor:
    """The pipeline's own loop from ``x`` with ITS guidance convention (``guidance_scale``)."""
    return adapter.pipeline(
        prompt=list(PROMPTS), num_inference_steps=steps, guidance_scale=guidance_scale,
        latents=x.clone(), output_type="latent", **Z_IMAGE, **extra,
    ).images


PARITY = [  # (id, turbo, pipeline guidance_scale, steps, adapter options, pipeline arguments)
    ("cfg_off", False, 0.0, 5, {}, {}),
    ("cfg_default_negative", False, 3.0, 5, {}, {}),
    ("cfg_negative_prompt", False, 3.0, 5, {"negative_prompt": "blurry, low quality"},
     {"negative_prompt": ["blurry, low quality"] * len(PROMPTS)}),
    ("cfg_normalized_truncated", False, 4.0, 5,
     {"negative_prompt": "blurry", "cfg_normalization": 1.05, "cfg_truncation": 0.5},
     {"negative_prompt": ["blurry"] * len(PROMPTS), "cfg_normalization": 1.05,
      "cfg_truncation": 0.5}),
    ("turbo", True, 0.0, TURBO_STEPS, {}, {}),
]


@pytest.mark.parametrize(("turbo", "scale", "steps", "options", "extra"),
                         [p[1:] for p in PARITY], ids=[p[0] for p in PARITY])
def test_euler_rollout_matches_pipeline(turbo, scale, steps, options, extra):
    """Our ``guidance`` is the pipeline's ``guidance_scale + 1`` (its CFG is
    ``pos + g (pos - neg)``); the velocity is minus the model output, at time ``1 - sigma``."""
    adapter = make(turbo, **options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(0))
    ours = euler_rollout(adapter, x, scale + 1.0, steps=steps)
    theirs = pipeline_latents(adapter, x, scale, steps, **extra)
    diff = (ours - theirs).abs().max().item()
    print(f"z_image parity {'turbo' if turbo else 'base'} scale={scale} {options}: {diff:.2e}")
    assert diff <= TOL
    assert (ours - x).abs().max() > 0.1  # the rollout moved
    if scale > 0:  # CFG changed the result (the parity is not that of two unguided loops)
        assert (ours - euler_rollout(adapter, x, 1.0, steps=steps)).abs().max() > 1e-3


def test_cfg_normalization_and_truncation_change_the_rollout():
    """The two CFG options bite on the tiny model, so their parity above is not vacuous."""
    x = make().noise(2, torch.Generator().manual_seed(0))
    plain = euler_rollout(make(negative_prompt="blurry"), x, 5.0)
    for options in ({"cfg_normalization": 1.05}, {"cfg_truncation": 0.5}):
        other = euler_rollout(make(negative_prompt="blurry", **options), x, 5.0)
        assert (other - plain).abs().max() > 1e-4, options


def test_velocity_is_the_negated_model_output_at_one_minus_sigma():
    adapter = make()
    cond = adapter.encode(PROMPTS)
    x = adapter.noise(2, torch.Generator().manual_seed(1))
    sigma = torch.tensor([0.8, 0.3])
    t = cond.tensors
    with torch.no_grad():
        raw = adapter.transformer(
            list(x.unsqueeze(2).unbind(0)), 1 - sigma,
            [e[:n] for e, n in zip(t["prompt_embeds"], t["prompt_length"].tolist())],
            return_dict=False)[0]
        v = adapter.velocity(x, sigma, cond, 1.0)
    # 1 - sigma here, (1000 - 1000 sigma) / 1000 in the adapter (the pipeline's rounding)
    torch.testing.assert_close(v, -torch.stack(raw).squeeze(2), atol=TOL, rtol=0)
    assert v.abs().max() > 0.1


def test_schedules_base_shifts_with_resolution_turbo_is_static():
    """Base: ``mu`` from the token count (another size, another schedule). Turbo: the scheduler's
    static shift 3 on ``linspace(1, 1/N, N)``, whatever the size, then 0."""
    base, base_big = make().schedule(5), make(height=32, width=32).schedule(5)
    assert not torch.allclose(base, base_big)
    s = torch.linspace(1.0, 1 / TURBO_STEPS, TURBO_STEPS)
    expected = torch.cat([3 * s / (1 + 2 * s), torch.zeros(1)])
    for adapter in (make(turbo=True), make(turbo=True, height=32, width=32)):
        sigmas = adapter.schedule(TURBO_STEPS)
        assert sigmas.dtype == torch.float32 and len(sigmas) == TURBO_STEPS + 1
        torch.testing.assert_close(sigmas, expected, atol=1e-6, rtol=0)


def test_noise_matches_pipeline_draw_and_seeds_per_sample():
    adapter = make()
    x = adapter.noise(2, torch.Generator().manual_seed(3))
    assert x.shape == (2, 4, 8, 8) and x.dtype == torch.float32
    drawn = adapter.pipeline.prepare_latents(2, 4, 16, 16, torch.float32, torch.device("cpu"),
                                             torch.Generator().manual_seed(3))
    torch.testing.assert_close(x, drawn, atol=0, rtol=0)
    cond = adapter.encode(PROMPTS)
    batch = adapter.initial_noise([torch.Generator().manual_seed(s) for s in (5, 6)], cond)
    for i, seed in enumerate((5, 6)):
        torch.testing.assert_close(batch[i:i + 1],
                                   adapter.noise(1, torch.Generator().manual_seed(seed)))
    assert not torch.allclose(batch[0], batch[1])
    big = make(height=32, width=48).noise(1, torch.Generator().manual_seed(0))
    assert big.shape == (1, 4, 16, 24)


def test_decode_matches_pipeline_decode():
    adapter = make()
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    latents = euler_rollout(adapter, x, 1.0)
    image = adapter.decode(latents)
    assert image.shape == (2, 3, 16, 16) and 0 <= image.min() and image.max() <= 1
    theirs = adapter.pipeline(prompt=list(PROMPTS), num_inference_steps=5, guidance_scale=0.0,
                              latents=x.clone(), output_type="pt", **Z_IMAGE).images
    torch.testing.assert_close(image, theirs, atol=TOL, rtol=0)


def test_encodings_are_per_prompt_and_concatenate():
    """Each prompt is padded to ``max_sequence_length`` before the text encoder (the pipeline's
    tokenizer call) and only its own tokens reach the model: encoding a prompt alone or in a batch
    gives the same tensors, so cached encodings concatenate."""
    adapter = make()
    long = "a very long prompt about a castle on a hill"
    both = adapter.encode([long, "two dogs"])
    alone = Cond.cat([adapter.encode([long]), adapter.encode(["two dogs"])])
    for key, value in both.tensors.items():
        torch.testing.assert_close(alone.tensors[key], value, atol=1e-6, rtol=0)
    t = both.tensors
    assert t["prompt_embeds"].shape[:2] == (2, Z_IMAGE["max_sequence_length"])
    assert t["prompt_length"][0] > t["prompt_length"][1]
    n = int(t["prompt_length"][1])
    assert t["prompt_embeds"][1, n:].abs().max() == 0 and t["prompt_embeds"][1, :n].abs().max() > 0
    # the pipeline's own list of per-prompt embeddings: the same tokens
    theirs, _ = adapter.pipeline.encode_prompt(prompt=[long, "two dogs"], device="cpu",
                                               do_classifier_free_guidance=False,
                                               max_sequence_length=Z_IMAGE["max_sequence_length"])
    for i in range(2):
        torch.testing.assert_close(t["prompt_embeds"][i, :len(theirs[i])], theirs[i])


def velocity_at_two_levels(adapter: ZImageAdapter) -> torch.Tensor:
    cond = adapter.encode(PROMPTS)
    x = adapter.noise(2, torch.Generator().manual_seed(4))
    return torch.stack([adapter.velocity(x, torch.full((2,), s), cond, 4.0) for s in (0.9, 0.2)])


def test_lora_round_trip_through_adapter_and_diffusers(tmp_path):
    """A LoRA saved with ``save_lora`` loads into the pipeline loaded from the saved folder
    (``load_lora``) and into a fresh ``ZImagePipeline`` with diffusers' ``load_lora_weights``:
    both give the trained velocities."""
    adapter = make()
    assert_folder_and_lora_round_trip(adapter, lambda path: ZImageAdapter(path, **Z_IMAGE),
                                      tmp_path, velocity_at_two_levels)
    with torch.no_grad():
        trained = velocity_at_two_levels(adapter)
    fresh = tiny_z_image_pipeline(seed=0)
    fresh.load_lora_weights(str(tmp_path / "lora"))
    with torch.no_grad():
        torch.testing.assert_close(velocity_at_two_levels(ZImageAdapter(pipeline=fresh, **Z_IMAGE)),
                                   trained)
    wrapped = {n for n, _ in adapter.transformer.named_modules() if n.endswith("attention.to_q")}
    assert any(n.startswith("noise_refiner") for n in wrapped)
    assert any(n.startswith("layers") for n in wrapped)


def test_position_weights_cover_the_latent_grid():
    adapter = make()
    regions = torch.zeros(2, 16, 16)
    regions[:, :8] = 1.0  # the top half of the image
    weights = adapter.position_weights(regions, adapter.noise(2))
    assert weights.shape == (2, 1, 8, 8)
    assert (weights[:, :, :4] == 1).all() and (weights[:, :, 4:] == 0).all()


@pytest.mark.parametrize(("options", "match"), [
    ({"width": 18}, "multiples of 4"),
    ({"max_sequence_length": 0}, "max_sequence_length must be at least 1"),
    ({"cfg_normalization": -1.0}, "cfg_normalization must be >= 0"),
    ({"cfg_truncation": 1.5}, r"cfg_truncation must be in \[0, 1\]"),
])
def test_bad_options_raise_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match) as err:
        make(**options)
    message = str(err.value)
    assert message.startswith("z_image:") and "\n" not in message


def test_no_model_path_is_refused():
    with pytest.raises(ValueError, match="z_image needs a hub id or a local folder"):
        ZImageAdapter()
