"""Speech rewards: intelligibility (``wer``, ``cer``), voice match (``speaker_sim``) and spectral
distance to a reference recording (``mcd``). Everything runs offline, on the CPU (the speaker
encoder on the GPU when there is one).

Audio ``[B, C, T]`` is averaged to mono and resampled to 16 kHz (:mod:`reward_models.media`).

``wer`` / ``cer``: each clip is transcribed with pocketsphinx (CMU Sphinx; its US English model
ships in the wheel) and compared with the reference: ``metadata["text"]`` when present, else the
prompt. Both texts are normalized the same way (:func:`normalize_text`: lower case, punctuation
removed, whitespace collapsed); digits are left as they are, so write references in spoken form
(the built-in ``tts_hard`` prompt set already does: its ``"text"`` spells numbers, dates and times
out in words). ``score = max(0, 1 - edit distance / reference length)`` in words (``wer``) or
characters, spaces included (``cer``). pocketsphinx's general English language model recognizes
synthetic speech poorly; a ``vocabulary`` (the words the texts use) replaces it with a free-order
grammar over those words, which is far more accurate and about three times as fast. Neither is a
perfect transcriber: scores compare samples, they rarely reach exactly 1. pocketsphinx holds the
GIL while it decodes; ``workers`` moves decoding to other processes.

``speaker_sim``: cosine between utterance embeddings of the clip and of a reference recording
(``metadata["speaker_wav"]``), from the GE2E speaker encoder of Resemblyzer (a 3-layer LSTM on
40-band mel spectrograms; its ``pretrained.pt`` is read without importing the package). The
features follow Resemblyzer's: volume raised to -30 dBFS, long silences shortened, mel power
spectrogram (25 ms Hann window, 10 ms hop), one embedding per 1.6 s window (1.3 windows per
second), averaged. One difference: silences are found by frame energy instead of WebRTC's voice
activity detector, so embeddings can differ slightly from Resemblyzer's own.

``mcd``: mel-cepstral distortion (Kubichek 1993) to a reference recording of the same text
(``metadata["reference_wav"]``), after dynamic time warping. The cepstra are MFCC-style (cosine
transform of the log mel amplitude, 40 bands, c1..c13, scaled as true cepstra so that MCD is the
RMS log-spectral difference in dB), not SPTK mel-generalized cepstra: values are near, not equal
to, published MCDs (espeak-ng: about 1 dB for the same text at another speaking rate, 5-7 dB for
another text). ``score = -MCD``.

Reference WAVs are 16-bit PCM (any rate, channels averaged); relative paths are resolved against
the current directory, and each file's features are computed once per reward (cached by path and
modification time).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import re
import struct
import subprocess
import sys
import threading
import warnings
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from flowgrpo.errors import one_line

from .base import RewardOutput, register
from .cache import FileCache
from .clip import pick_device
from .media import Media, check_batch, require, to_mono
from .ocr import levenshtein

SAMPLE_RATE = 16000  # what pocketsphinx's model and the speaker encoder expect
N_FFT, HOP, N_MELS = 400, 160, 40  # 25 ms window, 10 ms hop at 16 kHz
PARTIAL_FRAMES = 160  # speaker encoder window: 1.6 s of mel frames
MCD_SCALE = 10 / math.log(10) * math.sqrt(2)  # dB per unit of cepstral distance


# --- shared helpers ------------------------------------------------------------------------------


def mono_16k(media: Media) -> torch.Tensor:
    """Audio media -> ``[B, T]`` float32 mono at 16 kHz."""
    from flowgrpo.audio import resample

    return resample(to_mono(media.data.detach().cpu()), int(media.sample_rate), SAMPLE_RATE)


def read_wav(path: str | os.PathLike, what: str = "WAV file") -> tuple[torch.Tensor, int]:
    """A PCM WAV file -> (``[T]`` float32 mono in [-1, 1], sample rate in Hz).

    Read by :func:`pipelines.media_io.load_wav`; channels are averaged. Raises ``ValueError``
    (one line naming ``what`` and the path) for a missing, unreadable or empty file.
    """
    from flowgrpo.audio import load_wav

    try:
        audio, rate = load_wav(path)
    except (OSError, ValueError) as err:
        raise ValueError(f"{what} {err}") from None
    if not audio.shape[1]:
        raise ValueError(f"{what} {os.fspath(path)!r} holds no samples")
    return audio.mean(0), rate


def reference_paths(metadata: list[dict], key: str, default: str | None, reward: str) -> list[str]:
    """The reference WAV of each sample: ``metadata[key]``, else ``default``."""
    paths = []
    for meta in metadata:
        value = meta.get(key, default)
        if value is None:
            raise ValueError(
                f"reward {reward!r} needs metadata[{key!r}] (a WAV path) for every sample, or a "
                f"default {key}=<path> parameter"
            )
        paths.append(os.fspath(value))
    return paths


def reference_cache(compute: Callable[[torch.Tensor], Any], what: str) -> FileCache:
    """``compute(audio)`` of reference WAV files (``[T]`` 16 kHz audio), once per file: read by
    :func:`read_wav`, whose one-line errors name ``what``."""

    def load(name: str) -> Any:
        from flowgrpo.audio import resample

        audio, rate = read_wav(name, what)
        return compute(resample(audio, rate, SAMPLE_RATE))

    return FileCache(load)


# --- mel features --------------------------------------------------------------------------------


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale (the Auditory Toolbox's, librosa's default): linear below 1 kHz,
    logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz * 3.0 / 200.0
    log = 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (math.log(6.4) / 27.0)
    return np.where(hz >= 1000.0, log, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    """Inverse of :func:`hz_to_mel`."""
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * 200.0 / 3.0
    log = 1000.0 * np.exp((mel - 15.0) * (math.log(6.4) / 27.0))
    return np.where(mel >= 15.0, log, linear)


def mel_filterbank(sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS,
                   fmin: float = 0.0, fmax: float | None = None) -> torch.Tensor:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters, evenly spaced on the Slaney mel scale from
    ``fmin`` to ``fmax`` (default Nyquist), each scaled to unit area (Slaney normalization)."""
    fmax = sample_rate / 2 if fmax is None else fmax
    bins = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), n_mels + 2))
    lo, mid, hi = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lo) / (mid - lo)
    falling = (hi - bins[None, :]) / (hi - mid)
    weights = np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (hi - lo))
    return torch.from_numpy(weights)


_FILTERS: dict[tuple, torch.Tensor] = {}


def mel_spectrogram(audio: torch.Tensor, sample_rate: int = SAMPLE_RATE, n_fft: int = N_FFT,
                    hop: int = HOP, n_mels: int = N_MELS) -> torch.Tensor:
    """Mel power spectrogram of ``[..., T]`` audio -> ``[..., 1 + T // hop, n_mels]`` float32.

    Periodic Hann window of ``n_fft`` samples, frames centered on multiples of ``hop`` (the signal
    is zero-padded by ``n_fft // 2`` at both ends), ``|STFT|^2`` through :func:`mel_filterbank`:
    the same numbers as ``librosa.feature.melspectrogram`` with its defaults (librosa >= 0.10).
    """
    key = (sample_rate, n_fft, n_mels)
    if key not in _FILTERS:
        _FILTERS[key] = mel_filterbank(sample_rate, n_fft, n_mels)
    shape = audio.shape
    flat = audio.reshape(-1, shape[-1]).to(torch.float64)
    spec = torch.stft(
        flat, n_fft, hop_length=hop, window=torch.hann_window(n_fft, dtype=torch.float64),
        center=True, pad_mode="constant", return_complex=True,
    ).abs().square()  # [N, n_fft // 2 + 1, frames]
    mel = torch.einsum("mf,nft->ntm", _FILTERS[key].to(spec.device), spec)
    return mel.reshape(*shape[:-1], *mel.shape[-2:]).float()


# --- wer / cer -----------------------------------------------------------------------------------


def normalize_text(text: str) -> str:
    """Lower case, punctuation removed (hyphens split words; apostrophes inside words stay, as in
    ``don't``), whitespace collapsed; digits are kept as they are."""
    text = re.sub(r"[^\w\s']|_", " ", text.lower().replace("-", " "))
    return " ".join(word for word in (w.strip("'") for w in text.split()) if word)


def error_rate(reference: str, hypothesis: str, unit: str = "word") -> float:
    """Edit distance between the normalized texts over the reference length, counted in words
    (``unit="word"``) or characters with single spaces (``unit="char"``); an empty reference
    counts as length 1."""
    ref, hyp = normalize_text(reference), normalize_text(hypothesis)
    if unit == "word":
        return levenshtein(ref.split(), hyp.split()) / max(len(ref.split()), 1)
    if unit == "char":
        return levenshtein(ref, hyp) / max(len(ref), 1)
    raise ValueError(f"unknown unit {unit!r}; use word or char")


def read_vocabulary(vocabulary: str | os.PathLike | list[str]) -> list[str]:
    """Distinct normalized words, in first-seen order, of a list of words (or phrases) or of a
    text file (``str`` or path: words separated by whitespace)."""
    if isinstance(vocabulary, (str, os.PathLike)):
        name = os.fspath(vocabulary)
        if not os.path.isfile(name):
            raise ValueError(
                f"vocabulary file {name!r} does not exist; pass a list of words or a text file"
            )
        text = Path(name).read_text(encoding="utf-8")
    else:
        text = " ".join(str(word) for word in vocabulary)
    words = list(dict.fromkeys(normalize_text(text).split()))
    if not words:
        raise ValueError("the vocabulary holds no words")
    return words


_ALTERNATE = re.compile(r"\(\d+\)")  # pocketsphinx marks alternate pronunciations: read(2)

# pocketsphinx holds the GIL while it decodes, so decoding in parallel (or without stalling the
# trainer's threads) needs other processes. This source runs both here and in worker processes
# started with ``python -c``, which import only pocketsphinx (not torch).
_ASR_SOURCE = """
def build_decoder(words, params):
    from pocketsphinx import Decoder

    if words is None:
        return Decoder(**params)
    decoder = Decoder(**{**params, "lm": None})
    # free word order: any word leads from the start state to the end state, which loops on any
    p = 1.0 / len(words)
    transitions = [(state, 1, p, word) for state in (0, 1) for word in words]
    decoder.add_fsg("words", decoder.create_fsg("words", 0, 1, transitions))
    decoder.activate_search("words")
    return decoder


def decode_pcm(decoder, pcm):
    decoder.start_utt()
    decoder.process_raw(pcm, full_utt=True)
    decoder.end_utt()
    hyp = decoder.hyp()
    return "" if hyp is None else hyp.hypstr
"""
_WORKER_LOOP = """
import json, struct, sys

source, sink = sys.stdin.buffer, sys.stdout.buffer


def receive():
    head = source.read(4)
    return source.read(struct.unpack("<I", head)[0]) if len(head) == 4 else None


decoder = build_decoder(*json.loads(receive()))  # first message: [words, params]
while (pcm := receive()) is not None:
    text = decode_pcm(decoder, pcm).encode()
    sink.write(struct.pack("<I", len(text)) + text)
    sink.flush()
"""
_ASR: dict[str, Any] = {}
exec(_ASR_SOURCE, _ASR)


class _DecoderProcess:
    """A pocketsphinx decoder in a child process: length-prefixed 16-bit PCM in on stdin,
    length-prefixed UTF-8 transcripts out on stdout. It exits when its stdin closes."""

    def __init__(self, words: list[str] | None, params: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _ASR_SOURCE + _WORKER_LOOP],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        config = json.dumps([words, params], default=str).encode()
        with contextlib.suppress(OSError):  # a worker that died is reported by decode
            self.proc.stdin.write(struct.pack("<I", len(config)) + config)
            self.proc.stdin.flush()

    def decode(self, pcm: bytes) -> str:
        try:
            self.proc.stdin.write(struct.pack("<I", len(pcm)) + pcm)
            self.proc.stdin.flush()
            head = self.proc.stdout.read(4)
            if len(head) == 4:
                return self.proc.stdout.read(struct.unpack("<I", head)[0]).decode()
        except (OSError, ValueError):
            pass
        self.close()
        raise RuntimeError(
            f"a pocketsphinx worker process stopped (exit code {self.proc.returncode})"
        )

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class _WorkerPool:
    """``workers`` decoder processes, each fed by one thread (threads wait on pipes, GIL-free);
    a process that dies is replaced for the next clip."""

    def __init__(self, workers: int, words: list[str] | None, params: dict) -> None:
        self.words, self.params = words, params
        self.idle: queue.SimpleQueue[_DecoderProcess] = queue.SimpleQueue()
        self.procs = [_DecoderProcess(words, params) for _ in range(workers)]
        for proc in self.procs:
            self.idle.put(proc)
        self.threads = ThreadPoolExecutor(workers, thread_name_prefix="asr-worker")

    def _decode(self, pcm: bytes) -> str:
        proc = self.idle.get()
        try:
            return proc.decode(pcm)
        except RuntimeError:
            fresh = _DecoderProcess(self.words, self.params)
            self.procs[self.procs.index(proc)] = fresh
            proc = fresh
            raise
        finally:
            self.idle.put(proc)

    def map(self, clips: list[bytes]) -> list[str]:
        return list(self.threads.map(self._decode, clips))

    def close(self) -> None:
        self.threads.shutdown(wait=True)
        for proc in self.procs:
            proc.close()


class _Transcribed:
    """Transcribe with pocketsphinx, score by edit distance (``wer`` and ``cer``)."""

    name, unit = "", ""

    def __init__(
        self,
        vocabulary: str | os.PathLike | list[str] | None = None,
        workers: int = 0,
        decoder_params: dict | None = None,
    ) -> None:
        if int(workers) < 0:
            raise ValueError(f"{self.name} workers must be >= 0, got {workers}")
        self.params = {"samprate": SAMPLE_RATE, "loglevel": "FATAL", **(decoder_params or {})}
        self.words: list[str] | None = None
        if vocabulary is not None:
            words = read_vocabulary(vocabulary)
            probe = _ASR["build_decoder"](None, {**self.params, "lm": None})  # the dictionary
            self.words = [w for w in words if probe.lookup_word(w) is not None]
            known = set(self.words)
            unknown = [w for w in words if w not in known]
            if not self.words:
                raise ValueError(
                    f"{self.name}: none of the {len(words)} vocabulary words is in pocketsphinx's "
                    f"dictionary (first ones: {' '.join(words[:5])})"
                )
            if unknown:
                warnings.warn(
                    f"{self.name}: dropped {len(unknown)} vocabulary words missing from "
                    f"pocketsphinx's dictionary: {' '.join(unknown[:20])}", stacklevel=3,
                )
        self._local = threading.local()
        self._local.decoder = _ASR["build_decoder"](self.words, self.params)
        self.pool = _WorkerPool(int(workers), self.words, self.params) if workers else None
        if self.pool is not None:
            weakref.finalize(self, self.pool.close)

    def _decode(self, pcm: bytes) -> str:
        decoder = getattr(self._local, "decoder", None)
        if decoder is None:  # one decoder per calling thread: a decoder is not thread-safe
            decoder = self._local.decoder = _ASR["build_decoder"](self.words, self.params)
        return _ASR["decode_pcm"](decoder, pcm)

    def transcribe(self, audio: torch.Tensor) -> list[str]:
        """``[B, T]`` mono float audio at 16 kHz -> pocketsphinx's transcript of each clip."""
        pcm = (audio.float().clamp(-1, 1) * 32767).round().to(torch.int16).cpu().numpy()
        clips = [clip.astype("<i2").tobytes() for clip in pcm]
        texts = self.pool.map(clips) if self.pool else [self._decode(clip) for clip in clips]
        return [" ".join(_ALTERNATE.sub("", text).split()) for text in texts]

    def close(self) -> None:
        """Stop the worker processes (also done when the reward is garbage-collected)."""
        if self.pool is not None:
            self.pool.close()

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "audio", reward=self.name)
        check_batch(media, prompts, metadata, reward=self.name)
        references = [str(m["text"]) if m.get("text") is not None else p
                      for p, m in zip(prompts, metadata)]
        texts = self.transcribe(mono_16k(media))
        rates = torch.tensor([error_rate(r, t, self.unit) for r, t in zip(references, texts)],
                             dtype=torch.float32)
        return RewardOutput(scores=(1 - rates).clamp(min=0), info={
            self.name: float(rates.mean()), "exact_frac": float((rates == 0).float().mean()),
        })


@register("wer")
class WordErrorRate(_Transcribed):
    """``1 - word error rate`` of pocketsphinx's transcript, floored at 0 (see the module doc).

    Args:
        vocabulary: None: pocketsphinx's general US English language model. A list of words (or
            of texts) or the path of a text file of words: recognize only these words, in any
            order. Words missing from pocketsphinx's dictionary are dropped with a warning.
        workers: 0: decode in the calling thread. N: decode in N worker processes (started
            once; each imports only pocketsphinx, about 15 MB): N clips at a time, and the GIL
            stays free for the trainer while ``reward.async_workers`` scores in the background
            (pocketsphinx holds the GIL while it decodes, so threads would not help).
        decoder_params: extra pocketsphinx ``Decoder`` settings, JSON values (e.g.
            ``{"beam": 1e-60}``).

    The reference is ``metadata["text"]``, else the prompt. ``info["wer"]`` is the batch's mean
    raw error rate (not floored).
    """

    name, unit = "wer", "word"


@register("cer")
class CharErrorRate(_Transcribed):
    """``1 - character error rate`` of pocketsphinx's transcript, floored at 0; as ``wer``
    (same arguments), counting characters of the normalized texts, single spaces included.
    ``info["cer"]`` is the batch's mean raw error rate."""

    name, unit = "cer", "char"


# --- speaker_sim ---------------------------------------------------------------------------------


def default_speaker_weights() -> Path:
    """The installed Resemblyzer package's ``pretrained.pt`` (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            "speaker_sim's default weights come from the resemblyzer package (pip install "
            "resemblyzer; it is never imported); or pass weights=<.pt or .safetensors file>"
        )
    return Path(list(spec.submodule_search_locations)[0]) / "pretrained.pt"


class SpeakerEncoder(torch.nn.Module):
    """GE2E speaker encoder: 3-layer LSTM (40 -> 256), linear 256 -> 256, ReLU, L2 norm."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(N_MELS, 256, num_layers=3, batch_first=True)
        self.linear = torch.nn.Linear(256, 256)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """``[N, frames, 40]`` mel power -> ``[N, 256]`` unit embeddings."""
        _, (hidden, _) = self.lstm(mels)
        return torch.nn.functional.normalize(torch.relu(self.linear(hidden[-1])), dim=-1)


def load_speaker_encoder(weights: str | os.PathLike | None = None) -> SpeakerEncoder:
    """:class:`SpeakerEncoder` with ``weights``: a ``.pt`` checkpoint (loaded with
    ``weights_only=True``; a ``{"model_state": ...}`` dict as Resemblyzer's, or the state dict
    itself) or a ``.safetensors`` state dict. Keys other than ``lstm.*`` and ``linear.*`` are
    ignored. Default: :func:`default_speaker_weights`."""
    name = os.fspath(default_speaker_weights() if weights is None else weights)
    if not os.path.isfile(name):
        raise ValueError(f"speaker encoder weights {name!r} do not exist")
    try:
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            state = load_file(name)
        else:
            state = torch.load(name, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unreadable file gets the same one-line message
        raise ValueError(f"cannot read speaker encoder weights {name!r}: {one_line(err)}") from None
    if isinstance(state, dict) and isinstance(state.get("model_state"), dict):
        state = state["model_state"]
    model = SpeakerEncoder()
    expected = model.state_dict()
    state = {k: v for k, v in state.items() if k in expected} if isinstance(state, dict) else {}
    missing = sorted(set(expected) - set(state))
    wrong = sorted(k for k in state if tuple(state[k].shape) != tuple(expected[k].shape))
    if missing or wrong:
        raise ValueError(
            f"speaker encoder weights {name!r} do not fit a 3-layer 40->256 LSTM and a 256x256 "
            f"linear layer (missing: {missing[:4]}, wrong shapes: {wrong[:4]})"
        )
    model.load_state_dict(state)
    return model.eval()


def normalize_volume(audio: torch.Tensor, target_dbfs: float = -30.0) -> torch.Tensor:
    """Raise (never lower) ``[T]`` audio to an RMS level of ``target_dbfs``."""
    rms = float(audio.square().mean().sqrt())
    if rms <= 0:
        return audio
    gain_db = target_dbfs - 20 * math.log10(rms)
    return audio * 10 ** (gain_db / 20) if gain_db > 0 else audio


def trim_long_silences(audio: torch.Tensor, window: int = 480, relative_db: float = 40.0,
                       smooth: int = 8, keep: int = 6) -> torch.Tensor:
    """Shorten the silences of ``[T]`` 16 kHz audio that last more than ``keep`` windows of
    ``window`` samples (30 ms) to ``keep`` windows; drop the partial window at the end.

    A window is voiced when its energy is within ``relative_db`` of the loudest window's; the
    flags are smoothed by a ``smooth``-window moving average, rounded, then widened by
    ``keep // 2`` windows on both sides (Resemblyzer's steps, with this energy rule in place of
    WebRTC's voice activity detector). Audio without any voiced window is returned whole.
    """
    x = audio[: len(audio) // window * window].double().cpu().numpy()
    if not len(x):
        return audio
    energy = (x.reshape(-1, window) ** 2).mean(axis=1)
    if energy.max() <= 0:
        return audio
    voiced = (10 * np.log10(np.maximum(energy, 1e-20) / energy.max()) > -relative_db).astype(float)
    padded = np.concatenate([np.zeros((smooth - 1) // 2), voiced, np.zeros(smooth // 2)])
    mask = np.round(np.convolve(padded, np.ones(smooth) / smooth, mode="valid")) > 0
    mask = np.convolve(mask.astype(float), np.ones(keep + 1), mode="same") > 0
    if not mask.any():
        return audio
    return audio[: len(x)][torch.from_numpy(np.repeat(mask, window))]


def partial_starts(samples: int, rate: float = 1.3, min_coverage: float = 0.75) -> list[int]:
    """First mel frame of each 160-frame window of an utterance of ``samples`` samples.

    Windows start every ``16000 / rate`` samples (rounded to frames) and cover the utterance;
    the last one is dropped when less than ``min_coverage`` of it holds audio, unless it is the
    only one.
    """
    frames = math.ceil((samples + 1) / HOP)
    step = max(1, round(SAMPLE_RATE / rate / HOP))
    starts = list(range(0, max(1, frames - PARTIAL_FRAMES + step + 1), step))
    if len(starts) > 1 and (samples - starts[-1] * HOP) / (PARTIAL_FRAMES * HOP) < min_coverage:
        starts.pop()
    return starts


def speaker_partials(audio: torch.Tensor) -> torch.Tensor:
    """``[T]`` 16 kHz audio -> ``[windows, 160, 40]`` mel power frames for the speaker encoder."""
    audio = trim_long_silences(normalize_volume(audio.float()))
    starts = partial_starts(len(audio))
    need = (starts[-1] + PARTIAL_FRAMES) * HOP
    if need > len(audio):
        audio = torch.nn.functional.pad(audio, (0, need - len(audio)))
    mel = mel_spectrogram(audio)
    return torch.stack([mel[s : s + PARTIAL_FRAMES] for s in starts])


@register("speaker_sim")
class SpeakerSimilarity:
    """Cosine between GE2E speaker embeddings of each clip and its reference recording.

    Args:
        weights: speaker encoder weights (``.pt`` or ``.safetensors``; default: the installed
            Resemblyzer package's ``pretrained.pt``). See :func:`load_speaker_encoder`.
        speaker_wav: reference WAV for samples whose metadata has no ``"speaker_wav"`` (one
            target voice for the whole run); None: every sample must name one.
        device: where the LSTM runs; default CUDA when available.
        batch_size: 1.6 s windows per forward pass (all clips' windows are stacked).

    Returns ``scores[B] = cos(clip embedding, reference embedding)`` (in [0, 1] in practice:
    the embeddings are non-negative); ``info["cos_mean"]``.
    """

    def __init__(self, weights: str | os.PathLike | None = None, speaker_wav: str | None = None,
                 device: str | None = None, batch_size: int = 256) -> None:
        self.device = pick_device(device)
        self.model = load_speaker_encoder(weights).to(self.device)
        self.speaker_wav, self.batch_size = speaker_wav, int(batch_size)
        self.references = reference_cache(lambda audio: self.embed([audio])[0],
                                          "speaker_sim: metadata['speaker_wav'] file")

    @torch.no_grad()
    def embed(self, clips: list[torch.Tensor]) -> torch.Tensor:
        """16 kHz mono clips (``[T]`` each, any lengths) -> ``[N, 256]`` unit embeddings: the
        normalized mean of the embeddings of each clip's 1.6 s windows."""
        partials = [speaker_partials(clip) for clip in clips]
        stacked = torch.cat(partials).to(self.device)
        embedded = torch.cat([self.model(chunk) for chunk in stacked.split(self.batch_size)])
        means = [part.mean(dim=0) for part in embedded.cpu().split([len(p) for p in partials])]
        return torch.nn.functional.normalize(torch.stack(means), dim=-1)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "audio", reward="speaker_sim")
        check_batch(media, prompts, metadata, reward="speaker_sim")
        paths = reference_paths(metadata, "speaker_wav", self.speaker_wav, "speaker_sim")
        references = torch.stack([self.references.get(path) for path in paths])
        cos = (self.embed(list(mono_16k(media))) * references).sum(-1).float()
        return RewardOutput(scores=cos, info={"cos_mean": float(cos.mean())})


# --- mcd -----------------------------------------------------------------------------------------


def cepstral_basis(n_bands: int, n_ceps: int) -> np.ndarray:
    """``[n_ceps, n_bands]``: row ``k - 1`` gives ``c_k = (1 / N) * sum_n L_n cos(pi k (n + 1/2) /
    N)`` of a log spectrum ``L`` in ``N`` bands, for k = 1..n_ceps. With this scaling ``L_n = c_0
    + 2 sum_k c_k cos(...)`` and, by Parseval, ``sqrt(2 * sum_k (c_k - c'_k)^2)`` is the RMS over
    bands of the smoothed log-spectrum difference with its mean removed: what MCD assumes."""
    k, n = np.arange(1, n_ceps + 1)[:, None], np.arange(n_bands)[None, :]
    return np.cos(np.pi * k * (n + 0.5) / n_bands) / n_bands


def mel_cepstra(audio: torch.Tensor, n_ceps: int = 13, trim_db: float | None = 40.0
                ) -> np.ndarray:
    """``[T]`` 16 kHz audio -> ``[frames, n_ceps]`` mel cepstra c1..c_n (c0, the level, left
    out) of the natural-log mel amplitude (half the log of :func:`mel_spectrogram`), see
    :func:`cepstral_basis`.

    ``trim_db``: drop the leading and trailing frames quieter than the loudest frame by more
    than this (silence, batch padding); None keeps every frame.
    """
    power = mel_spectrogram(audio.float()).double().numpy()  # [frames, 40]
    if trim_db is not None:
        level = 10 * np.log10(np.maximum(power.sum(axis=1), 1e-20))
        loud = np.flatnonzero(level >= level.max() - trim_db)
        power = power[loud[0] : loud[-1] + 1]
    log_amplitude = 0.5 * np.log(np.maximum(power, 1e-10))
    return log_amplitude @ cepstral_basis(power.shape[1], n_ceps).T


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum-cost monotonic alignment of a ``[N, M]`` cost matrix (steps (1,0), (0,1), (1,1),
    from (0, 0) to (N-1, M-1)) -> (row indices, column indices) of the path, in order."""
    n, m = cost.shape
    acc = np.empty((n, m))
    acc[0] = np.cumsum(cost[0])
    for i in range(1, n):
        # acc[i, j] = cost[i, j] + min(acc[i-1, j], acc[i-1, j-1], acc[i, j-1]); the horizontal
        # term unrolls to min over k <= j of (best from above at k + cost[i, k+1..j])
        above = cost[i].copy()
        above[0] += acc[i - 1, 0]
        above[1:] += np.minimum(acc[i - 1, 1:], acc[i - 1, :-1])
        run = np.cumsum(cost[i])
        acc[i] = run + np.minimum.accumulate(above - run)
    i, j, path = n - 1, m - 1, [(n - 1, m - 1)]
    while i > 0 or j > 0:
        if i == 0:
            j -= 1
        elif j == 0:
            i -= 1
        else:
            step = int(np.argmin((acc[i - 1, j - 1], acc[i - 1, j], acc[i, j - 1])))
            i, j = (i - 1, j - 1) if step == 0 else (i - 1, j) if step == 1 else (i, j - 1)
        path.append((i, j))
    rows, cols = np.array(path[::-1]).T
    return rows, cols


def mel_cepstral_distortion(a: np.ndarray, b: np.ndarray) -> float:
    """MCD in dB between cepstra ``[N, D]`` and ``[M, D]``: ``10 / ln 10 * sqrt(2 * sum of squared
    differences)`` per frame pair on the DTW path (Euclidean frame distance), averaged."""
    sq = (a**2).sum(1)[:, None] + (b**2).sum(1)[None, :] - 2 * a @ b.T
    dist = np.sqrt(np.maximum(sq, 0.0))
    rows, cols = dtw(dist)
    exact = np.sqrt(((a[rows] - b[cols]) ** 2).sum(axis=1))  # 0 for identical frames
    return float(MCD_SCALE * exact.mean())


@register("mcd")
class MelCepstralDistortion:
    """Minus the mel-cepstral distortion (dB, DTW-aligned) to a reference recording.

    Args:
        reference_wav: reference WAV for samples whose metadata has no ``"reference_wav"``;
            None: every sample must name one.
        n_ceps: cepstral coefficients compared (c1..c_n; c0, the loudness, is left out).
        trim_db: leading / trailing frames quieter than the loudest by more than this are cut
            from both clips before alignment (None: keep all).

    Returns ``scores[B] = -MCD`` (higher is better, 0 for an identical clip); ``info["mcd_db"]``
    is the batch's mean MCD.
    """

    def __init__(self, reference_wav: str | None = None, n_ceps: int = 13,
                 trim_db: float | None = 40.0) -> None:
        if not 1 <= int(n_ceps) < N_MELS:
            raise ValueError(f"mcd n_ceps must be in 1..{N_MELS - 1}, got {n_ceps}")
        self.reference_wav, self.n_ceps, self.trim_db = reference_wav, int(n_ceps), trim_db
        self.references = reference_cache(self.cepstra, "mcd: metadata['reference_wav'] file")

    def cepstra(self, audio: torch.Tensor) -> np.ndarray:
        """``[T]`` 16 kHz audio -> ``[frames, n_ceps]`` (see :func:`mel_cepstra`)."""
        return mel_cepstra(audio, self.n_ceps, self.trim_db)

    def __call__(self, media: Media, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        require(media, "audio", reward="mcd")
        check_batch(media, prompts, metadata, reward="mcd")
        paths = reference_paths(metadata, "reference_wav", self.reference_wav, "mcd")
        mcd = torch.tensor(
            [mel_cepstral_distortion(self.cepstra(clip), self.references.get(path))
             for clip, path in zip(mono_16k(media), paths)],
            dtype=torch.float32,
        )
        return RewardOutput(scores=-mcd, info={"mcd_db": float(mcd.mean())})
