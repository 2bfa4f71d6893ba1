"""Prompt sets and the per-epoch prompt sampler.

A prompt set is a list of ``(prompt, metadata)``: built-in by name (``digits``;
``digits_video``, the video toy's 40 captions; ``tts_hard``,
see :mod:`flowgrpo.data.tts_prompts`) or read from a
``.txt`` file (one prompt per line) or a ``.jsonl`` file (``{"prompt": ..., <metadata>}`` per
line; the metadata reaches the reward, e.g. ``"text"`` for OCR or ``"boxes"`` for regions).
File values (:data:`PATH_KEYS`: an edit's source ``"image"`` and ``"mask"``, a speech reward's
``"speaker_wav"`` / ``"reference_wav"``) are paths relative to the ``.jsonl`` file (or absolute);
they are resolved to absolute paths and must exist.
The config checks ``data.prompts`` and ``data.eval_prompts`` with :func:`load_prompts` at load
time, so a missing, empty or malformed file fails before any model loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from flowgrpo.data.files import read_utf8, shipped_file
from flowgrpo.data.tts_prompts import hard_prompts
from flowgrpo.errors import ConfigError
from pipelines.toy import VIDEO_DIRECTIONS, digit_prompt, digit_video_prompt

Prompt = tuple[str, dict]
PATH_KEYS = ("image", "mask", "speaker_wav", "reference_wav")
"""Metadata keys whose values are files, relative to the prompt set's ``.jsonl`` file."""


BUILTIN = {
    "digits": lambda: [(digit_prompt(d), {"digit": d}) for d in range(10)],
    # the video toy: every digit in every direction ("a handwritten digit 7 moving left")
    "digits_video": lambda: [(digit_video_prompt(d, n), {"digit": d, "direction": n})
                             for n in VIDEO_DIRECTIONS for d in range(10)],
    # hard texts for speech models (numbers, dates, rare words, tongue twisters, long
    # sentences); metadata "text" is the spoken form an ASR reward compares against
    "tts_hard": lambda: hard_prompts(100, seed=0),
}


def load_prompts(spec: str, key: str = "prompt set") -> list[Prompt]:
    """Resolve a prompt-set spec (built-in name or file path) to ``[(prompt, metadata)]``.

    A missing, unreadable, non-UTF-8 or empty file, or a ``.jsonl`` line that is not a JSON object
    with a string ``"prompt"``, raises :class:`~flowgrpo.errors.ConfigError` whose message starts
    with ``key`` (the config key, e.g. ``data.prompts``) and names the file (and line).
    """
    if spec in BUILTIN:
        return BUILTIN[spec]()
    path = shipped_file(spec)  # configs/prompts/...: the shipped examples, from any folder
    if path.is_dir():
        raise ConfigError(f"{key}: {path} is a folder; give a .txt or .jsonl file")
    if not path.is_file():
        raise ConfigError(f"{key}: prompt set {spec!r} is neither a built-in "
                          f"({', '.join(BUILTIN)}) nor a file")
    lines = read_utf8(path, key).splitlines()
    if path.suffix == ".jsonl":
        items = [_jsonl_prompt(line, f"{key}: {path}:{n}", path.parent)
                 for n, line in enumerate(lines, 1) if line.strip()]
    else:
        items = [(line.strip(), {}) for line in lines if line.strip()]
    if not items:
        raise ConfigError(f"{key}: {path} has no prompts (empty or blank lines only)")
    return items


def _jsonl_prompt(line: str, where: str, folder: Path | None = None) -> Prompt:
    """One ``.jsonl`` line as ``(prompt, metadata)``, its :data:`PATH_KEYS` resolved against
    ``folder``; ``where`` (``key: file:line``) starts the message of the
    :class:`~flowgrpo.errors.ConfigError` a bad line raises."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(record, dict):
        raise ConfigError(f"{where}: expected a JSON object with a 'prompt', got "
                          f"{type(record).__name__}")
    if "prompt" not in record:
        raise ConfigError(f"{where}: every JSON line needs a 'prompt' (this one has: "
                          f"{', '.join(record) or 'no keys'})")
    prompt = record.pop("prompt")
    if not isinstance(prompt, str):
        raise ConfigError(f"{where}: 'prompt' must be a string, got {type(prompt).__name__}")
    for name in PATH_KEYS:
        if name not in record:
            continue
        value = record[name]
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{where}: {name!r} must be a file path (a string), got {value!r}")
        file = Path(value).expanduser()
        if not file.is_absolute() and folder is not None:
            file = folder / file
        if not file.is_file():
            raise ConfigError(f"{where}: {name!r} file {value!r} not found (looked for "
                              f"{file}; relative paths start at the .jsonl file's folder)")
        record[name] = str(file.resolve())
    return prompt, record


def sample_groups(
    prompts: list[Prompt], num_groups: int, group_size: int, generator: torch.Generator
) -> tuple[list[str], list[dict], torch.Tensor]:
    """Draw ``num_groups`` prompts (without replacement while the set lasts), each repeated
    ``group_size`` times.

    Returns:
        prompts ``[G*K]``, metadata ``[G*K]`` (copies, with ``"group"`` set), group ids ``[G*K]``
        (0..G-1; the trainer draws the groups of all processes at once and each takes its
        share, so the ids are global).
    """
    order = torch.cat([
        torch.randperm(len(prompts), generator=generator)
        for _ in range(-(-num_groups // len(prompts)))
    ])[:num_groups]
    texts, metas, groups = [], [], []
    for g, i in enumerate(order.tolist()):
        text, meta = prompts[i]
        for _ in range(group_size):
            texts.append(text)
            metas.append({**meta, "group": g})
            groups.append(g)
    return texts, metas, torch.tensor(groups, dtype=torch.long)
