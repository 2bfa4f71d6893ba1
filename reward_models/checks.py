"""Checks on what a reward returns, so that a broken score stops at the reward that made it.

:func:`check_output` refuses an output with the wrong number of scores, or with NaN/inf in its
scores, components or regions, by raising :class:`RewardFault`: one line that names the reward,
and (for non-finite values) the mask of the samples that cannot be used.
"""

from __future__ import annotations

import torch

from flowgrpo.errors import FlowgrpoError

from .base import RewardOutput


class RewardFault(FlowgrpoError):
    """A reward failed or returned scores that cannot be used.

    Args:
        reward: the reward's name as the message gives it (``"ocr"``,
            ``"remote reward http://127.0.0.1:8000/score"``).
        message: what went wrong, one line (line breaks are turned into spaces).
        bad: ``[B]`` bool mask of the samples whose score is unusable (NaN/inf), or ``None``
            when the whole output is unusable (wrong size, no answer, ...).
    """

    def __init__(self, reward: str, message: str, bad: torch.Tensor | None = None) -> None:
        message = " ".join(message.splitlines())
        super().__init__(message)
        self.reward, self.message, self.bad = reward, message, bad


def _check_size(name: str, where: str, value: object, n: int) -> None:
    """Refuse anything but an ``[n]`` tensor of scores (``where`` ends the message)."""
    if not isinstance(value, torch.Tensor):
        raise RewardFault(name, f"{name} returned scores of type {type(value).__name__}, not a "
                                f"tensor{where}")
    if value.dim() != 1:
        raise RewardFault(name, f"{name} returned scores of shape {list(value.shape)} for {n} "
                                f"samples{where}")
    if value.shape[0] != n:
        raise RewardFault(name, f"{name} returned {value.shape[0]} scores for {n} samples{where}")


def check_output(name: str, out: RewardOutput, n: int, *, finite: bool = True) -> RewardOutput:
    """Return ``out`` when it holds ``n`` usable scores, else raise :class:`RewardFault`.

    Checked: ``scores`` is a ``[n]`` tensor, every component is ``[n]`` and ``regions`` is
    ``[n, ...]``, and (unless ``finite=False``: sizes only) none of them holds NaN or inf. A
    sample counts once: as NaN when any of its values is NaN, else as inf when any is infinite;
    ``bad`` marks both (on the CPU).

    Messages: ``<name> returned 15 scores for 16 samples``, ``<name> returned 3 NaN of 64``,
    ``<name> returned 2 inf of 64``, ``<name> returned 3 NaN and 1 inf of 64``; the non-finite
    ones end with `` (in 'key', regions)`` when components or regions hold some of those values.
    """
    scores = out.scores
    _check_size(name, "", scores, n)
    parts: dict[str, torch.Tensor] = {}
    for key, value in (out.components or {}).items():
        _check_size(name, f" in component {key!r}", value, n)
        parts[repr(key)] = value
    if out.regions is not None:
        regions = out.regions
        if not isinstance(regions, torch.Tensor) or regions.dim() == 0 or regions.shape[0] != n:
            shape = (list(regions.shape) if isinstance(regions, torch.Tensor)
                     else type(regions).__name__)
            raise RewardFault(name, f"{name} returned regions of shape {shape} for {n} samples")
        parts["regions"] = regions
    if n == 0 or not finite:
        return out

    nan = torch.isnan(scores).cpu()
    inf = torch.isinf(scores).cpu()
    where = []
    for label, value in parts.items():
        flat = value.detach().reshape(n, -1)
        part_nan, part_inf = torch.isnan(flat).any(1).cpu(), torch.isinf(flat).any(1).cpu()
        if (part_nan | part_inf).any():
            where.append(label)
        nan, inf = nan | part_nan, inf | part_inf
    inf = inf & ~nan
    bad = nan | inf
    if not bad.any():
        return out
    counts = [f"{int(c.sum())} {word}" for c, word in ((nan, "NaN"), (inf, "inf")) if c.any()]
    suffix = f" (in {', '.join(where)})" if where else ""
    raise RewardFault(name, f"{name} returned {' and '.join(counts)} of {n}{suffix}", bad=bad)
