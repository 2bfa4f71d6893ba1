"""``vq_diffusion`` against diffusers' ``VQDiffusionPipeline`` on a tiny pipeline built in code:
the logits the pipeline's scheduler receives at every step, the tokens and images of its own
sampling, the sampler's step and the family's loading and LoRA round trip."""

from __future__ import annotations

import pytest
import torch

import samplers
from helpers.lora import assert_folder_and_lora_round_trip
from helpers.tiny_vq_diffusion import TRAIN_STEPS, tiny_vq_diffusion_pipeline
from pipelines.vq_diffusion import LOG_ZERO, VQDiffusionAdapter, pipeline_tokens

pytest.importorskip("diffusers")

PROMPTS = ["a red cube", "two dogs"]  # within the tiny tokenizer's 16 ids
STEPS = 6


def adapter(learnable: bool = True, **options) -> VQDiffusionAdapter:
    pipe = tiny_vq_diffusion_pipeline(seed=0, learnable=learnable)
    pipe.set_progress_bar_config(disable=True)
    return VQDiffusionAdapter(pipeline=pipe, **options)


def pipeline_run(ad: VQDiffusionAdapter, guidance: float, truncation_rate: float = 1.0,
                 seed: int = 0) -> tuple[list[tuple], torch.Tensor, object]:
    """The pipeline's own sampling, recording what its scheduler receives at every step
    (``log p(x0)`` after guidance and truncation, the timestep, the tokens) and the final
    tokens."""
    pipe, seen, last = ad.pipeline, [], {}
    step = pipe.scheduler.step

    def recording(model_output, timestep, sample, generator=None, return_dict=True):
        seen.append((model_output.clone(), int(timestep), sample.clone()))
        return step(model_output, timestep, sample, generator=generator, return_dict=return_dict)

    pipe.scheduler.step = recording
    try:
        out = pipe(list(PROMPTS), num_inference_steps=STEPS, guidance_scale=guidance,
                   truncation_rate=truncation_rate, output_type="np",
                   generator=torch.Generator().manual_seed(seed),
                   callback=lambda i, t, s: last.__setitem__("x", s.clone()))
    finally:
        del pipe.scheduler.step
    return seen, last["x"], out.images


@pytest.mark.parametrize("guidance,truncation,learnable", [
    (1.0, 1.0, True), (4.0, 1.0, True), (4.0, 0.7, True), (3.0, 1.0, False)])
def test_logits_are_what_the_pipeline_steps_with(guidance, truncation, learnable):
    ad = adapter(learnable, truncation_rate=truncation)
    seen, _, _ = pipeline_run(ad, guidance, truncation)
    cond = ad.encode(PROMPTS)
    assert [t for _, t, _ in seen] == list(range(STEPS - 1, -1, -1))
    sigmas = ad.schedule(STEPS)
    for k, (theirs, t, x) in enumerate(seen):
        sigma = sigmas[k].expand(len(PROMPTS))
        assert int(ad.timesteps(sigma)[0]) == t
        with torch.no_grad():
            ours = ad.logits(x, sigma, cond, guidance)
        assert ours.shape == (len(PROMPTS), ad.seq_len, ad.path.num_states)
        assert bool((ours[..., -1] == LOG_ZERO).all())  # the mask is never a clean code
        torch.testing.assert_close(ours[..., :-1].transpose(1, 2), theirs, rtol=0, atol=0)


@pytest.mark.parametrize("guidance", [1.0, 4.0])
def test_the_pipelines_sampling_gives_the_same_tokens_and_images(guidance):
    ad = adapter()
    for seed in (0, 1):
        _, tokens, images = pipeline_run(ad, guidance, seed=seed)
        ours = pipeline_tokens(ad, PROMPTS, STEPS, guidance, torch.Generator().manual_seed(seed))
        assert torch.equal(ours, tokens)
        decoded = ad.decode(ours)
        assert decoded.shape == (len(PROMPTS), 3, 16, 16)
        torch.testing.assert_close(decoded.permute(0, 2, 3, 1).numpy(), images, rtol=0,
                                   atol=1e-6)


def test_the_rollout_sampler_draws_the_pipelines_step():
    """At every step of the pipeline's sampling, the ``vq_diffusion`` sampler's distribution on
    the adapter's logits is the scheduler's posterior normalised (the rollout draws it by the
    inverse CDF, the scheduler by Gumbel-argmax)."""
    ad = adapter()
    seen, _, _ = pipeline_run(ad, 4.0)
    sampler = samplers.build("vq_diffusion").bind(ad)
    cond, sigmas = ad.encode(PROMPTS), ad.schedule(STEPS)
    scheduler = ad.pipeline.scheduler
    for k, (theirs, t, x) in enumerate(seen):
        with torch.no_grad():
            logits = ad.logits(x, sigmas[k].expand(2), cond, 4.0)
        tr = sampler.transition(logits, x, float(sigmas[k]), float(sigmas[k + 1]))
        log_step = theirs if t == 0 else scheduler.q_posterior(theirs, x, t)
        expected = torch.softmax(log_step, 1).transpose(1, 2)
        torch.testing.assert_close(tr.probs[..., :expected.shape[-1]], expected, rtol=0,
                                   atol=1e-5)
        torch.testing.assert_close(tr.probs.sum(-1), torch.ones(x.shape), rtol=0, atol=1e-5)
        drawn = tr.sample(torch.Generator().manual_seed(k))
        assert bool(torch.isfinite(tr.log_prob(drawn)).all())


def test_schedule_steps_the_chains_first_timesteps():
    ad = adapter()
    sigmas = ad.schedule(STEPS)
    torch.testing.assert_close(sigmas, torch.arange(STEPS, -1, -1).float() / TRAIN_STEPS)
    assert ad.schedule(TRAIN_STEPS)[0] == 1.0
    with pytest.raises(ValueError, match="steps"):
        ad.schedule(TRAIN_STEPS + 1)
    assert torch.equal(ad.noise(2), torch.full((2, 16), ad.path.mask_id))


def test_a_batch_at_several_noise_levels_is_each_rows_own_call():
    ad = adapter()
    cond = ad.encode(PROMPTS)
    x = torch.randint(0, ad.path.num_states, (2, ad.seq_len), generator=torch.Generator()
                      .manual_seed(0))
    sigma = torch.tensor([0.9, 0.3])
    with torch.no_grad():
        both = ad.logits(x, sigma, cond, 4.0)
        for i in range(2):
            alone = ad.logits(x[i:i + 1], sigma[i:i + 1], cond.index([i]), 4.0)
            torch.testing.assert_close(both[i:i + 1], alone, rtol=0, atol=1e-6)


def test_loads_from_a_folder_and_round_trips_a_lora(tmp_path):
    ad = adapter()
    x = torch.full((2, ad.seq_len), ad.path.mask_id)
    sigma = torch.full((2,), 0.5)

    def outputs(a):
        return a.logits(x, sigma, a.encode(PROMPTS), 4.0)

    state = assert_folder_and_lora_round_trip(ad, VQDiffusionAdapter, tmp_path, outputs)
    assert any("attn1" in k for k in state) and any("attn2" in k for k in state)
