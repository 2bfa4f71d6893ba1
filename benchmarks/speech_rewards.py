"""Speech rewards on the committed espeak-ng clips: does each score separate the right reference
from a wrong one, and how long does it take per clip?

    python benchmarks/speech_rewards.py [--repeats R] [--workers W]

Clips: ``tests/assets/speech`` (``scripts/make_speech_clips.py``): six texts in voice a (espeak-ng
``en-us``), four of them in voice b (``en-us+f3``), the first text at two more speaking rates.

- ``wer`` / ``cer``, with the clips' vocabulary (free-order grammar) and with pocketsphinx's
  general language model: mean score against the spoken text vs an unspoken text;
- ``speaker_sim``: mean cosine to a reference of the same voice (another text) vs of the other
  voice; references ``t0_a`` / ``t0_b``, scored clips every other voice-a / voice-b clip;
- ``mcd``: MCD in dB against ``t0_a`` for the same text at other rates vs for other texts.

Time per clip: the median over ``R`` scoring passes over the whole batch, after a warm-up call
(reference features are cached after the first pass, as in training).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import reward_models
import reward_models.speech as speech
from reward_models import Media

ASSETS = Path(__file__).resolve().parents[1] / "tests" / "assets" / "speech"
MANIFEST = json.loads((ASSETS / "clips.json").read_text())
CLIPS = MANIFEST["clips"]


def batch(names: list[str]) -> Media:
    clips = [speech.read_wav(ASSETS / name)[0] for name in names]
    size = max(len(c) for c in clips)
    data = torch.stack([torch.nn.functional.pad(c, (0, size - len(c))) for c in clips])
    return Media("audio", data[:, None], sample_rate=MANIFEST["sample_rate"])


def timed(reward, media: Media, prompts: list[str], metadata: list[dict], repeats: int
          ) -> tuple[torch.Tensor, float]:
    """Scores and the median seconds per clip over ``repeats`` calls (one warm-up call first)."""
    reward(media.index([0]), prompts[:1], metadata[:1])
    times, scores = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        scores = reward(media, prompts, metadata).scores
        times.append((time.perf_counter() - start) / len(media))
    return scores, statistics.median(times)


def row(name: str, setting: str, good: torch.Tensor, bad: torch.Tensor, seconds: float,
        labels: tuple[str, str]) -> None:
    print(f"{name:<12}{setting:<22}{labels[0]} {good.mean():7.3f}   {labels[1]} {bad.mean():7.3f}"
          f"   {1000 * seconds:8.1f} ms/clip")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="timed passes over each batch")
    parser.add_argument("--workers", type=int, default=2, help="decoding threads (extra wer row)")
    args = parser.parse_args()
    torch.set_num_threads(1)

    names = [n for n, c in CLIPS.items() if c["rate"] == 160]  # both voices, normal rate
    media, none = batch(names), [{} for _ in names]
    right = [CLIPS[n]["text"] for n in names]
    unspoken = MANIFEST["wrong_texts"]
    wrong = [unspoken[i % len(unspoken)] for i in range(len(names))]
    print(f"{len(names)} clips, {media.data.shape[-1] / 16000:.2f} s each (padded); "
          f"median of {args.repeats} passes per timing; torch threads 1")
    settings = [("wer", {"vocabulary": ASSETS / "vocabulary.txt"}, "vocabulary"),
                ("wer", {"vocabulary": ASSETS / "vocabulary.txt", "workers": args.workers},
                 f"vocabulary, {args.workers} workers"),
                ("wer", {}, "language model"),
                ("cer", {"vocabulary": ASSETS / "vocabulary.txt"}, "vocabulary"),
                ("cer", {}, "language model")]
    for name, params, label in settings:
        reward = reward_models.build(name, **params)
        good, seconds = timed(reward, media, right, none, args.repeats)
        bad = reward(media, wrong, none).scores
        row(name, label, good, bad, seconds, ("right", "wrong"))

    reward = reward_models.get("speaker_sim", device="cpu")
    a = [n for n in names if CLIPS[n]["voice"] == "a" and n != "t0_a.wav"]
    b = [n for n in names if CLIPS[n]["voice"] == "b" and n != "t0_b.wav"]
    clips = batch(a + b)
    ref_a = [{"speaker_wav": str(ASSETS / "t0_a.wav")}] * len(a + b)
    ref_b = [{"speaker_wav": str(ASSETS / "t0_b.wav")}] * len(a + b)
    to_a, seconds = timed(reward, clips, [""] * len(a + b), ref_a, args.repeats)
    to_b = reward(clips, [""] * len(a + b), ref_b).scores
    same = torch.cat([to_a[: len(a)], to_b[len(a) :]])
    other = torch.cat([to_b[: len(a)], to_a[len(a) :]])
    row("speaker_sim", "resemblyzer weights", same, other, seconds, ("same ", "other"))

    reward = reward_models.get("mcd", reference_wav=str(ASSETS / "t0_a.wav"))
    rates = [n for n in CLIPS if n.startswith("t0_a_r")]
    texts = [n for n in names if CLIPS[n]["voice"] == "a" and n != "t0_a.wav"]
    clips = batch(rates + texts)
    mcd, seconds = timed(reward, clips, [""] * len(clips), [{}] * len(clips), args.repeats)
    row("mcd (dB)", "vs t0_a", -mcd[: len(rates)], -mcd[len(rates) :], seconds,
        ("rate ", "text "))
    print("mcd rows: 'rate' = same text at other speaking rates, 'text' = other texts "
          "(lower is closer)")


if __name__ == "__main__":
    main()
