"""``f5_tts`` per-prompt durations without the optional f5-tts package: the adapter's own code
(lengths, padding, one DiT call per length, decoding per length) on a stand-in for F5's DiT
with its interface and its failure mode: its frames see each other through a convolution and
an attention that no frame mask reaches, as F5's attention does under its shipped
``attn_mask_enabled: False`` (and its convolutions without a mask). Parity with
``CFM.sample`` at each length is in
``tests/families/test_f5_tts.py`` (run with the package)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import samplers
from flowgrpo.rl.replay import replay_step
from flowgrpo.rl.rollout import RolloutSpec, rollout
from pipelines.base import LATENT_LENGTH, LOGPROB_WEIGHT
from pipelines.f5_tts import F5TTSAdapter, F5TTSPipeline, f5_text

MELS = 6
REF_TEXT = "a short voice prompt"
PROMPTS = ["hello there", "two dogs"]


class StandInDiT(nn.Module):
    """F5's ``DiT`` call (``x, cond, text, time, mask, cfg_infer, cache``; text ids padded with
    -1, ``+ 1`` so 0 fills, cut to the frames; ``cfg_infer`` returns ``[cond; null]``, the null
    branch without text and reference) on a tiny random model whose frames mix."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.text_embed = nn.Embedding(257, dim)
        self.proj = nn.Linear(2 * MELS + dim, dim)
        self.conv = nn.Conv1d(dim, dim, 5, padding=2)
        self.time = nn.Linear(1, dim)
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.dropout = nn.Dropout(0.1)  # F5 trains with dropout; the adapter switches it off
        self.proj_out = nn.Linear(dim, MELS)

    def embed(self, x, cond, text, drop: bool) -> torch.Tensor:
        n = x.shape[1]
        text = (text + 1)[:, :n]
        text = F.pad(text, (0, n - text.shape[1]))
        if drop:
            text, cond = torch.zeros_like(text), torch.zeros_like(cond)
        h = self.proj(torch.cat([x, cond, self.text_embed(text)], -1))
        return h + self.conv(h.transpose(1, 2)).transpose(1, 2)

    def forward(self, x, cond, text, time, mask=None, cfg_infer=False, cache=False):
        t = self.time(time.reshape(-1, 1))[:, None]
        h = self.embed(x, cond, text, False)
        if cfg_infer:
            h, t = torch.cat([h, self.embed(x, cond, text, True)]), torch.cat([t, t])
        h = self.dropout(h + t)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.proj_out(h)


class StandInCFM(nn.Module):
    """What the adapter reads of F5's ``CFM``."""

    def __init__(self) -> None:
        super().__init__()
        self.transformer = StandInDiT()
        self.mel_spec = SimpleNamespace(target_sample_rate=24000, hop_length=256)
        self.num_channels = MELS
        self.vocab_char_map = None


class StandInVocoder(nn.Module):
    """Vocos' ``decode(mel [B, n_mels, frames]) -> [B, samples]``, 4 samples per frame, with a
    convolution over frames (the padding would reach a clip's last samples)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(MELS, 4, 3, padding=1)

    def decode(self, mel: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.conv(mel)).transpose(1, 2).reshape(len(mel), -1)


def tokens(prompt: str) -> torch.Tensor:
    """UTF-8 bytes of F5's text (the package's tokenizer without a vocabulary)."""
    return torch.tensor(list(f5_text(REF_TEXT, prompt).encode()), dtype=torch.long)


def make(ref_frames: int = 40, **options) -> F5TTSAdapter:
    torch.manual_seed(0)
    pipe = F5TTSPipeline(StandInCFM(), vocoder=StandInVocoder())
    ref = torch.randn(ref_frames, MELS, generator=torch.Generator().manual_seed(9))
    options = {"audio_duration": "per_prompt", "use_epss": False, **options}
    adapter = F5TTSAdapter(pipeline=pipe, ref_mel=ref, ref_text=REF_TEXT, **options)
    adapter.tokens = tokens
    return adapter


def seeded(*seeds: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(s) for s in seeds]


def test_lengths_follow_the_metadata_and_f5s_rule():
    adapter = make()
    assert not adapter.per_prompt_encoding and adapter.condition_keys == ("duration",)
    fixed = make(audio_duration=0.5)
    assert fixed.per_prompt_encoding and fixed.condition_keys == ()
    ref_bytes = len(f5_text(REF_TEXT, "").encode())  # "a short voice prompt.  "
    assert ref_bytes == 23
    # F5's infer_batch_process: P + int(P / ref_bytes * bytes / speed), speed 0.3 under 10 bytes
    rule = [40 + int(40 / 23 * 11), 40 + int(40 / 23 * 8 / 0.3)]
    assert [adapter.num_frames(p) for p in PROMPTS] == rule == [59, 86]
    cond = adapter.encode_inputs(PROMPTS, [{"duration": 0.1}, {}])
    assert cond.tensors[LATENT_LENGTH].tolist() == [40 + round(0.1 * 24000 / 256), 86]
    assert cond.tensors["text"].shape == (2, 86)
    assert cond.tensors[LOGPROB_WEIGHT].shape == (2, 86, 1)
    # CFM.sample's floor: at least the text plus one frame
    short = make(ref_frames=5).encode_inputs(["hello there"], [{"duration": 0.01}])
    assert short.tensors[LATENT_LENGTH].tolist() == [tokens("hello there").numel() + 1]
    with pytest.raises(ValueError, match="duration") as err:
        F5TTSAdapter(pipeline=F5TTSPipeline(StandInCFM()), audio_duration="per_prompt",
                     use_epss=False).num_frames("hi")
    assert "\n" not in str(err.value)


def rolled(adapter, prompts, durations, guidance, seeds):
    cond = adapter.encode_inputs(prompts, [{"duration": d} for d in durations])
    spec = RolloutSpec(samplers.get("sde", noise_level=0.7), guidance=guidance)
    trained = torch.tensor([[0, 1]] * len(prompts))
    return rollout(adapter, spec, cond, adapter.initial_noise(seeded(*seeds), cond),
                   adapter.schedule(4), trained, seeded(*seeds))


@pytest.mark.parametrize("guidance", [1.0, 3.0])
def test_a_batch_of_two_lengths_equals_each_length_alone(guidance):
    adapter = make()
    with torch.no_grad():
        mixed = rolled(adapter, PROMPTS, [0.1, 0.3], guidance, (0, 1))
    lengths = mixed.cond.tensors[LATENT_LENGTH].tolist()
    assert lengths == [49, 68]
    audio = adapter.decode(mixed.final)
    for i, n in enumerate(lengths):
        with torch.no_grad():
            alone = rolled(adapter, PROMPTS[i:i + 1], [[0.1, 0.3][i]], guidance, (i,))
        assert alone.latents.shape[2] == n
        assert (mixed.latents[i, :, :n] - alone.latents[0]).abs().max() <= 1e-5
        assert mixed.latents[i, :, n:].eq(0).all()
        assert (mixed.log_probs[i] - alone.log_probs[0]).abs().max() <= 1e-5
        own = adapter.decode(alone.final)[0]
        assert (audio[i, :, :own.shape[-1]] - own).abs().max() <= 1e-5
        assert audio[i, :, own.shape[-1]:].eq(0).all()
    sampler = samplers.get("sde", noise_level=0.7)
    for j in range(2):  # ratio 1, and the padding moves no log-prob
        logp = replay_step(adapter, sampler, mixed, torch.arange(2), j, guidance).log_prob
        torch.testing.assert_close(logp, mixed.log_probs[:, j], rtol=0, atol=1e-6)
    mixed.latents[0, :, 49:] = 3 * torch.randn(mixed.latents[0, :, 49:].shape)
    for j in range(2):
        logp = replay_step(adapter, sampler, mixed, torch.arange(2), j, guidance).log_prob
        torch.testing.assert_close(logp, mixed.log_probs[:, j], rtol=0, atol=1e-6)


def test_one_padded_call_would_change_the_shorter_sample():
    """Why the velocity runs each length on its own: this DiT, like F5's, lets padded frames
    reach the others."""
    adapter = make()
    cond = adapter.encode_inputs(PROMPTS, [{"duration": 0.1}, {"duration": 0.3}])
    x = adapter.initial_noise(seeded(0, 1), cond)
    x[0, 49:] = torch.randn(x[0, 49:].shape)  # what the padding holds does not matter
    sigma = torch.full((2,), 0.7)
    with torch.no_grad():
        grouped = adapter.velocity(x, sigma, cond, 3.0)
        alone = adapter.velocity(x[:1, :49], sigma[:1], adapter.encode_inputs(
            PROMPTS[:1], [{"duration": 0.1}]), 3.0)
        one_call = adapter._velocity(x, sigma, cond.tensors["text"], 3.0)
    assert (grouped[0, :49] - alone[0]).abs().max() <= 1e-5 and grouped[0, 49:].eq(0).all()
    assert (one_call[0, :49] - alone[0]).abs().max() > 1e-3
