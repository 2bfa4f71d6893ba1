"""The ``longcat_tts`` family beyond the shared family tests: parity within 1e-5, voice prompts
(the reference implementation's conditioning, which the diffusers pipeline lacks) and
per-prompt durations (a batch mixing lengths)."""

from __future__ import annotations

import pytest
import torch

import samplers
from flowgrpo.rl.kl import exact_kl
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.rollout import RolloutSpec, rollout
from flowgrpo.testing import check_family_contract
from helpers.family_cases import CASES, PROMPTS, euler_rollout, pipeline_latents
from helpers.padding import assert_padding_moves_no_loss
from helpers.tiny_families import tiny_longcat_tts_pipeline
from pipelines import LongCatTTSAdapter
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT
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


# ------------------------------------------------------------------ per-prompt durations
# (docs/adapters.md, "Speech families: per-prompt durations")

def per_prompt(**options) -> LongCatTTSAdapter:
    return CASE.make(audio_duration="per_prompt", **options)


def lengths_of(cond) -> list[int]:
    return cond.tensors[LATENT_LENGTH].tolist()


def seeded(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_each_prompt_takes_the_pipelines_own_length_and_output(guidance):
    """Without a duration the pipeline estimates one from the text; per prompt, each sample has
    that length and its Euler rollout equals the pipeline's output for that prompt (the same
    seed, the pipeline choosing the length itself)."""
    adapter = per_prompt()
    seen = []
    for i, prompt in enumerate(PROMPTS):
        cond = adapter.encode([prompt])
        x = adapter.initial_noise(seeded(10 + i), cond)
        ours = euler_rollout(adapter, x, guidance, prompts=[prompt])
        ref = adapter.pipeline(prompt=[prompt], num_inference_steps=5, guidance_scale=guidance,
                               generator=seeded(10 + i)[0], output_type="latent").audios
        assert ref.shape == ours.shape == (1, lengths_of(cond)[0], 8)
        diff = (ours - ref.float()).abs().max().item()
        print(f"parity longcat_tts per prompt, {ref.shape[1]} frames, guidance {guidance}: "
              f"max abs diff {diff:.3g}")
        assert diff <= 1e-5
        seen.append(ref.shape[1])
    # 0.082 s per character at 125 frames per second: 16 and 7 characters
    assert seen == [int(16 * 0.082 * 1000 // 8), int(7 * 0.082 * 1000 // 8)] == [164, 71]


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_a_mixed_batch_matches_the_pipeline_at_each_length(guidance):
    """One Euler rollout of both prompts at their own lengths; the pipeline, given the same two
    prompts (so the text is padded alike) and latents of one length, gives each sample of that
    length within 1e-5."""
    adapter = per_prompt()
    cond = adapter.encode(PROMPTS)
    n = lengths_of(cond)
    x = adapter.initial_noise(seeded(1, 2), cond)
    ours = euler_rollout(adapter, x, guidance)
    for i in range(2):
        start = torch.cat([adapter.noise(1, g, n[i]) for g in seeded(1, 2)])
        ref = pipeline_latents(CASE, adapter, start, guidance).float()
        assert ref.shape[1] == n[i]
        diff = (ours[i, :n[i]] - ref[i]).abs().max().item()
        print(f"parity longcat_tts mixed batch, {n[i]} frames, guidance {guidance}: max abs "
              f"diff {diff:.3g}")
        assert diff <= 1e-5
        assert ours[i, n[i]:].eq(0).all()


def rolled(adapter, durations: list[float], sampler: str, guidance: float = 3.0):
    """An ``sampler`` rollout of :data:`PROMPTS` with these metadata durations, sample ``i``
    from seed ``i``, trained at steps 0 and 1 of 3."""
    cond = adapter.encode_inputs(PROMPTS, [{"duration": d} for d in durations])
    spec = RolloutSpec(samplers.get(sampler, noise_level=0.7), guidance=guidance)
    trained = torch.tensor([[0, 1], [0, 1]])
    return rollout(adapter, spec, cond, adapter.initial_noise(seeded(0, 1), cond),
                   adapter.schedule(3), trained, seeded(0, 1))


@pytest.mark.parametrize("sampler", ["sde", "cps"])
@pytest.mark.parametrize("voice", [False, True])
def test_a_batch_of_two_lengths_equals_each_length_alone(sampler, voice):
    """Sample 0 of a batch of 6 and 12 generated frames has the latents and log-probs it has in
    a batch where every sample has 6 frames, sample 1 those of a batch of 12 (the same prompts,
    so the text is padded alike); its padding stays exactly 0 and decodes to silence."""
    adapter = voiced(audio_duration="per_prompt") if voice else per_prompt()
    p = adapter.prompt_frames
    mixed = rolled(adapter, [0.05, 0.1], sampler)
    assert lengths_of(mixed.cond) == [p + 6, p + 12]
    weight = mixed.cond.tensors[LOGPROB_WEIGHT][0, :, 0]
    assert weight[:p].eq(0).all() and weight[p + 6:].eq(0).all()
    torch.testing.assert_close(weight[p:p + 6], torch.full((6,), (p + 12) / (p + 6)))
    audio = adapter.decode(mixed.final)
    for i, alone in enumerate([rolled(adapter, [0.05] * 2, sampler),
                               rolled(adapter, [0.1] * 2, sampler)]):
        n = lengths_of(alone.cond)[i]
        assert alone.latents.shape[2] == n
        assert (mixed.latents[i, :, :n] - alone.latents[i]).abs().max() <= 1e-5
        assert mixed.latents[i, :, n:].eq(0).all()
        assert (mixed.log_probs[i] - alone.log_probs[i]).abs().max() <= 1e-5
        own = adapter.decode(alone.final)[i]
        assert (audio[i, :, :own.shape[-1]] - own).abs().max() <= 1e-5
        assert audio[i, :, own.shape[-1]:].eq(0).all()
    assert audio.shape == (2, 1, 12 * 8)
    assert (mixed.log_probs[0] - mixed.log_probs[1]).abs().min() > 1e-4  # both are real


def test_padded_frames_move_no_log_prob_or_kl():
    """Replayed log-probs and KLs of a mixed batch do not change when its padding is moved (in
    the state and in the stored next state); the ratio is 1 before any update."""
    from peft import LoraConfig

    adapter = per_prompt()
    adapter.add_lora(LoraConfig(r=2, lora_alpha=2, target_modules=list(
        adapter.default_lora_targets)))
    with torch.no_grad():  # a policy away from the reference: the KL is not 0
        for name, param in adapter.transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    traj = rolled(adapter, [0.05, 0.1], "sde")
    sampler = samplers.get("sde", noise_level=0.7)
    idx = torch.arange(2)

    def replayed():
        out = [replay_step(adapter, sampler, traj, idx, j, 3.0, kl=exact_kl) for j in range(2)]
        return [r.log_prob for r in out], [r.kl for r in out]

    logp, kl = replayed()
    for j in range(2):
        torch.testing.assert_close(logp[j], traj.log_probs[:, j], rtol=0, atol=1e-6)
        assert (kl[j] > 1e-4).all()
    traj.latents[0, :, 6:] = torch.randn(traj.latents[0, :, 6:].shape) * 5
    moved_logp, moved_kl = replayed()
    for j in range(2):
        torch.testing.assert_close(moved_logp[j], logp[j], rtol=0, atol=1e-6)
        torch.testing.assert_close(moved_kl[j], kl[j], rtol=0, atol=1e-6)
    traj.latents[0, 2, 5] += 0.1  # its last own frame does count
    assert (replay_step(adapter, sampler, traj, idx, 1, 3.0).log_prob[0]
            - logp[1][0]).abs() > 1e-4


def test_per_prompt_lengths_follow_metadata_and_text():
    adapter = per_prompt()
    cond = adapter.encode_inputs(PROMPTS, [{"duration": 0.2}, {}])
    assert lengths_of(cond) == [25, 71]  # 0.2 s -> 25 frames; "two dogs" from its text
    assert cond.tensors[LOGPROB_WEIGHT].shape == (2, 71, 1)
    assert adapter.condition_keys == ("duration",) and not CASE.make().condition_keys
    capped = adapter.encode_inputs(["x"], [{"duration": 99.0}])
    assert lengths_of(capped) == [int(30 * 1000 // 8)]  # the model's 30 s
    with pytest.raises(ValueError, match="initial_noise"):
        adapter.noise(1)
    for bad in (0.0, -1.0, "long", True):
        with pytest.raises(ValueError, match="duration") as err:
            adapter.encode_inputs(["x"], [{"duration": bad}])
        assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="per_prompt"):
        CASE.make(audio_duration="auto")


@pytest.mark.slow
def test_family_contract_with_per_prompt_durations(tmp_path):
    """tests/families/test_family_contract.py with prompts of two durations in every batch."""
    folder = tmp_path / "model"
    CASE.make().pipeline.save_pretrained(str(folder))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "two dogs", "duration": 0.05}\n'
                       '{"prompt": "a red cube", "duration": 0.1}\n')
    check_family_contract("longcat_tts", folder, {"audio_duration": "per_prompt"}, tmp_path,
                          prompts=str(prompts), guidance=3.0)


def energy():
    """Mean audio value: a reward for any clip length."""
    from reward_models import RewardOutput

    return lambda media, prompts, metadata: RewardOutput(media.data.float().flatten(1).mean(1))


@pytest.mark.parametrize(("objective", "kl"), [("ratio", "exact"), ("elbo", "velocity_mse")])
def test_padded_frames_move_no_loss(objective, kl, tmp_path):
    """Through the trainer, a batch of two durations: moving the padding of every stored latent
    leaves the objective's loss and metrics (ratios, KL) unchanged, with the policy moved away
    from the sampling one and the reference."""
    from flowgrpo.config.io import from_dict
    from flowgrpo.training.trainer import Trainer
    from reward_models import REWARDS

    folder = tmp_path / "model"
    CASE.make().pipeline.save_pretrained(str(folder))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "two dogs", "duration": 0.05}\n'
                       '{"prompt": "a red cube", "duration": 0.1}\n')
    config = {
        "model": {"family": "longcat_tts", "path": str(folder), "guidance": 3.0,
                  "options": {"audio_duration": "per_prompt"}, "lora_rank": 2, "lora_alpha": 2},
        "reward": {"name": "energy"},
        "data": {"prompts": str(prompts), "eval_images_per_prompt": 1},
        "sampler": {"num_steps": 3},
        "train": {"group_size": 2, "batch_size": 4, "beta": 0.1, "objective": objective,
                  "kl": kl},
        "run": {"epochs": 1, "output_dir": str(tmp_path / "run"), "progress": False,
                "tensorboard": False},
    }
    with REWARDS.registered("energy", energy):
        t = Trainer.from_config(from_dict(config))
        batch = t.sample(0)
        adv, _ = t.advantages(batch)
    lengths = batch.traj.cond.tensors[LATENT_LENGTH]
    assert sorted(set(lengths.tolist())) == [6, 12]
    assert_padding_moves_no_loss(t, batch, adv, lengths)


def test_views_keep_each_samples_length_or_refuse_in_one_line():
    """MV-GRPO's views re-encode other captions of the same samples: with metadata durations a
    view keeps every sample's length; with lengths from the text it would change them, which
    is refused."""
    from types import SimpleNamespace

    from flowgrpo.rl.session import ModelSession
    from flowgrpo.rl.views import Views
    from reward_models import RewardOutput

    adapter = per_prompt()
    session = ModelSession(adapter, "cpu")
    views = Views(1, "template", {"templates": ["{prompt}, said slowly and very clearly"]}, 0)

    def batch(metadata):
        cond = adapter.encode_inputs(PROMPTS, metadata)
        final = adapter.initial_noise(seeded(0, 1), cond)
        return SimpleNamespace(prompts=list(PROMPTS), metadata=metadata, views=[cond],
                               traj=SimpleNamespace(cond=cond, final=final), info={},
                               view_rewards=[RewardOutput(torch.zeros(2))],
                               reward=RewardOutput(torch.zeros(2)))

    def score(media, prompts, metadata):
        return RewardOutput(torch.ones(len(prompts)))

    timed = batch([{"duration": 0.05}, {"duration": 0.1}])
    views.extend(session, score, timed, 0)
    assert torch.equal(timed.views[1].tensors[LATENT_LENGTH], timed.traj.cond.tensors[
        LATENT_LENGTH])
    with pytest.raises(ValueError, match="duration") as err:
        views.extend(session, score, batch([{}, {}]), 0)
    assert "\n" not in str(err.value)


def test_the_recipe_gives_each_prompt_its_length(tmp_path):
    """configs/tts_longcat.yaml uses per-prompt durations: on a tiny model, prompts of the
    recipe's prompt set get the pipeline's estimate from their text, each its own length."""
    from flowgrpo.config.io import load_config
    from flowgrpo.data.prompts import load_prompts
    from flowgrpo.training.model_setup import load_adapter

    folder = tmp_path / "model"
    CASE.make().pipeline.save_pretrained(str(folder))
    cfg = load_config("tts_longcat", [f"model.path={folder}", "model.dtype=float32",
                                      "model.mixed_precision=fp32"])
    assert cfg.model.options["audio_duration"] == "per_prompt"
    adapter = load_adapter(cfg.model)
    texts = sorted((p for p, _ in load_prompts(cfg.data.prompts)), key=len)[:2]
    cond = adapter.encode(texts)
    lengths = cond.tensors[LATENT_LENGTH].tolist()
    assert lengths == [adapter.num_frames(t) for t in texts] and lengths[0] != lengths[1]
    x = adapter.initial_noise(seeded(0, 1), cond)
    with torch.no_grad():
        v = adapter.velocity(x, torch.full((2,), 0.5), cond, cfg.model.guidance)
    assert v.shape == x.shape and torch.isfinite(v).all()
