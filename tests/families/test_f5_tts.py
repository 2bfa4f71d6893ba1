"""The ``f5_tts`` family on a tiny F5 model built in code (random weights, 16 mel channels).

Parity: with the Euler ODE, the same initial noise and F5's own time grid, the adapter's rollout
equals ``CFM.sample`` within 1e-5 (with and without CFG, with a reference voice). Then what the
framework relies on: reference frames add nothing to log-probs, LoRA round trip, loading from a
saved folder, and the family contract through the unchanged trainer.

f5-tts is an optional extra (``scripts/install_f5_tts.sh``); without it this file is skipped.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

pytest.importorskip("f5_tts", reason="f5-tts is optional: install it with "
                                     "scripts/install_f5_tts.sh")
pytest.importorskip("vocos", reason="vocos (F5-TTS's vocoder) is not installed")

import samplers  # noqa: E402
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.rollout import RolloutSpec, rollout
from flowgrpo.testing import check_family_contract
from helpers.family_cases import euler_rollout as shared_euler_rollout
from helpers.padding import assert_padding_moves_no_loss
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT  # noqa: E402
from pipelines.f5_tts import (  # noqa: E402
    F5TTSAdapter,
    F5TTSPipeline,
    f5_text,
    import_f5,
    vocos_from_config,
)
from pipelines.media_io import load_wav, save_wav  # noqa: E402

pytestmark = pytest.mark.filterwarnings(  # x-transformers' import-time torch.jit.script
    "ignore:`torch.jit.script` is deprecated:FutureWarning")

VOCAB = [" ", *"abcdefghijklmnopqrstuvwxyz", ".", ",", "'"]
MEL = dict(target_sample_rate=24000, n_mel_channels=16, hop_length=256, win_length=1024,
           n_fft=1024, mel_spec_type="vocos")
CONFIG = {"backbone": "DiT", "mel_spec": MEL,
          "arch": dict(dim=32, depth=2, heads=2, dim_head=16, ff_mult=2, text_dim=16,
                       conv_layers=1)}  # F5's default dropout (0.1): the adapter turns it off
VOCOS = {
    "feature_extractor": {"class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
                          "init_args": {"sample_rate": 24000, "n_fft": 1024, "hop_length": 256,
                                        "n_mels": 16, "padding": "center"}},
    "backbone": {"class_path": "vocos.models.VocosBackbone",
                 "init_args": {"input_channels": 16, "dim": 16, "intermediate_dim": 32,
                               "num_layers": 1}},
    "head": {"class_path": "vocos.heads.ISTFTHead",
             "init_args": {"dim": 16, "n_fft": 512, "hop_length": 256, "padding": "same"}},
}
REF_TEXT = "a short voice prompt"
REF_FRAMES = 6
PROMPTS = ["hello there", "two dogs"]
STEPS = 6
TOL = 1e-5


def tiny_pipeline(seed: int = 0) -> F5TTSPipeline:
    """Same weights for the same seed; F5 zero-initialises its output and modulation layers, so
    those are drawn at random too (a zero model would make every test pass trivially)."""
    torch.manual_seed(seed)
    pipe = F5TTSPipeline.from_config(CONFIG, {c: i for i, c in enumerate(VOCAB)},
                                     vocoder=vocos_from_config(VOCOS), vocoder_config=VOCOS)
    with torch.no_grad():
        for p in pipe.model.parameters():
            if not p.any():
                p.normal_(0.0, 0.2)
    return pipe


def ref_mel() -> torch.Tensor:
    return torch.randn(REF_FRAMES, 16, generator=torch.Generator().manual_seed(9)) - 4.0


def make(**options) -> F5TTSAdapter:
    options = {"ref_mel": ref_mel(), "ref_text": REF_TEXT, "audio_duration": 0.4, **options}
    return F5TTSAdapter(model=tiny_pipeline(), **options)


def euler_rollout(adapter: F5TTSAdapter, x: torch.Tensor, guidance: float,
                  prompts: list[str] = PROMPTS, steps: int = STEPS) -> torch.Tensor:
    return shared_euler_rollout(adapter, x, guidance, steps=steps, prompts=prompts)


PARITY = [  # (guidance, steps, sway, use_epss)
    (1.0, 16, -1.0, True),  # F5's pruned 16-step grid with sway
    (3.0, 12, -1.0, True),  # cfg_strength 2, F5 default
    (3.0, 5, 0.5, False),
    (2.0, 7, None, True),
]


@pytest.mark.parametrize(("guidance", "steps", "sway", "epss"), PARITY)
def test_euler_rollout_matches_cfm_sample(guidance, steps, sway, epss):
    adapter = make(sway_coef=sway, use_epss=epss)
    f5 = import_f5()
    x = adapter.noise(1, torch.Generator().manual_seed(7))
    ours = euler_rollout(adapter, x, guidance, PROMPTS[:1], steps)
    text = f5.utils.convert_char_to_pinyin([f5_text(REF_TEXT, PROMPTS[0])])
    out, trajectory = adapter.pipeline.model.sample(
        cond=ref_mel()[None], text=text, duration=adapter.num_frames(), steps=steps,
        cfg_strength=guidance - 1.0, sway_sampling_coef=sway, use_epss=epss, seed=7)
    assert torch.equal(trajectory[0], x)  # same initial noise (sample seeds torch with 7)
    diff = (ours - trajectory[-1]).abs().max().item()
    print(f"parity f5_tts guidance={guidance} steps={steps} sway={sway}: max abs diff {diff:.3g}")
    assert diff <= TOL
    # sample() overwrites the reference frames with the reference; decode drops them
    assert torch.equal(out[:, :REF_FRAMES], ref_mel()[None])
    assert (ours - x).abs().max() > 1e-1


# each prompt's metadata for per-prompt durations: F5's rule from the text (here its floor, the
# text plus one frame, as CFM.sample makes it), or seconds after the reference
PER_PROMPT = {"rule": [{}, {}], "metadata": [{"duration": 0.4}, {"duration": 0.6}]}


def seeded(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def euler_from(adapter: F5TTSAdapter, x: torch.Tensor, cond, guidance: float,
               steps: int = STEPS) -> torch.Tensor:
    """The Euler ODE from ``x`` under the encoding ``cond`` (with its lengths)."""
    sigmas = adapter.schedule(steps)
    with torch.no_grad():
        for k in range(steps):
            v = adapter.velocity(x, sigmas[k].expand(x.shape[0]), cond, guidance).float()
            x = x + (sigmas[k + 1] - sigmas[k]) * v
    return x


@pytest.mark.parametrize("source", list(PER_PROMPT))
@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_per_prompt_lengths_match_cfm_sample_at_each_length(guidance, source):
    """One Euler rollout of both prompts at their own lengths, padded to the longer, gives each
    sample what ``CFM.sample`` gives that prompt alone at that duration (its own length rule
    without a duration, the same seed)."""
    adapter = make(audio_duration="per_prompt")
    f5 = import_f5()
    cond = adapter.encode_inputs(PROMPTS, PER_PROMPT[source])
    lengths = cond.tensors[LATENT_LENGTH].tolist()
    assert lengths[0] != lengths[1]
    if source == "metadata":
        assert lengths == [REF_FRAMES + round(d["duration"] * 24000 / 256)
                           for d in PER_PROMPT[source]] == [44, 62]
    x = adapter.initial_noise(seeded(7, 8), cond)
    ours = euler_from(adapter, x, cond, guidance)
    for i, prompt in enumerate(PROMPTS):
        text = f5.utils.convert_char_to_pinyin([f5_text(REF_TEXT, prompt)])
        duration = (lengths[i] if source == "metadata"
                    else REF_FRAMES + adapter.estimate_frames(prompt))
        _, trajectory = adapter.pipeline.model.sample(
            cond=ref_mel()[None], text=text, duration=duration, steps=STEPS,
            cfg_strength=guidance - 1.0, sway_sampling_coef=-1.0, use_epss=True, seed=7 + i)
        assert trajectory[-1].shape[1] == lengths[i]
        assert torch.equal(trajectory[0][0], x[i, :lengths[i]])  # CFM.sample's draw, padded
        diff = (ours[i, :lengths[i]] - trajectory[-1][0]).abs().max().item()
        print(f"parity f5_tts per prompt ({source}), {lengths[i]} frames, guidance {guidance}: "
              f"max abs diff {diff:.3g}")
        assert diff <= TOL and ours[i, lengths[i]:].eq(0).all()
        assert (ours[i, :lengths[i]] - trajectory[0][0]).abs().max() > 1e-1


def test_schedule_is_f5s_grid():
    adapter = make()
    k = torch.arange(9) / 8  # 8 steps: no pruned table, so linspace; sway -1 gives cos
    torch.testing.assert_close(adapter.schedule(8), torch.cos(math.pi / 2 * k), atol=1e-6, rtol=0)
    pruned = torch.tensor([0, 2, 4, 8, 16, 32]) / 32
    torch.testing.assert_close(make(sway_coef=None).schedule(5), 1 - pruned)
    for n in (1, 5, 16, 32):
        s = adapter.schedule(n)
        assert s[0] == 1 and s[-1] == 0 and (s[1:] < s[:-1]).all() and s.dtype == torch.float32


def test_encoding_is_per_prompt_and_text_follows_f5():
    adapter = make()
    both, one, two = adapter.encode(PROMPTS), adapter.encode(PROMPTS[:1]), adapter.encode(
        PROMPTS[1:])
    for key, value in both.tensors.items():
        assert torch.equal(value, torch.cat([one.tensors[key], two.tensors[key]])), key
    assert f5_text(REF_TEXT, "hi") == "a short voice prompt.  hi"  # F5's ". " plus one space
    assert f5_text("Done.", "hi") == "Done.  hi" and f5_text("", "hi") == "hi"
    x = adapter.noise(2, torch.Generator().manual_seed(1))
    sigma = torch.full((2,), 0.6)
    with torch.no_grad():
        batched = adapter.velocity(x, sigma, both, 3.0)
        alone = torch.cat([adapter.velocity(x[:1], sigma[:1], one, 3.0),
                           adapter.velocity(x[1:], sigma[1:], two, 3.0)])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=0)
    weight = both.tensors[LOGPROB_WEIGHT]
    assert weight.shape == (2, adapter.num_frames(), 1)
    assert weight[:, :REF_FRAMES].eq(0).all() and weight[:, REF_FRAMES:].eq(1).all()


def test_reference_frames_add_nothing_to_log_probs():
    adapter = make()
    cond = adapter.encode(PROMPTS)
    sampler = samplers.get("sde", noise_level=0.7)
    sigmas = adapter.schedule(4)
    trained = torch.tensor([[0, 1], [0, 1]])
    traj = rollout(adapter, RolloutSpec(sampler, guidance=3.0), cond, adapter.noise(2), sigmas,
                   trained, torch.Generator().manual_seed(0))
    idx = torch.arange(2)
    for j in range(2):  # ratio 1 before any update
        logp = replay_step(adapter, sampler, traj, idx, j, 3.0).log_prob
        torch.testing.assert_close(logp, traj.log_probs[:, j], rtol=0, atol=1e-6)
    stored = traj.latents.clone()
    for j in range(2):  # move the reference frames of step j's next latent only
        traj.latents = stored.clone()
        traj.latents[:, j + 1, :REF_FRAMES] += 3.0
        logp = replay_step(adapter, sampler, traj, idx, j, 3.0).log_prob
        torch.testing.assert_close(logp, traj.log_probs[:, j], rtol=0, atol=1e-6)
    traj.latents = stored.clone()
    traj.latents[:, 2, REF_FRAMES:] += 0.1  # a generated frame does count
    assert not torch.allclose(replay_step(adapter, sampler, traj, idx, 1, 3.0).log_prob,
                              traj.log_probs[:, 1], rtol=0, atol=1e-3)


def test_lora_round_trip(tmp_path):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    adapter = make()
    x = adapter.noise(2, torch.Generator().manual_seed(5))
    base = euler_rollout(adapter, x, 3.0, steps=2)
    adapter.add_lora(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                target_modules=list(adapter.default_lora_targets)))
    names = [n for n, _ in adapter.transformer.named_parameters() if "lora_B" in n]
    assert len(names) == 2 * 4  # 2 blocks x (to_q, to_k, to_v, to_out.0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in adapter.transformer.named_parameters():
            if "lora_B" in name:  # gaussian init leaves B at zero: perturb it
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    state = get_peft_model_state_dict(adapter.transformer)
    adapter.save_lora(str(tmp_path), state, adapter.transformer.peft_config["default"].to_dict())
    tuned = euler_rollout(adapter, x, 3.0, steps=2)
    assert (tuned - base).abs().max() > 1e-3
    fresh = make()
    fresh.load_lora(str(tmp_path))
    assert (euler_rollout(fresh, x, 3.0, steps=2) - tuned).abs().max() <= TOL


def test_load_from_a_saved_folder(tmp_path):
    adapter = make()
    adapter.pipeline.save_pretrained(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"config.json", "model_last.safetensors",
                                                    "vocab.txt", "vocoder"}
    loaded = F5TTSAdapter(str(tmp_path), ref_mel=ref_mel(), ref_text=REF_TEXT,
                          audio_duration=0.4)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    cond = adapter.encode(PROMPTS)
    assert torch.equal(cond.tensors["text"], loaded.encode(PROMPTS).tensors["text"])
    with torch.no_grad():
        a = adapter.velocity(x, torch.full((2,), 0.7), cond, 3.0)
        b = loaded.velocity(x, torch.full((2,), 0.7), cond, 3.0)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(adapter.decode(x), loaded.decode(x), rtol=0, atol=0)


def test_load_a_released_style_folder(tmp_path):
    """F5's own layout: ``model_<step>.safetensors`` with EMA bookkeeping keys, no config.json
    (the architecture from a training YAML), the vocoder from a separate folder."""
    import yaml
    from safetensors.torch import load_file, save_file

    adapter = make()
    adapter.pipeline.save_pretrained(tmp_path / "saved")
    state = load_file(str(tmp_path / "saved" / "model_last.safetensors"))
    state["ema_model.initted"], state["ema_model.step"] = torch.ones(1), torch.tensor([10.0])
    folder = tmp_path / "release"
    folder.mkdir()
    save_file(state, str(folder / "model_1250000.safetensors"))
    (folder / "vocab.txt").write_text((tmp_path / "saved" / "vocab.txt").read_text())
    training = {"model": {"backbone": "DiT", "arch": CONFIG["arch"], "mel_spec": MEL,
                          "tokenizer": "custom"}}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(training))
    loaded = F5TTSAdapter(str(folder), model_config=str(tmp_path / "tiny.yaml"),
                          vocoder=str(tmp_path / "saved" / "vocoder"), ref_mel=ref_mel(),
                          ref_text=REF_TEXT, audio_duration=0.4)
    x = adapter.noise(2, torch.Generator().manual_seed(0))
    torch.testing.assert_close(euler_rollout(loaded, x, 3.0, steps=2),
                               euler_rollout(adapter, x, 3.0, steps=2), rtol=0, atol=0)
    with pytest.raises(ValueError, match="neither a folder nor a hub id"):
        F5TTSAdapter(str(tmp_path / "missing"))
    (folder / "vocab.txt").unlink()  # the package's vocabulary does not fit this checkpoint
    with pytest.raises(ValueError, match="vocab_file"):
        F5TTSAdapter(str(folder), model_config=str(tmp_path / "tiny.yaml"),
                     vocoder=adapter.pipeline.vocoder)
    with pytest.raises(ValueError, match="model_\\*.safetensors"):
        F5TTSAdapter(str(tmp_path), vocoder=adapter.pipeline.vocoder)
    # F5's length rule: reference frames per byte of its transcript, times the prompt's bytes
    seconds = loaded.estimate_seconds("hello there")
    assert seconds == pytest.approx(REF_FRAMES / 23 * 11 * 256 / 24000)


def test_decode_drops_the_reference_and_stays_in_range():
    adapter = make()
    x = adapter.noise(2, torch.Generator().manual_seed(2))
    audio = adapter.decode(x)
    generated = adapter.num_frames() - REF_FRAMES
    assert audio.shape == (2, 1, generated * 256) and audio.dtype == torch.float32
    assert audio.abs().max() <= 1.0 and not audio.requires_grad
    vocoder = adapter.pipeline.vocoder
    expected = vocoder.decode(x[:, REF_FRAMES:].transpose(1, 2)).clamp(-1, 1)
    torch.testing.assert_close(audio[:, 0], expected)
    assert adapter.modality == "audio" and adapter.sample_rate == 24000


def test_reference_audio_from_a_wav_file(tmp_path):
    t = torch.arange(2400) / 24000
    voice = 0.05 * torch.sin(2 * math.pi * 220 * t)  # quiet: RMS 0.035 < 0.1
    path = save_wav(voice[None], 24000, tmp_path / "voice.wav")
    from_file = make(ref_mel=None, ref_audio=str(path))
    stored, _ = load_wav(path)  # the 16-bit samples the file holds
    from_tensor = make(ref_mel=None, ref_audio=stored[0])
    assert from_file.ref_frames == 2400 // 256 + 1  # F5's mel: centred frames
    torch.testing.assert_close(from_file.ref_mel, from_tensor.ref_mel, rtol=0, atol=0)
    assert from_file.gain == pytest.approx(0.05 / math.sqrt(2) / 0.1, rel=1e-3)
    # F5 raises the quiet voice to RMS 0.1 before its mel: the mel of the raised waveform
    raised = stored * 0.1 / stored.square().mean().sqrt()
    mel = from_file.pipeline.model.mel_spec(raised)[0].T
    torch.testing.assert_close(from_file.ref_mel, mel, rtol=0, atol=1e-3)
    path16 = save_wav(voice[None, ::3], 8000, tmp_path / "voice8k.wav")  # resampled to 24 kHz
    assert make(ref_mel=None, ref_audio=str(path16)).ref_frames == from_file.ref_frames


def test_position_weights_cover_generated_frames_only():
    adapter = make()
    x = adapter.noise(2)
    generated = x.shape[1] - REF_FRAMES
    w = adapter.position_weights(torch.ones(2, 4), x)
    assert w.shape == (2, x.shape[1], 1)
    assert w[:, :REF_FRAMES].eq(0).all() and w[:, REF_FRAMES:].eq(1).all()
    ramp = adapter.position_weights(torch.arange(float(generated)).repeat(2, 3, 1), x)
    assert torch.equal(ramp[0, REF_FRAMES:, 0], torch.arange(float(generated)))


def test_no_reference_voice_and_gradient_checkpointing():
    plain = F5TTSAdapter(model=tiny_pipeline(), audio_duration=0.4)
    cond = plain.encode(PROMPTS)
    assert plain.ref_frames == 0 and LOGPROB_WEIGHT not in cond.tensors
    x = plain.noise(2, torch.Generator().manual_seed(3))
    sigma = torch.full((2,), 0.5)
    with torch.no_grad():
        before = plain.velocity(x, sigma, cond, 3.0)
    plain.transformer.enable_gradient_checkpointing()
    assert plain.transformer.checkpoint_activations
    twin = copy.deepcopy(plain.transformer)  # the trainer's frozen reference copy
    twin.checkpoint_activations = False
    twin.enable_gradient_checkpointing()
    assert twin.checkpoint_activations
    plain.transformer.train().requires_grad_(True)
    out = plain.velocity(x, sigma, cond, 3.0)
    out.square().mean().backward()
    torch.testing.assert_close(out.detach(), before)  # dropout is off in training mode too


def test_a_bare_dit_with_a_vocab_file(tmp_path):
    pipe = tiny_pipeline()
    pipe.save_pretrained(tmp_path)
    options = {"ref_mel": ref_mel(), "ref_text": REF_TEXT, "audio_duration": 0.4}
    bare = F5TTSAdapter(model=tiny_pipeline().model.transformer,
                        vocab_file=str(tmp_path / "vocab.txt"), **options)
    full = F5TTSAdapter(model=pipe, **options)
    x = full.noise(2, torch.Generator().manual_seed(0))
    cond = full.encode(PROMPTS)
    assert torch.equal(bare.encode(PROMPTS).tensors["text"], cond.tensors["text"])
    with torch.no_grad():
        torch.testing.assert_close(bare.velocity(x, torch.full((2,), 0.3), cond, 3.0),
                                   full.velocity(x, torch.full((2,), 0.3), cond, 3.0))
    with pytest.raises(ValueError, match="CFM, DiT or F5TTSPipeline"):
        F5TTSAdapter(model=torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="one of"):
        F5TTSAdapter(model=pipe, pipeline=pipe)
    as_pipeline = F5TTSAdapter(pipeline=pipe, **options)
    assert as_pipeline.pipeline is pipe and as_pipeline.transformer is pipe.model.transformer


@pytest.mark.parametrize(("options", "message"), [
    (dict(audio_duration=0.0), "audio_duration"),
    (dict(sway_coef=-2.0), "sway_coef"),
    (dict(ref_text=""), "ref_text"),
    (dict(ref_audio=torch.zeros(100)), "not both"),
    (dict(ref_mel=torch.zeros(4, 3)), "ref_mel"),
])
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as err:
        make(**options)
    assert "\n" not in str(err.value)


def test_a_prompt_longer_than_the_clip_is_refused():
    with pytest.raises(ValueError, match="raise audio_duration"):
        make(audio_duration=0.05).encode(["a rather long sentence for such a short clip"])


@pytest.mark.slow
def test_family_contract(tmp_path):
    """tests/families/test_family_contract.py for this family: load from a saved folder through the
    trainer, ratio 1 before any update for each stochastic sampler, decode, reward, one LoRA
    update that changes only the LoRA weights, a checkpoint whose LoRA loads back."""
    folder = tmp_path / "model"
    tiny_pipeline().save_pretrained(folder)
    t = torch.arange(2400) / 24000
    voice = save_wav(0.3 * torch.sin(2 * math.pi * 180 * t)[None], 24000, tmp_path / "voice.wav")
    check_family_contract("f5_tts", folder, {"ref_audio": str(voice), "ref_text": "hi there",
                                             "audio_duration": 0.4}, tmp_path)


# ------------------------------------------------------------------ per-prompt durations
# (docs/adapters.md, "Speech families: per-prompt durations"; without the package:
# tests/families/test_f5_tts_lengths.py)

def rolled(adapter: F5TTSAdapter, durations: list[float], sampler: str, guidance: float = 3.0):
    """A ``sampler`` rollout of :data:`PROMPTS` with these metadata durations, sample ``i`` from
    seed ``i``, trained at steps 0 and 1 of 4."""
    cond = adapter.encode_inputs(PROMPTS, [{"duration": d} for d in durations])
    spec = RolloutSpec(samplers.get(sampler, noise_level=0.7), guidance=guidance)
    trained = torch.tensor([[0, 1], [0, 1]])
    with torch.no_grad():
        return rollout(adapter, spec, cond, adapter.initial_noise(seeded(0, 1), cond),
                       adapter.schedule(4), trained, seeded(0, 1))


@pytest.mark.parametrize("sampler", ["sde", "cps"])
def test_a_batch_of_two_lengths_equals_each_length_alone(sampler):
    """Sample 0 of a batch of 38 and 56 generated frames has the latents and log-probs it has in
    a batch where every sample has 38 frames, sample 1 those of a batch of 56; its padding
    stays exactly 0 and decodes to silence."""
    adapter = make(audio_duration="per_prompt")
    mixed = rolled(adapter, [0.4, 0.6], sampler)
    lengths = mixed.cond.tensors[LATENT_LENGTH].tolist()
    assert lengths == [REF_FRAMES + 38, REF_FRAMES + 56]
    weight = mixed.cond.tensors[LOGPROB_WEIGHT][0, :, 0]
    assert weight[:REF_FRAMES].eq(0).all() and weight[lengths[0]:].eq(0).all()
    torch.testing.assert_close(weight[REF_FRAMES:lengths[0]], torch.full((38,), 62 / 44))
    audio = adapter.decode(mixed.final)
    for i, alone in enumerate([rolled(adapter, [0.4] * 2, sampler),
                               rolled(adapter, [0.6] * 2, sampler)]):
        n = lengths[i]
        assert alone.latents.shape[2] == n
        assert (mixed.latents[i, :, :n] - alone.latents[i]).abs().max() <= TOL
        assert mixed.latents[i, :, n:].eq(0).all()
        assert (mixed.log_probs[i] - alone.log_probs[i]).abs().max() <= TOL
        own = adapter.decode(alone.final)[i]
        assert (audio[i, :, :own.shape[-1]] - own).abs().max() <= TOL
        assert audio[i, :, own.shape[-1]:].eq(0).all()
    assert audio.shape == (2, 1, 56 * 256)
    assert (mixed.log_probs[0] - mixed.log_probs[1]).abs().min() > 1e-4  # both are real


def test_padded_frames_move_no_log_prob_or_kl():
    """Replayed log-probs and KLs of a mixed batch do not change when its padding is moved (in
    the state and in the stored next state); the ratio is 1 before any update."""
    from peft import LoraConfig

    from flowgrpo.rl.kl import exact_kl

    adapter = make(audio_duration="per_prompt")
    adapter.add_lora(LoraConfig(r=2, lora_alpha=2, target_modules=list(
        adapter.default_lora_targets)))
    with torch.no_grad():  # a policy away from the reference: the KL is not 0
        for name, param in adapter.transformer.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, 0.3, generator=torch.Generator().manual_seed(0))
    traj = rolled(adapter, [0.4, 0.6], "sde")
    n = int(traj.cond.tensors[LATENT_LENGTH][0])
    sampler = samplers.get("sde", noise_level=0.7)
    idx = torch.arange(2)

    def replayed():
        with torch.no_grad():
            out = [replay_step(adapter, sampler, traj, idx, j, 3.0, kl=exact_kl)
                   for j in range(2)]
        return [r.log_prob for r in out], [r.kl for r in out]

    logp, kl = replayed()
    for j in range(2):
        torch.testing.assert_close(logp[j], traj.log_probs[:, j], rtol=0, atol=1e-6)
        assert (kl[j] > 1e-4).all()
    traj.latents[0, :, n:] = torch.randn(traj.latents[0, :, n:].shape) * 5
    moved_logp, moved_kl = replayed()
    for j in range(2):
        torch.testing.assert_close(moved_logp[j], logp[j], rtol=0, atol=1e-6)
        torch.testing.assert_close(moved_kl[j], kl[j], rtol=0, atol=1e-6)
    traj.latents[0, 2, n - 1] += 0.1  # its last own frame does count
    with torch.no_grad():
        assert (replay_step(adapter, sampler, traj, idx, 1, 3.0).log_prob[0]
                - logp[1][0]).abs() > 1e-4


def saved_model_and_voice(tmp_path):
    """A saved tiny model and a 0.1 s reference voice (10 mel frames) for trainer runs."""
    folder = tmp_path / "model"
    tiny_pipeline().save_pretrained(folder)
    t = torch.arange(2400) / 24000
    voice = save_wav(0.3 * torch.sin(2 * math.pi * 180 * t)[None], 24000, tmp_path / "voice.wav")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "two dogs", "duration": 0.3}\n'
                       '{"prompt": "a red cube", "duration": 0.5}\n')
    options = {"ref_audio": str(voice), "ref_text": "hi there", "audio_duration": "per_prompt"}
    return folder, options, prompts


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

    folder, options, prompts = saved_model_and_voice(tmp_path)
    config = {
        "model": {"family": "f5_tts", "path": str(folder), "guidance": 3.0,
                  "options": options, "lora_rank": 2, "lora_alpha": 2},
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
    p = t.adapter.ref_frames
    assert sorted(set(lengths.tolist())) == [p + round(0.3 * 93.75), p + round(0.5 * 93.75)]
    assert_padding_moves_no_loss(t, batch, adv, lengths)


@pytest.mark.slow
def test_family_contract_with_per_prompt_durations(tmp_path):
    """The family contract with prompts of two durations in every batch."""
    folder, options, prompts = saved_model_and_voice(tmp_path)
    check_family_contract("f5_tts", folder, options, tmp_path, prompts=str(prompts))


def test_the_recipe_gives_each_prompt_its_length(tmp_path):
    """configs/tts_f5.yaml uses per-prompt durations: on a tiny model, two prompts of the
    recipe's prompt set get F5's rule, each its own length."""
    from flowgrpo.config.io import load_config
    from flowgrpo.data.prompts import load_prompts
    from flowgrpo.training.model_setup import load_adapter

    folder, options, _ = saved_model_and_voice(tmp_path)
    cfg = load_config("tts_f5", [f"model.path={folder}", "model.dtype=float32",
                                 "model.mixed_precision=fp32", "model.options.subfolder=null",
                                 f"model.options.ref_audio={options['ref_audio']}",
                                 "model.options.ref_text=hi there"])
    assert cfg.model.options["audio_duration"] == "per_prompt"
    adapter = load_adapter(cfg.model)
    texts = [p for p, _ in load_prompts(cfg.data.prompts)[:2]]
    cond = adapter.encode(texts)
    rule = [max(adapter.ref_frames + adapter.estimate_frames(text), adapter.tokens(text).numel()
                + 1) for text in texts]
    assert cond.tensors[LATENT_LENGTH].tolist() == rule
    x = adapter.initial_noise(seeded(0, 1), cond)
    with torch.no_grad():
        v = adapter.velocity(x, torch.full((2,), 0.5), cond, cfg.model.guidance)
    assert v.shape == x.shape and torch.isfinite(v).all()


def test_one_padded_dit_call_would_change_the_shorter_sample():
    """Why the velocity runs each length on its own: F5's DiT attends to padded frames (its
    configs' ``attn_mask_enabled: False``), so one call over the padded batch moves the shorter
    sample's velocity."""
    adapter = make(audio_duration="per_prompt")
    cond = adapter.encode_inputs(PROMPTS, PER_PROMPT["metadata"])
    x = adapter.initial_noise(seeded(0, 1), cond)
    sigma = torch.full((2,), 0.7)
    alone_cond = adapter.encode_inputs(PROMPTS[:1], PER_PROMPT["metadata"][:1])
    with torch.no_grad():
        grouped = adapter.velocity(x, sigma, cond, 3.0)
        alone = adapter.velocity(x[:1, :44], sigma[:1], alone_cond, 3.0)
        one_call = adapter._velocity(x, sigma, cond.tensors["text"], 3.0)
    assert (grouped[0, :44] - alone[0]).abs().max() <= TOL and grouped[0, 44:].eq(0).all()
    assert (one_call[0, :44] - alone[0]).abs().max() > 1e-2
