"""LTX-Video (``ltx``) against diffusers' ``LTXPipeline`` on a tiny model built in code: Euler
parity within 1e-5 with and without CFG (and with the guidance rescale), the packed noise draw,
the dynamic-shift schedule, decoding (with the timestep-conditioned decoder), region maps, a LoRA
round trip through ``load_lora_weights``, and option errors."""

from __future__ import annotations

import pytest
import torch

import pipelines
from helpers.family_cases import CASES, PROMPTS, STEPS, euler_rollout, pipeline_latents
from helpers.lora import assert_folder_and_lora_round_trip

TOL = 1e-5
CASE = CASES["ltx"]
SIZE = dict(height=32, width=64, num_frames=5)

PARITY = [  # (guidance, adapter options = extra pipeline arguments)
    (1.0, {}),
    (3.0, {}),
    (3.0, {"guidance_rescale": 0.7}),
    (4.0, {"negative_prompt": "blurry, jittery"}),
]


@pytest.mark.parametrize(("guidance", "options"), PARITY,
                         ids=[f"g{g}-{'-'.join(o) or 'default'}" for g, o in PARITY])
def test_euler_rollout_matches_pipeline(guidance, options):
    adapter = CASE.make(**options)
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(1))
    ref = pipeline_latents(CASE, adapter, x, guidance, **options).float()
    ours = euler_rollout(adapter, x, guidance)
    diff = (ours - ref).abs().max().item()
    print(f"parity ltx guidance={guidance} {options or ''}: max abs diff {diff:.3g}")
    assert ours.shape == ref.shape == (2, 16, 8)
    assert diff <= TOL
    assert (ours - x).abs().max() > 1e-2  # the rollout moved


def test_guidance_rescale_changes_the_guided_velocity_only():
    plain, rescaled = CASE.make(), CASE.make(guidance_rescale=0.7)
    x = plain.noise(2, torch.Generator().manual_seed(0))
    cond = plain.encode(PROMPTS)
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        assert (plain.velocity(x, sigma, cond, 3.0)
                - rescaled.velocity(x, sigma, cond, 3.0)).abs().max() > 1e-3
        torch.testing.assert_close(plain.velocity(x, sigma, cond, 1.0),
                                   rescaled.velocity(x, sigma, cond, 1.0), rtol=0, atol=0)


def test_noise_is_the_pipelines_packed_draw():
    adapter = CASE.make()
    ours = adapter.noise(2, torch.Generator().manual_seed(3))
    ref = adapter.pipeline.prepare_latents(2, 8, 32, 64, 5, torch.float32, "cpu",
                                           torch.Generator().manual_seed(3))
    assert ours.dtype == torch.float32 and torch.equal(ours, ref)
    assert ours.shape == (2, *adapter.latent_shape()) == (2, 16, 8)


def test_schedule_is_the_dynamic_shift_of_the_sequence_length():
    """``mu`` grows with the latent sequence length ``F' h w``: a bigger video gets a schedule
    shifted towards noise; both end at the scheduler's ``shift_terminal`` (0.1), then 0."""
    small, large = CASE.make(), CASE.make(height=64, width=128, num_frames=9)
    assert small.shift_mu() < large.shift_mu()
    a, b = small.schedule(STEPS), large.schedule(STEPS)
    assert a[0] == b[0] == 1.0 and a[-1] == b[-1] == 0.0
    assert abs(a[-2].item() - 0.1) < 1e-6 and abs(b[-2].item() - 0.1) < 1e-6
    assert (b[1:-2] > a[1:-2]).all()


@pytest.mark.parametrize("conditioned", [True, False])
def test_decode_matches_the_pipeline(conditioned):
    """The pipeline decodes its 2-step result as the adapter decodes the same rollout, with the
    timestep-conditioned decoder's noise drawn from a generator seeded with ``decode_seed``."""
    options = dict(decode_timestep=0.05, decode_noise_scale=0.025)
    adapter = CASE.make({"timestep_conditioning": conditioned}, decode_seed=7, **options)
    x = adapter.noise(1, torch.Generator().manual_seed(2))
    media = adapter.decode(x)
    assert media.shape == (1, 5, 3, 32, 64) and media.dtype == torch.float32
    assert 0.0 <= media.min() and media.max() <= 1.0
    out = adapter.pipeline(prompt=PROMPTS[:1], num_inference_steps=2, guidance_scale=1.0,
                           latents=x.clone(), output_type="pt", max_sequence_length=16,
                           generator=torch.Generator().manual_seed(7), **SIZE, **options)
    ours = adapter.decode(euler_rollout(adapter, x, 1.0, steps=2, prompts=PROMPTS[:1]))
    assert (ours - out.frames.float()).abs().max() <= TOL
    # a video decodes the same in any batch (its decode noise is its own)
    pair = adapter.decode(torch.cat([x, adapter.noise(1)]))
    torch.testing.assert_close(pair[:1], media, rtol=0, atol=1e-6)
    if conditioned:  # the decode options reach the decoder
        other = CASE.make(decode_timestep=0.5, decode_noise_scale=0.4, decode_seed=7)
        assert (other.decode(x) - media).abs().max() > 1e-3


def test_position_weights_cover_every_latent_frame():
    adapter = CASE.make()
    x = adapter.noise(2)  # 2 latent frames of 2x4 tokens
    regions = torch.zeros(2, 32, 64)
    regions[:, :16, :16] = 1.0  # the top-left token (16 px: the tiny VAE) of every frame
    w = adapter.position_weights(regions, x)
    assert w.shape == (2, 16, 1) and (w * x).shape == x.shape
    grid = adapter.pipeline._unpack_latents(w, 2, 2, 4)  # [2, 1, 2, 2, 4]
    corner = torch.zeros(2, 4)
    corner[0, 0] = 1.0
    assert torch.equal(grid[:, 0], corner.expand(2, 2, 2, 4))


def test_encodings_are_declared_per_prompt():
    """Prompts are padded to ``max_sequence_length`` whatever the batch, so the family declares
    per-prompt encodings; that they concatenate to the batch's is checked for every family in
    ``tests/families/test_family_contract.py``."""
    assert pipelines.LTXAdapter.per_prompt_encoding


def test_folder_and_lora_round_trip_through_diffusers(tmp_path):
    """The saved pipeline loads back through ``pipelines.load``; a LoRA written with
    ``save_lora`` loads with ``load_lora``, and the pipeline with that LoRA gives the adapter's
    rollout."""
    adapter = CASE.make()
    x = adapter.noise(2, torch.Generator().manual_seed(5))

    def outputs(a):
        return euler_rollout(a, x, 3.0, steps=3)

    assert_folder_and_lora_round_trip(
        adapter, lambda folder: pipelines.load("ltx", folder, **CASE.options), tmp_path, outputs)
    fresh = CASE.make()
    fresh.load_lora(str(tmp_path / "lora"))
    out = fresh.pipeline(prompt=list(PROMPTS), num_inference_steps=3, guidance_scale=3.0,
                         latents=x.clone(), output_type="latent", **CASE.call)
    assert (out.frames.float() - outputs(adapter)).abs().max() <= TOL


BAD_OPTIONS = [
    ({"height": 48}, "multiples of 32"),
    ({"num_frames": 6}, "4k \\+ 1"),
    ({"frame_rate": 0}, "positive"),
    ({"guidance_rescale": 1.5}, "\\[0, 1\\]"),
    ({"decode_timestep": -0.1}, ">= 0"),
    ({"decode_noise_scale": 2.0}, "\\[0, 1\\]"),
]


@pytest.mark.parametrize(("options", "match"), BAD_OPTIONS)
def test_bad_options_raise_one_line_errors(options, match):
    with pytest.raises(ValueError, match=match) as err:
        CASE.make(**options)
    assert "\n" not in str(err.value) and str(err.value).startswith("ltx: ")
