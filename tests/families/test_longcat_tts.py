"""The ``longcat_tts`` family beyond the shared family tests: parity within 1e-5, and voice
prompts (the reference implementation's conditioning, which the diffusers pipeline lacks)."""

from __future__ import annotations

import pytest
import torch

import samplers
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.rollout import RolloutSpec, rollout
from helpers.family_cases import CASES, PROMPTS, euler_rollout, pipeline_latents
from helpers.tiny_families import tiny_longcat_tts_pipeline
from pipelines import LongCatTTSAdapter
from pipelines.base import LOGPROB_WEIGHT
from pipelines.media_io import save_wav

CASE = CASES["longcat_tts"]
VOICE = torch.sin(torch.linspace(0, 60, 40)) * 0.3  # 40 samples at 1 kHz -> 5 frames


def voiced(**options) -> LongCatTTSAdapter:
    return CASE.make(voice_prompt=VOICE, voice_prompt_text="Hello there", **options)


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_euler_matches_the_pipeline_within_1e_5(guidance):
    adapter = CASE.make()
    x = adapter.noise(len(PROMPTS), torch.Generator().manual_seed(4))
    ref = pipeline_latents(CASE, adapter, x, guidance).float()
    ours = euler_rollout(adapter, x, guidance)
    assert (ours - ref).abs().max() <= 1e-5
    assert (ours - x).abs().max() > 1e-2


def test_schedule_is_the_pipelines_unshifted_grid():
    adapter = CASE.make()
    torch.testing.assert_close(adapter.schedule(4), torch.tensor([1.0, 0.75, 0.5, 0.25, 0.0]))


def reference_voice_rollout(adapter: LongCatTTSAdapter, x: torch.Tensor, guidance: float,
                            steps: int) -> torch.Tensor:
    """The reference implementation's voice cloning, written from its description in model
    time ``t = 1 - sigma``: before every call the prompt frames are overwritten with
    ``(1 - t) * noise + t * z``; the conditional call sees ``latent_cond = [z, 0...]``, the null
    call those frames zeroed, zero text and an empty ``latent_cond``; guidance is
    ``cond + (g - 1) (cond - null)``; Euler on our grid."""
    pipe, p = adapter.pipeline, adapter.prompt_frames
    z = adapter.prompt_latent
    cond = adapter.encode(PROMPTS).tensors
    states, text_mask = cond["encoder_hidden_states"], cond["encoder_attention_mask"]
    b, frames = x.shape[:2]
    latent_cond = torch.zeros(b, frames, adapter.latent_dim)
    latent_cond[:, :p] = z
    mask = torch.ones(b, frames, dtype=torch.bool)
    sigmas = adapter.schedule(steps)
    noise_p, y = x[:, :p].clone(), x.clone()
    with torch.no_grad():
        for k in range(steps):
            t = 1 - sigmas[k]
            y[:, :p] = noise_p * (1 - t) + z * t
            pred = pipe.transformer(hidden_states=y, encoder_hidden_states=states,
                                    encoder_attention_mask=text_mask, timestep=t.expand(b),
                                    attention_mask=mask, latent_cond=latent_cond).sample
            if guidance > 1:
                blank = y.clone()
                blank[:, :p] = 0
                null = pipe.transformer(hidden_states=blank,
                                        encoder_hidden_states=torch.zeros_like(states),
                                        encoder_attention_mask=text_mask, timestep=t.expand(b),
                                        attention_mask=mask,
                                        latent_cond=torch.zeros_like(latent_cond)).sample
                pred = pred + (guidance - 1) * (pred - null)
            y = y + (sigmas[k] - sigmas[k + 1]) * pred
    return y


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_voice_prompt_follows_the_reference_conditioning(guidance):
    adapter = voiced()
    assert adapter.prompt_frames == 5 and adapter.num_frames() == 5 + 12
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    ref = reference_voice_rollout(adapter, x, guidance, steps=4)
    ours = euler_rollout(adapter, x, guidance, steps=4)
    p = adapter.prompt_frames
    assert (ours[:, p:] - ref[:, p:]).abs().max() <= 1e-5  # the generated frames
    # our prompt frames end exactly at the prompt's latents (the reference overwrites them)
    assert (ours[:, :p] - adapter.prompt_latent).abs().max() <= 1e-5
    plain = CASE.make()  # the prompt changes the speech
    base = euler_rollout(plain, x[:, p:], guidance, steps=4)
    assert (base - ours[:, p:]).abs().max() > 1e-2


def test_voice_prompt_text_comes_first_and_decode_drops_the_prompt():
    adapter = voiced()
    seen = []
    encode_prompt = adapter.pipeline.encode_prompt
    adapter.pipeline.encode_prompt = lambda texts, device: seen.append(texts) or encode_prompt(
        texts, device)
    cond = adapter.encode(["Two DOGS"])
    assert seen == [["hello there two dogs"]]
    weight = cond.tensors[LOGPROB_WEIGHT]
    assert weight.shape == (1, 17, 1)
    assert weight[0, :5].eq(0).all() and weight[0, 5:].eq(1).all()
    audio = adapter.decode(adapter.noise(1))
    assert audio.shape == (1, 1, 12 * 8)  # only the generated frames


def test_prompt_frames_add_nothing_to_log_probs():
    """With the sde sampler the prompt frames are noisy too, but their log-prob weight is 0: a
    step's log-prob does not change when the prompt frames of its stored next latent move, and
    the ratio is 1 before any update."""
    adapter = voiced()
    cond = adapter.encode(PROMPTS)
    sampler = samplers.get("sde", noise_level=0.7)
    sigmas = adapter.schedule(3)
    trained = torch.tensor([[0, 1], [0, 1]])
    traj = rollout(adapter, RolloutSpec(sampler), cond, adapter.noise(2), sigmas, trained,
                   torch.Generator().manual_seed(0))
    idx = torch.arange(2)
    for j in range(2):
        logp = replay_step(adapter, sampler, traj, idx, j, 1.0).log_prob
        torch.testing.assert_close(logp, traj.log_probs[:, j], rtol=0, atol=1e-6)
    stored = traj.latents.clone()
    for j in range(2):  # move the prompt frames of step j's next latent only
        traj.latents = stored.clone()
        traj.latents[:, j + 1, :5] += 3.0
        logp = replay_step(adapter, sampler, traj, idx, j, 1.0).log_prob
        torch.testing.assert_close(logp, traj.log_probs[:, j], rtol=0, atol=1e-6)
    traj.latents = stored.clone()
    traj.latents[:, 2, 5:] += 0.1  # a generated frame does count
    assert not torch.allclose(replay_step(adapter, sampler, traj, idx, 1, 1.0).log_prob,
                              traj.log_probs[:, 1], rtol=0, atol=1e-3)


def test_voice_prompt_from_a_wav_file_equals_the_waveform(tmp_path):
    path = save_wav(VOICE[None], 1000, tmp_path / "voice.wav")
    from_file = CASE.make(voice_prompt=str(path), voice_prompt_text="hello there")
    # 16-bit storage rounds the waveform by at most 1/32767
    torch.testing.assert_close(from_file.prompt_latent, voiced().prompt_latent,
                               rtol=0, atol=1e-3)


def test_position_weights_cover_generated_frames_only():
    adapter = voiced()
    x = adapter.noise(2)  # [2, 17, 8]: 5 prompt + 12 generated frames
    w = adapter.position_weights(torch.arange(4.0).repeat(2, 1), x)  # 4 cells -> 12 frames
    assert w.shape == (2, 17, 1)
    assert w[:, :5].eq(0).all() and torch.equal(w[0, 5::3, 0], torch.arange(4.0))
    plain = CASE.make()
    assert torch.equal(plain.position_weights(torch.arange(4.0).repeat(2, 1), plain.noise(2)),
                       w[:, 5:])


@pytest.mark.parametrize(("options", "message"), [
    (dict(voice_prompt=VOICE), "voice_prompt_text"),
    (dict(negative_prompt="noise"), "negative_prompt"),
    (dict(audio_duration=0.0), "audio_duration"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as err:
        LongCatTTSAdapter(pipeline=tiny_longcat_tts_pipeline(), **{"audio_duration": 0.1,
                                                                    **options})
    assert "\n" not in str(err.value)
