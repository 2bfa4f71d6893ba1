"""``amused`` against diffusers' ``AmusedPipeline`` on a tiny pipeline built in code: the logits
its scheduler receives at every step, the tokens and images of its own sampling, the forward
masking, the schedule, the rollout's step and the family's loading and LoRA round trip."""

from __future__ import annotations

import math

import pytest
import torch

import samplers
from helpers.lora import assert_folder_and_lora_round_trip
from helpers.tiny_amused import CODES, SIDE, VOCAB, tiny_amused_pipeline
from pipelines.amused import LOG_ZERO, AmusedAdapter, pipeline_tokens

pytest.importorskip("diffusers")

PROMPTS = ["a red cube", "two dogs"]  # within the tiny tokenizer's 16 ids
STEPS = 6


def adapter(masking_schedule: str = "cosine", **options) -> AmusedAdapter:
    pipe = tiny_amused_pipeline(seed=0, masking_schedule=masking_schedule)
    pipe.set_progress_bar_config(disable=True)
    return AmusedAdapter(pipeline=pipe, **options)


def pipeline_run(ad: AmusedAdapter, guidance: float, seed: int = 0,
                 **call) -> tuple[list[tuple], torch.Tensor, object]:
    """The pipeline's own sampling, recording what its scheduler receives at every step (the
    guided logits, the timestep, the tokens), its final tokens and its images."""
    pipe, seen = ad.pipeline, []
    step = pipe.scheduler.step

    def recording(model_output, timestep, sample, generator=None, **kwargs):
        seen.append((model_output.clone(), int(timestep), sample.clone()))
        return step(model_output, timestep, sample, generator=generator, **kwargs)

    pipe.scheduler.step = recording
    try:
        tokens = pipe(list(PROMPTS), num_inference_steps=STEPS, guidance_scale=guidance,
                      output_type="latent", generator=torch.Generator().manual_seed(seed),
                      **call).images
        images = pipe(list(PROMPTS), num_inference_steps=STEPS, guidance_scale=guidance,
                      output_type="np", generator=torch.Generator().manual_seed(seed),
                      **call).images
    finally:
        del pipe.scheduler.step
    return seen[:STEPS], tokens, images


@pytest.mark.parametrize("guidance,options,call", [
    (1.0, {}, {}),
    (10.0, {}, {}),  # the pipeline's default guidance
    (4.0, dict(aesthetic_score=4.5, crop_coord=(2, 3)),
     dict(micro_conditioning_aesthetic_score=4.5, micro_conditioning_crop_coord=(2, 3))),
])
def test_logits_are_what_the_pipeline_steps_with(guidance, options, call):
    ad = adapter(**options)
    seen, _, _ = pipeline_run(ad, guidance, **call)
    cond = ad.encode(PROMPTS)
    assert [t for _, t, _ in seen] == list(range(STEPS - 1, -1, -1))
    sigmas = ad.schedule(STEPS)
    for k, (theirs, _, x) in enumerate(seen):
        with torch.no_grad():
            ours = ad.logits(x.flatten(1), sigmas[k].expand(len(PROMPTS)), cond, guidance)
        assert ours.shape == (len(PROMPTS), SIDE * SIDE, VOCAB)
        assert bool((ours[..., CODES:] == LOG_ZERO).all())  # the mask and unused ids
        torch.testing.assert_close(ours[..., :CODES], theirs.flatten(2).transpose(1, 2),
                                   rtol=0, atol=0)
        probs = torch.softmax(ours, -1)
        assert bool((probs[..., CODES:] == 0).all())


@pytest.mark.parametrize("guidance", [1.0, 10.0])
def test_the_pipelines_sampling_gives_the_same_tokens_and_images(guidance):
    ad = adapter()
    for seed in (0, 1):
        _, tokens, images = pipeline_run(ad, guidance, seed=seed)
        ours = pipeline_tokens(ad, PROMPTS, STEPS, guidance, torch.Generator().manual_seed(seed))
        assert torch.equal(ours, tokens.flatten(1))
        assert bool((ours < CODES).all())
        decoded = ad.decode(ours)
        assert decoded.shape == (len(PROMPTS), 3, 16, 16)
        torch.testing.assert_close(decoded.permute(0, 2, 3, 1).numpy(), images, rtol=0,
                                   atol=1e-6)


@pytest.mark.parametrize("masking_schedule", ["cosine", "linear"])
def test_schedule_is_the_fraction_the_pipeline_leaves_masked(masking_schedule):
    ad = adapter(masking_schedule)
    sigmas = ad.schedule(STEPS)
    assert sigmas[0] == 1.0 and sigmas[-1] == 0.0 and bool((sigmas[1:] < sigmas[:-1]).all())
    scheduler = ad.pipeline.scheduler
    scheduler.set_timesteps(STEPS)
    x1 = torch.randint(0, CODES, (64, SIDE, SIDE), generator=torch.Generator().manual_seed(0))
    for i, timestep in enumerate(scheduler.timesteps[:-1]):
        ratio = (i + 1) / STEPS
        expected = math.cos(ratio * math.pi / 2) if masking_schedule == "cosine" else 1 - ratio
        assert float(sigmas[i + 1]) == pytest.approx(expected, abs=1e-7)
        # the forward masking at that level is the scheduler's add_noise, draw for draw
        theirs = scheduler.add_noise(x1, timestep, torch.Generator().manual_seed(i))
        ours = ad.corrupt(x1.flatten(1), sigmas[i + 1], torch.Generator().manual_seed(i))
        assert torch.equal(ours, theirs.flatten(1))
    assert torch.equal(ad.noise(2), torch.full((2, SIDE * SIDE), VOCAB - 1))


def test_the_rollout_step_unmasks_to_the_posterior_of_the_codes():
    """The ``ctmc`` step on the adapter's logits: a masked token stays masked with probability
    ``sigma' / sigma`` and otherwise takes a code with the pipeline's softmax over the codes;
    unmasked tokens stay; no step reaches an unused id."""
    ad = adapter()
    seen, _, _ = pipeline_run(ad, 4.0)
    sampler = samplers.build("ctmc").bind(ad)
    cond, sigmas = ad.encode(PROMPTS), ad.schedule(STEPS)
    mask = ad.path.mask_id
    for k, (theirs, _, x) in enumerate(seen):
        x = x.flatten(1)
        with torch.no_grad():
            logits = ad.logits(x, sigmas[k].expand(2), cond, 4.0)
        s, s_next = float(sigmas[k]), float(sigmas[k + 1])
        tr = sampler.transition(logits, x, s, s_next)
        codes = torch.softmax(theirs.flatten(2).transpose(1, 2).float(), -1)
        masked = x == mask
        stay = s_next / s
        expected = (1 - stay) * codes[masked]
        torch.testing.assert_close(tr.probs[masked][:, :CODES], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(tr.probs[masked][:, mask], torch.full((int(masked.sum()),),
                                   stay), rtol=0, atol=1e-6)
        known = torch.nn.functional.one_hot(x[~masked], VOCAB).float()
        torch.testing.assert_close(tr.probs[~masked], known, rtol=0, atol=0)
        assert bool((tr.probs[..., CODES:mask] == 0).all())
        drawn = tr.sample(torch.Generator().manual_seed(k))
        assert bool(torch.isfinite(tr.log_prob(drawn)).all())


def test_bad_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match="multiples of 4"):
        adapter(height=18)
    with pytest.raises(ValueError, match="crop_coord"):
        adapter(crop_coord=(1, 2, 3))
    with pytest.raises(ValueError, match="at least 1 step"):
        adapter().schedule(0)


def test_a_larger_image_is_a_larger_token_grid():
    ad = adapter(height=32, width=24)
    assert ad.token_shape == (8, 6) and ad.seq_len == 48
    cond = ad.encode(PROMPTS)
    x = ad.noise(2)
    with torch.no_grad():
        assert ad.logits(x, torch.ones(2), cond, 3.0).shape == (2, 48, VOCAB)
    assert ad.decode(torch.zeros(2, 48, dtype=torch.long)).shape == (2, 3, 32, 24)


def test_loads_from_a_folder_and_round_trips_a_lora(tmp_path):
    ad = adapter()
    x = ad.corrupt(torch.zeros(2, ad.seq_len, dtype=torch.long), 0.5,
                   torch.Generator().manual_seed(0))
    sigma = torch.full((2,), 0.5)

    def outputs(a):
        return a.logits(x, sigma, a.encode(PROMPTS), 4.0)

    state = assert_folder_and_lora_round_trip(ad, AmusedAdapter, tmp_path, outputs)
    # every attention of the model: the transformer layers' self and cross attention and the
    # conv blocks' attention
    assert any("transformer_layers" in k and "attn1" in k for k in state)
    assert any("transformer_layers" in k and "attn2" in k for k in state)
    assert any("down_block" in k for k in state) and any("up_block" in k for k in state)
