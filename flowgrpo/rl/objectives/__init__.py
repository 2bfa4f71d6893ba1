"""Objectives: what an update optimises (registry ``OBJECTIVES``). ``base`` holds the interface, the
``Policy`` an objective sees and the per-step ratio objective; ``likelihood_free`` the ELBO, NFT and
AWM objectives; ``discrete`` dFlowGRPO's objective for token models.
"""

from flowgrpo.rl.objectives import discrete, likelihood_free  # noqa: F401  (registers them)
from flowgrpo.rl.objectives.base import (  # noqa: F401  (the public names)
    OBJECTIVES,
    Objective,
    Policy,
    RatioObjective,
    add_kl,
    build,
    fill,
)
