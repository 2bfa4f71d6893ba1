"""Prompt sets and the per-epoch prompt sampler.

A prompt set is a list of ``(prompt, metadata)``: built-in by name (``digits``) or read from a
``.txt`` file (one prompt per line) or a ``.jsonl`` file (``{"prompt": ..., <metadata>}`` per
line; the metadata reaches the reward, e.g. ``"text"`` for OCR or ``"boxes"`` for regions).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from pipelines.toy import digit_prompt

Prompt = tuple[str, dict]
REPO_ROOT = Path(__file__).resolve().parent.parent


BUILTIN = {
    "digits": lambda: [(digit_prompt(d), {"digit": d}) for d in range(10)],
}


def load_prompts(spec: str) -> list[Prompt]:
    """Resolve a prompt-set spec (built-in name or file path) to ``[(prompt, metadata)]``."""
    if spec in BUILTIN:
        return BUILTIN[spec]()
    path = Path(spec)
    if not path.is_file() and not path.is_absolute() and (REPO_ROOT / path).is_file():
        path = REPO_ROOT / path  # the shipped example prompt sets, from any working directory
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt set {spec!r} is neither a built-in ({', '.join(BUILTIN)}) nor a file"
        )
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        items = []
        for n, line in enumerate(lines, 1):
            record = json.loads(line)
            if "prompt" not in record:
                raise ValueError(f"{path}:{n}: every JSON line needs a 'prompt'")
            items.append((record.pop("prompt"), record))
        return items
    return [(line.strip(), {}) for line in lines]


def sample_groups(
    prompts: list[Prompt], num_groups: int, group_size: int, generator: torch.Generator
) -> tuple[list[str], list[dict], torch.Tensor]:
    """Draw ``num_groups`` prompts (without replacement while the set lasts), each repeated
    ``group_size`` times.

    Returns:
        prompts ``[G*K]``, metadata ``[G*K]`` (copies, with ``"group"`` set), group ids ``[G*K]``
        (local, 0..G-1; the trainer offsets them per process).
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
