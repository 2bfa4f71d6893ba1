"""Every random stream of the project, drawn from the run's seed (docs/design.md, "Randomness")."""

from __future__ import annotations


def hash_seed(*parts: int) -> int:
    """A stable 63-bit seed from integers (seed, epoch, rank, stream)."""
    h = 1469598103934665603
    for p in parts:
        h = ((h ^ (p + 0x9E3779B9)) * 1099511628211) % (1 << 63)
    return h
