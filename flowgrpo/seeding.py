"""Every random stream of the project, drawn from the run's seed (docs/design.md, "Randomness").

A stream is declared once, in :data:`STREAMS`: its name, the parts it is keyed by and how its
key derives from them. Code draws through the name, never through a formula of its own::

    gen = seeding.generator("rollout_noise", cfg.run.seed, epoch, sample, device=device)
    rng = seeding.python_random("flash_step", seed, iteration, group)

The promise "the same run on any number of processes" rests on the parts: they are global
identities (epoch, global sample index, prompt group), never a position in one process's batch.
Only ``process`` is keyed by the rank, and nothing of a run's math draws from it.

A key is an integer (a torch or ``random`` seed) or a string (a ``random.Random`` seed, which
``random`` hashes with SHA-512, so it does not depend on ``PYTHONHASHSEED``). Every key keeps the
exact value the stream had before it was declared here: changing one changes recorded runs.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

import torch


def hash_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (seed, epoch, rank, stream)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p + 0x9E3779B9)) * 1099511628211) % (1 << 63)
    return h


EVAL_SEED = 2**31 - 1
"""The base of the evaluation images' seeds: fixed, not the run's seed, so every run of a config
(any seed) evaluates on the same noise and their eval rewards compare."""


@dataclass(frozen=True)
class Stream:
    """One named random stream.

    Args:
        name: how code asks for it.
        parts: the names of the values it is keyed by, in order.
        key: ``parts -> int | str``, the seed of its generator.
        use: what draws from it.
    """

    name: str
    parts: tuple[str, ...]
    key: Callable[..., int | str]
    use: str


def _declare(*streams: Stream) -> dict[str, Stream]:
    """``{name: stream}``; a name declared twice is refused, so no two streams can share one."""
    table: dict[str, Stream] = {}
    for stream in streams:
        if stream.name in table:
            raise ValueError(f"random stream {stream.name!r} is declared twice")
        table[stream.name] = stream
    return table


STREAMS: dict[str, Stream] = _declare(
    # run seed streams of the training loop (hash_seed's last part tells them apart)
    Stream("prompt_groups", ("seed", "epoch"), lambda seed, epoch: hash_seed(seed, epoch),
           "the epoch's prompt groups, drawn alike on every process"),
    Stream("rollout_noise", ("seed", "epoch", "sample"),
           lambda seed, epoch, sample: hash_seed(seed, epoch, sample, 1),
           "a sample's initial noise and its sampler's step noise, by global sample index"),
    Stream("minibatch_order", ("seed", "epoch"), lambda seed, epoch: hash_seed(seed, epoch, 2),
           "the order minibatches are cut from the epoch's global batch"),
    Stream("objective_draws", ("seed", "iteration", "sample"),
           lambda seed, iteration, sample: hash_seed(seed, iteration, sample, 3),
           "a likelihood-free objective's timesteps and noise, per global sample index"),
    Stream("kl_steps", ("seed", "iteration"),
           lambda seed, iteration: hash_seed(seed, iteration, 8),
           "the trained steps whose KL term the ratio objective estimates (kl_steps > 0)"),
    Stream("preference_pairs", ("seed", "iteration"),
           lambda seed, iteration: hash_seed(seed, iteration, 9),
           "the preference-file pairs the offline dpo objective trains in an iteration"),
    Stream("pruning", ("seed", "epoch"), lambda seed, epoch: hash_seed(seed, epoch, 4),
           "the pruner's coins over the epoch's gathered batch"),
    Stream("posterior_draws", ("seed", "iteration", "sample"),
           lambda seed, iteration, sample: hash_seed(seed, iteration, sample, 6),
           "dflow_grpo's Monte-Carlo posterior draws of a sample's trained steps"),
    Stream("forward_states", ("seed", "iteration", "sample"),
           lambda seed, iteration, sample: hash_seed(seed, iteration, sample, 7),
           "udm_grpo's states rebuilt from a sample's final tokens"),
    Stream("process", ("seed", "rank"), lambda seed, rank: seed + rank,
           "the process-global generators (python, numpy, torch) seeded at start"),
    # step selection and samplers
    Stream("flash_step", ("seed", "iteration", "group"),
           lambda seed, iteration, group: f"flowgrpo-flash:{seed}:{iteration}:{group}",
           "the step a prompt group trains under the flash step selection"),
    Stream("window_start", ("seed", "iteration"),
           lambda seed, iteration: f"flowgrpo-window:{seed}:{iteration}",
           "where the random strategy of a MixGRPO window starts"),
    # enhanced views
    Stream("views", ("seed", "iteration"), lambda seed, iteration: seed * 1_000_003 + iteration,
           "the seed an enhancer receives for one iteration's views"),
    Stream("enhancer_shuffle", ("seed", "prompt"), lambda seed, prompt: f"{seed}\x00{prompt}",
           "the synonym enhancer's shuffle of a prompt's captions (seed: the views seed)"),
    # rewards
    Stream("mix_draw", ("seed", "iteration", "sample"),
           lambda seed, iteration, sample: f"{seed}/{iteration}/{sample}",
           "which part of a reward mix (mix_mode sample) scores a training sample"),
    Stream("mix_eval_draw", ("seed", "group", "position"),
           lambda seed, group, position: f"{seed}/eval/{group}/{position}",
           "which part of a reward mix scores a sample without a training identity"),
    # evaluation, sampling and data
    Stream("eval_noise", ("image",), lambda image: EVAL_SEED + image,
           "the initial noise of evaluation image number ``image`` (not the run's seed)"),
    Stream("sample_noise", ("seed", "image"), lambda seed, image: seed + image,
           "the initial noise of image number ``image`` of ``flowgrpo sample --seed``"),
    Stream("image_steps", ("noise_seed",), lambda noise_seed: hash_seed(noise_seed, 5),
           "the step draws of a discrete model's image with initial-noise seed ``noise_seed`` "
           "(evaluation and ``flowgrpo sample``)"),
    Stream("tts_hard_prompts", ("seed",), lambda seed: seed,
           "the built-in hard TTS prompt set's choices"),
)


def key(name: str, *parts: int | str) -> int | str:
    """The key of stream ``name`` at ``parts`` (see :data:`STREAMS` for each one's parts)."""
    stream = STREAMS.get(name)
    if stream is None:
        raise KeyError(f"unknown random stream {name!r}; declared: {', '.join(STREAMS)}")
    if len(parts) != len(stream.parts):
        raise TypeError(f"random stream {name!r} is keyed by ({', '.join(stream.parts)}), "
                        f"got {len(parts)} part(s)")
    return stream.key(*parts)


def stream_seed(name: str, *parts: int) -> int:
    """The integer seed of stream ``name`` at ``parts`` (a stream with an integer key)."""
    value = key(name, *parts)
    if not isinstance(value, int):
        raise TypeError(f"random stream {name!r} has a string key; draw it with python_random")
    return value


def generator(name: str, *parts: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh ``torch.Generator`` on ``device`` seeded from stream ``name`` at ``parts``."""
    return torch.Generator(device).manual_seed(stream_seed(name, *parts))


def python_random(name: str, *parts: int | str) -> random.Random:
    """A fresh ``random.Random`` seeded from stream ``name`` at ``parts``."""
    return random.Random(key(name, *parts))


def uniform(name: str, *parts: int | str) -> float:
    """One number in ``[0, 1)`` from stream ``name`` at ``parts``: the first 8 bytes of the
    key's BLAKE2b digest, so a single draw needs no generator state."""
    digest = hashlib.blake2b(str(key(name, *parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2.0**64
