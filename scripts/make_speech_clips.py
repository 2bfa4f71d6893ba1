"""Synthesise the speech test clips in ``tests/assets/speech/`` with espeak-ng.

The speech rewards (``reward_models/speech.py``) are tested on real speech, but espeak-ng is not
installed everywhere, so the clips are made once with this script and committed:

- every text of :data:`TEXTS` in voice ``a`` (a male voice), the first four also in voice ``b``
  (a female variant): same text / other voice and same voice / other text pairs;
- the first text again, slower and faster, in voice ``a``: same words at other speaking rates;
- 16 kHz mono 16-bit PCM WAVs (espeak-ng writes 22.05 kHz; resampled with a polyphase filter),
  with 0.1 s of silence before the speech and 0.15 s after it;
- ``clips.json``: ``{"sample_rate", "voices", "wrong_texts", "clips": {file: {text, voice,
  rate}}}``; :data:`WRONG_TEXTS` are never spoken, they are references that a clip must not
  match (their words are in the vocabulary, so a recogniser could output them);
- ``vocabulary.txt``: every word of every text, one per line, sorted.

Usage: ``python scripts/make_speech_clips.py [--out tests/assets/speech]``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
from scipy.signal import resample_poly

SAMPLE_RATE = 16000
VOICES = {"a": "en-us", "b": "en-us+f3"}
RATE = 160  # espeak-ng words per minute
OTHER_RATES = (120, 210)  # the first text again, in voice a
TEXTS = (
    "the quick brown fox jumps over the lazy dog",
    "please open the window before the meeting",
    "my sister bought three red apples",
    "the small boat crossed the calm lake",
    "we walk to the park after lunch",
    "the old man reads a book every night",
)
WRONG_TEXTS = (
    "a green car stopped near the station",
    "the children sing loudly in the garden",
)
OUT = Path(__file__).resolve().parents[1] / "tests" / "assets" / "speech"


def synthesise(text: str, voice: str, rate: int) -> np.ndarray:
    """``text`` spoken by espeak-ng -> float64 mono samples at :data:`SAMPLE_RATE` in [-1, 1]."""
    raw = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(rate), "--stdout", text],
        check=True, capture_output=True,
    ).stdout
    with wave.open(io.BytesIO(raw)) as w:
        if w.getsampwidth() != 2:
            raise ValueError(f"espeak-ng wrote {8 * w.getsampwidth()}-bit audio, expected 16")
        channels, rate_in = w.getnchannels(), w.getframerate()
        frames = w.readframes(w.getnframes())
    samples = np.frombuffer(frames, dtype="<i2").astype(np.float64) / 32768.0
    samples = samples.reshape(-1, channels).mean(axis=1)
    g = math.gcd(rate_in, SAMPLE_RATE)
    return trim(resample_poly(samples, SAMPLE_RATE // g, rate_in // g))


def trim(samples: np.ndarray, lead: float = 0.1, tail: float = 0.15,
         threshold: float = 0.01) -> np.ndarray:
    """Exactly ``lead`` / ``tail`` seconds of silence before / after the speech (where
    ``|x| > threshold``), so every clip starts and ends alike and the assets stay small."""
    loud = np.flatnonzero(np.abs(samples) > threshold)
    speech = samples[loud[0] : loud[-1] + 1]
    before, after = np.zeros(round(lead * SAMPLE_RATE)), np.zeros(round(tail * SAMPLE_RATE))
    return np.concatenate([before, speech, after])


def write_wav(path: Path, samples: np.ndarray) -> None:
    """Mono float samples -> 16-bit PCM WAV at :data:`SAMPLE_RATE` (clipped to [-1, 1])."""
    pcm = np.round(np.clip(samples, -1.0, 32767 / 32768) * 32768).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(SAMPLE_RATE)
        w.writeframes(pcm.tobytes())


def plan() -> list[tuple[str, str, str, int]]:
    """``(file name, text, voice key, rate)`` of every clip."""
    clips = [(f"t{i}_a.wav", text, "a", RATE) for i, text in enumerate(TEXTS)]
    clips += [(f"t{i}_b.wav", text, "b", RATE) for i, text in enumerate(TEXTS[:4])]
    clips += [(f"t0_a_r{rate}.wav", TEXTS[0], "a", rate) for rate in OTHER_RATES]
    return clips


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="output folder (replaced)")
    args = parser.parse_args()
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is not installed (Debian/Ubuntu: apt-get install espeak-ng)")
    args.out.mkdir(parents=True, exist_ok=True)
    for old in args.out.glob("*.wav"):
        old.unlink()
    manifest = {
        "sample_rate": SAMPLE_RATE,
        "voices": VOICES,
        "wrong_texts": list(WRONG_TEXTS),
        "clips": {},
    }
    for name, text, voice, rate in plan():
        write_wav(args.out / name, synthesise(text, VOICES[voice], rate))
        manifest["clips"][name] = {"text": text, "voice": voice, "rate": rate}
    (args.out / "clips.json").write_text(json.dumps(manifest, indent=1) + "\n")
    words = sorted({word for text in TEXTS + WRONG_TEXTS for word in text.split()})
    (args.out / "vocabulary.txt").write_text("\n".join(words) + "\n")
    total = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {len(manifest['clips'])} clips to {args.out} ({total / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
