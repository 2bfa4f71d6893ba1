"""Speech rewards (``wer``, ``cer``, ``speaker_sim``, ``mcd``) on the committed espeak-ng clips.

The clips in ``tests/assets/speech`` come from ``scripts/make_speech_clips.py`` (espeak-ng is not
needed here): six texts in voice ``a``, four of them also in voice ``b``, and the first text at two
more speaking rates. ``clips.json`` lists each file's text, voice and rate, plus texts that no clip
speaks (``wrong_texts``). ``wer`` / ``cer`` need pocketsphinx; ``speaker_sim`` needs Resemblyzer's
weights file (the package itself is never imported).
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import wave

import numpy as np
import pytest
import torch

import helpers
import reward_models
import reward_models.speech as speech
from flowgrpo.config.schema import RewardConfig, RunConfig
from flowgrpo.training.reward_runner import RewardRunner
from reward_models import Media

ASSETS = helpers.ASSETS / "speech"
MANIFEST = json.loads((ASSETS / "clips.json").read_text())
CLIPS = MANIFEST["clips"]
VOCABULARY = ASSETS / "vocabulary.txt"
# three texts in voice a and two of them in voice b: the wer / cer batch
ASR_BATCH = ["t0_a.wav", "t1_a.wav", "t2_a.wav", "t0_b.wav", "t1_b.wav"]


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The speaker encoder's LSTM takes 160 tiny steps per window: one thread is as fast as two,
    and two stall on each other on a busy machine (measured: 0.2 s vs up to 12 s a batch)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def speaker_weights_available() -> bool:
    try:
        return speech.default_speaker_weights().is_file()
    except ValueError:  # resemblyzer is not installed
        return False


def wav(name: str) -> torch.Tensor:
    audio, rate = speech.read_wav(ASSETS / name)
    assert rate == MANIFEST["sample_rate"]
    return audio


def batch(names: list[str], rate: int = 16000) -> Media:
    """The clips zero-padded to one length, as a ``[B, 1, T]`` audio batch (resampled when
    ``rate`` is not 16 kHz, so the rewards' own resampling is exercised)."""
    clips = [wav(name) for name in names]
    data = torch.stack([torch.nn.functional.pad(c, (0, max(map(len, clips)) - len(c)))
                        for c in clips])
    if rate != 16000:
        data = reward_models.media.resample(data, 16000, rate)
    return Media("audio", data[:, None], sample_rate=rate)


def wrong_texts(names: list[str]) -> list[str]:
    """A text that ``names[i]`` does not speak, for every clip (the unspoken texts in turn)."""
    wrong = MANIFEST["wrong_texts"]
    return [wrong[i % len(wrong)] for i in range(len(names))]


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


@functools.cache
def asr(name: str, vocabulary: bool = True):
    pytest.importorskip("pocketsphinx", reason="wer / cer need pocketsphinx (pip install "
                        "pocketsphinx; its English model ships in the wheel)")
    return reward_models.get(name, vocabulary=VOCABULARY if vocabulary else None)


@functools.cache
def speaker():
    if not speaker_weights_available():
        pytest.skip("speaker_sim needs Resemblyzer's pretrained.pt (pip install resemblyzer)")
    return reward_models.get("speaker_sim", device="cpu")


def wer_scores(name: str, names: list[str], texts: list[str]) -> torch.Tensor:
    out = asr(name)(batch(names), texts, [{"group": i} for i in range(len(names))])
    assert out.scores.shape == (len(names),) and out.scores.dtype == torch.float32
    assert out.scores.min() >= 0 and out.scores.max() <= 1
    return out.scores


# --- wer / cer -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,margin", [("wer", 0.3), ("cer", 0.25)])
def test_asr_scores_the_spoken_text_above_a_wrong_text(name, margin):
    right = wer_scores(name, ASR_BATCH, [CLIPS[n]["text"] for n in ASR_BATCH])
    wrong = wer_scores(name, ASR_BATCH, wrong_texts(ASR_BATCH))
    # measured (means over the batch): wer 0.46 vs 0.06, cer 0.60 vs 0.23; the transcripts are
    # far from perfect (voice b is heard worst), so exact scores of 1 are not expected
    assert right.mean() - wrong.mean() > margin, (right, wrong)
    assert (right >= wrong).all(), (right, wrong)


def test_default_language_model_runs_and_stays_in_range():
    reward = asr("wer", vocabulary=False)
    assert reward.words is None
    names = ["t2_a.wav", "t3_b.wav"]
    out = reward(batch(names, rate=22050), [CLIPS[n]["text"] for n in names], [{}, {}])
    assert out.scores.shape == (2,) and torch.isfinite(out.scores).all()
    assert out.scores.min() >= 0 and out.scores.max() <= 1
    assert out.info["wer"] >= 0 and 0 <= out.info["exact_frac"] <= 1
    assert float(out.scores.mean()) >= 1 - out.info["wer"] - 1e-6  # scores are floored at 0


def test_reference_is_metadata_text_then_prompt_and_scores_floor_at_zero(monkeypatch):
    reward = asr("wer")
    heard = ["hello world", "a b c d e f", "one two three"]
    monkeypatch.setattr(reward, "transcribe", lambda audio: list(heard))
    media = batch(["t0_a.wav", "t1_a.wav", "t2_a.wav"])
    out = reward(media, ["ignored prompt", "x", "One, two... THREE!"],
                 [{"text": "Hello world"}, {"text": "a"}, {"text": None}])
    # exact match; 5 insertions over a 1-word reference (rate 5, score floored); prompt used
    assert out.scores.tolist() == [1.0, 0.0, 1.0]
    assert out.info["wer"] == pytest.approx((0 + 5 + 0) / 3)
    assert out.info["exact_frac"] == pytest.approx(2 / 3)


def test_text_normalization_and_error_rates():
    text = "  Don't STOP-the 3 cats, 'please'!\n"
    assert speech.normalize_text(text) == "don't stop the 3 cats please"
    assert speech.error_rate("the cat sat", "the bat sat down", "word") == pytest.approx(2 / 3)
    assert speech.error_rate("the cat", "The cat.", "word") == 0
    assert speech.error_rate("abcd", "abxd", "char") == pytest.approx(1 / 4)
    assert speech.error_rate("a b", "ab", "char") == pytest.approx(1 / 3)  # the space counts
    assert speech.error_rate("", "", "word") == 0 and speech.error_rate("", "x", "word") == 1
    with pytest.raises(ValueError, match="unknown unit"):
        speech.error_rate("a", "a", "phone")


def test_vocabulary_forms_unknown_words_and_errors():
    pytest.importorskip("pocketsphinx", reason="wer / cer need pocketsphinx")
    assert speech.read_vocabulary(["The cat", "the", "DOG!"]) == ["the", "cat", "dog"]
    with pytest.warns(UserWarning, match=r"dropped 1 vocabulary words .*: zzxqj"):
        reward = reward_models.get("wer", vocabulary=["hello", "zzxqj", "world"])
    assert reward.words == ["hello", "world"]
    with pytest.raises(ValueError) as err:
        reward_models.get("cer", vocabulary=["zzxqj", "qqvvk"])
    assert "none of the 2 vocabulary words" in one_line(err)
    with pytest.raises(ValueError) as err:
        reward_models.get("wer", vocabulary="no/such/words.txt")
    assert "does not exist" in one_line(err)
    with pytest.raises(ValueError) as err:
        reward_models.get("wer", workers=-1)
    assert "workers must be >= 0" in one_line(err)


def test_runner_scores_speech_in_the_async_pool_as_the_trainer_does():
    """``reward.async_workers`` and a mix, through ``RewardRunner.submit`` / ``collect`` (what
    ``Trainer.sample`` calls), equal the rewards called directly; ``wer`` decodes in 2 worker
    processes."""
    pytest.importorskip("pocketsphinx", reason="wer needs pocketsphinx")

    class Adapter:
        modality, sample_rate = "audio", 24000

    names = ["t0_a.wav", "t1_a.wav", "t0_b.wav", "t1_b.wav"]
    wer_params = {"vocabulary": str(VOCABULARY), "workers": 2}
    mcd_params = {"reference_wav": str(ASSETS / "t0_a.wav")}
    cfg = RewardConfig(components=[
        {"name": "wer", "weight": 1.0, "params": wer_params},
        {"name": "mcd", "weight": 0.1, "params": mcd_params},
    ], async_workers=1)
    runner = RewardRunner(cfg, Adapter(), RunConfig(on_reward_error="stop"))
    assert runner.pool is not None
    media = batch(names, rate=Adapter.sample_rate)
    texts = [CLIPS[n]["text"] for n in names]
    metadata = [{"group": i // 2} for i in range(len(names))]
    pending = [runner.submit(media.data[:2], texts[:2], metadata[:2]),
               runner.submit(media.data[2:], texts[2:], metadata[2:])]
    out, valid = runner.collect(pending, torch.tensor([0, 0, 1, 1]))
    assert bool(valid.all())
    wer = reward_models.get("wer", vocabulary=VOCABULARY)(media, texts, metadata).scores
    mcd = reward_models.get("mcd", **mcd_params)(media, texts, metadata).scores
    assert torch.equal(out.components["wer"], wer)
    assert torch.allclose(out.components["mcd"], mcd)
    assert torch.allclose(out.scores, wer + 0.1 * mcd)
    # t0_a against itself, after a 16 -> 24 -> 16 kHz round trip: near 0, the others far
    assert -mcd[0] < 0.5 and -mcd[1:].min() > 3, mcd
    runner.pool.close()
    runner.reward.rewards[0].close()


def test_a_dead_worker_process_fails_one_call_and_is_replaced():
    reward = asr("wer")
    workers = reward_models.get("wer", vocabulary=VOCABULARY, workers=1)
    try:
        media, texts = batch(["t2_a.wav"]), [CLIPS["t2_a.wav"]["text"]]
        first = workers(media, texts, [{}]).scores
        assert torch.equal(first, reward(media, texts, [{}]).scores)
        workers.pool.procs[0].proc.kill()
        workers.pool.procs[0].proc.wait()
        with pytest.raises(RuntimeError) as err:
            workers(media, texts, [{}])
        assert "pocketsphinx worker process stopped (exit code -9)" in one_line(err)
        assert torch.equal(workers(media, texts, [{}]).scores, first)
    finally:
        workers.close()
    assert all(proc.proc.poll() is not None for proc in workers.pool.procs)


# --- speaker_sim ---------------------------------------------------------------------------------


def test_speaker_sim_prefers_the_same_voice():
    reward = speaker()
    names = ["t1_a.wav", "t2_a.wav", "t3_a.wav", "t1_b.wav", "t2_b.wav", "t3_b.wav"]
    ref = str(ASSETS / "t0_a.wav")  # voice a, a text none of the clips speaks
    out = reward(batch(names), [""] * 6, [{"speaker_wav": ref}] * 6)
    same, other = out.scores[:3], out.scores[3:]
    # measured: same voice 0.83-0.86, other voice 0.53-0.63
    assert same.min() > other.max() + 0.1, (same, other)
    assert out.info["cos_mean"] == pytest.approx(float(out.scores.mean()))
    # the other direction: a voice-b reference prefers the voice-b clips
    out = reward(batch(names), [""] * 6, [{"speaker_wav": str(ASSETS / "t0_b.wav")}] * 6)
    assert out.scores[3:].min() > out.scores[:3].max() + 0.1, out.scores


def test_speaker_sim_of_a_clip_with_itself_is_one_and_batching_changes_nothing(monkeypatch):
    reward = speaker()
    names = ["t0_a.wav", "t2_b.wav", "t0_a_r120.wav"]
    monkeypatch.chdir(ASSETS)  # relative reference paths resolve against the current directory
    out = reward(batch(names), [""] * 3, [{"speaker_wav": n} for n in names])
    assert torch.allclose(out.scores, torch.ones(3), atol=1e-5), out.scores
    together = reward.embed([wav(n) for n in names])
    alone = torch.cat([reward.embed([wav(n)]) for n in names])
    assert torch.allclose(together, alone, atol=1e-5)
    padded = reward.embed(list(batch(names).data[:, 0]))  # trailing zeros are trimmed as silence
    assert (padded * alone).sum(-1).min() > 0.99


def test_speaker_sim_default_reference_and_weights_files(tmp_path):
    save_file = pytest.importorskip("safetensors.torch").save_file
    reward = speaker()
    state = {k: v.contiguous() for k, v in reward.model.state_dict().items()}
    save_file(state, str(tmp_path / "encoder.safetensors"))
    again = reward_models.get("speaker_sim", weights=tmp_path / "encoder.safetensors",
                              speaker_wav=str(ASSETS / "t1_b.wav"), device="cpu")
    media = batch(["t1_b.wav", "t1_a.wav"])
    out = again(media, ["", ""], [{}, {"speaker_wav": str(ASSETS / "t1_a.wav")}])
    assert torch.allclose(out.scores, torch.ones(2), atol=1e-5)
    save_file({"lstm.weight_ih_l0": torch.zeros(3, 3)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError) as err:
        reward_models.get("speaker_sim", weights=tmp_path / "other.safetensors", device="cpu")
    assert "do not fit a 3-layer 40->256 LSTM" in one_line(err)
    with pytest.raises(ValueError) as err:
        reward_models.get("speaker_sim", weights=tmp_path / "missing.pt", device="cpu")
    assert "do not exist" in one_line(err)
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError) as err:
        reward_models.get("speaker_sim", weights=tmp_path / "junk.pt", device="cpu")
    assert "cannot read speaker encoder weights" in one_line(err)


# --- mcd -----------------------------------------------------------------------------------------


def test_mcd_is_zero_for_the_reference_and_lower_for_the_same_text_at_other_rates():
    reward = reward_models.get("mcd")
    names = ["t0_a.wav", "t0_a_r120.wav", "t0_a_r210.wav", "t1_a.wav", "t3_a.wav", "t4_a.wav"]
    ref = {"reference_wav": str(ASSETS / "t0_a.wav")}
    out = reward(batch(names), [""] * 6, [dict(ref) for _ in names])
    mcd = -out.scores
    assert mcd[0] == 0  # the reference itself, batch padding trimmed
    # measured: other rates 0.8 and 1.0 dB, other texts 5.2-5.8 dB
    assert mcd[1:3].max() * 2 < mcd[3:].min(), mcd
    assert out.info["mcd_db"] == pytest.approx(float(mcd.mean()))


def test_dtw_finds_the_minimum_cost_path():
    gen = np.random.default_rng(0)
    for n, m in ((1, 1), (1, 5), (6, 1), (7, 9), (12, 5)):
        cost = gen.random((n, m))
        best = np.full((n + 1, m + 1), np.inf)
        best[0, 0] = 0
        for i in range(1, n + 1):
            for j in range(1, m + 1):
                prev = best[i - 1, j - 1] if (i, j) != (1, 1) else 0.0
                best[i, j] = cost[i - 1, j - 1] + min(prev, best[i - 1, j], best[i, j - 1])
        rows, cols = speech.dtw(cost)
        assert (rows[0], cols[0]) == (0, 0) and (rows[-1], cols[-1]) == (n - 1, m - 1)
        steps = np.stack([np.diff(rows), np.diff(cols)], 1)
        assert {tuple(s) for s in steps} <= {(0, 1), (1, 0), (1, 1)}
        assert cost[rows, cols].sum() == pytest.approx(best[n, m])


def test_mcd_equals_the_rms_log_spectral_difference_for_a_gain():
    """c0 is left out, so a gain alone costs nothing; a spectral tilt costs the RMS of the
    low-quefrency log-amplitude difference (Parseval with the cepstral scaling)."""
    ceps = speech.mel_cepstra(wav("t2_a.wav"))
    louder = speech.mel_cepstra(wav("t2_a.wav") * 0.5)
    assert speech.mel_cepstral_distortion(ceps, louder) == pytest.approx(0, abs=1e-6)
    log_diff = np.linspace(-1, 1, speech.N_MELS)  # a tilt in natural-log amplitude per band
    shift = log_diff @ speech.cepstral_basis(speech.N_MELS, 39).T
    want = 10 / np.log(10) * np.sqrt(np.mean((log_diff - log_diff.mean()) ** 2))
    got = speech.MCD_SCALE * np.sqrt((shift**2).sum())
    assert got == pytest.approx(want, rel=1e-9)


# --- features ------------------------------------------------------------------------------------


def test_mel_spectrogram_matches_librosa():
    librosa = pytest.importorskip("librosa", reason="the reference implementation is librosa's")
    audio = torch.cat([wav("t1_b.wav")[:12345], 0.3 * torch.randn(999)])
    ours = speech.mel_spectrogram(audio).numpy()
    ref = librosa.feature.melspectrogram(y=audio.numpy(), sr=16000, n_fft=400, hop_length=160,
                                         n_mels=40).T
    assert ours.shape == ref.shape == (1 + len(audio) // 160, 40)
    assert np.abs(ours - ref).max() <= 1e-4 * ref.max()
    basis = librosa.filters.mel(sr=16000, n_fft=400, n_mels=40)
    assert np.allclose(speech.mel_filterbank().numpy(), basis, rtol=1e-5, atol=1e-9)
    batched = speech.mel_spectrogram(torch.stack([audio, audio.flip(0)]))
    assert torch.allclose(batched[0], torch.from_numpy(ours))


def test_speaker_windows_follow_the_rate_and_coverage_rules():
    assert speech.partial_starts(8000) == [0]  # shorter than one window: one, padded
    assert speech.partial_starts(16000 * 3) == [0, 77, 154]
    # 2.37 s: a third window would hold 52% audio (< 75%): dropped; at 2.8 s it holds 79%
    assert speech.partial_starts(237 * 160) == [0, 77]
    assert speech.partial_starts(int(2.8 * 16000)) == [0, 77, 154]
    assert speech.speaker_partials(wav("t0_a.wav")).shape[1:] == (160, 40)
    quiet = speech.normalize_volume(torch.full((100,), 0.001))
    assert 20 * np.log10(float(quiet.square().mean().sqrt())) == pytest.approx(-30, abs=1e-3)
    loud = torch.full((100,), 0.5)
    assert torch.equal(speech.normalize_volume(loud), loud)  # never lowered
    silence_gap = torch.cat([torch.ones(4800) * 0.1, torch.zeros(48000), torch.ones(4800) * 0.1])
    trimmed = speech.trim_long_silences(silence_gap)
    assert 9600 < len(trimmed) < 9600 + 8 * 480  # the 3 s gap shrinks to a few windows


# --- errors --------------------------------------------------------------------------------------


def cheap_rewards() -> dict:
    """A built instance of every speech reward whose dependency is installed."""
    built = {"mcd": reward_models.get("mcd")}
    if speaker_weights_available():
        built["speaker_sim"] = speaker()
    if importlib.util.find_spec("pocketsphinx") is not None:
        built["wer"] = asr("wer")
    return built


def test_errors_are_one_line(tmp_path):
    rewards = cheap_rewards()
    media = batch(["t2_a.wav"])
    for name, reward in rewards.items():
        with pytest.raises(ValueError) as err:
            reward(Media("image", torch.rand(1, 3, 8, 8)), ["p"], [{}])
        assert f"reward {name!r} scores audio media, got image media" == one_line(err)
        with pytest.raises(ValueError) as err:
            reward(media, ["p", "q"], [{}])
        assert "got 1 samples but 2 prompts" in one_line(err)

    bad_24bit = tmp_path / "twentyfour.wav"
    with wave.open(str(bad_24bit), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(3)
        w.setframerate(16000)
        w.writeframes(bytes(2400))
    (tmp_path / "text.wav").write_text("hello")
    float_wav = tmp_path / "float.wav"
    float_wav.write_bytes(base64.b64decode(
        reward_models.media.encode_wav(torch.zeros(1, 160), 16000)))
    cases = {
        str(tmp_path / "missing.wav"): "does not exist",
        str(bad_24bit): "has 24-bit samples; 8-, 16- or 32-bit PCM WAV is supported",
        str(tmp_path / "text.wav"): "is not a readable PCM WAV file",
        str(float_wav): "is not a readable PCM WAV file",
    }
    for name, key in (("speaker_sim", "speaker_wav"), ("mcd", "reference_wav")):
        if name not in rewards:
            continue
        with pytest.raises(ValueError) as err:
            rewards[name](media, ["p"], [{"group": 0}])
        assert f"reward {name!r} needs metadata[{key!r}]" in one_line(err)
        for path, message in cases.items():
            with pytest.raises(ValueError) as err:
                rewards[name](media, ["p"], [{key: path}])
            text = one_line(err)
            assert message in text and f"metadata[{key!r}] file" in text and path in text


def test_read_wav_mixes_channels_and_keeps_the_rate(tmp_path):
    path = tmp_path / "stereo.wav"
    left, right = np.full(100, 1000, "<i2"), np.full(100, -3000, "<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(np.stack([left, right], 1).tobytes())
    audio, rate = speech.read_wav(path)
    assert rate == 22050 and audio.shape == (100,) and audio.dtype == torch.float32
    assert torch.allclose(audio, torch.full((100,), -1000 / 32768))
