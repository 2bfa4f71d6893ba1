"""Objectives: what an update optimises (registry ``OBJECTIVES``). ``base`` holds the interface, the
``Policy`` an objective sees and the per-step ratio objective; ``likelihood_free`` the ELBO, NFT and
AWM objectives; ``preference`` DGPO, DPO and SFT; ``discrete`` dFlowGRPO's objective for
token models.
"""

from flowgrpo.rl.objectives import (  # noqa: F401  (registers them)
    discrete,
    likelihood_free,
    preference,
)
from flowgrpo.rl.objectives.base import (  # noqa: F401  (the public names)
    OBJECTIVES,
    Objective,
    Policy,
    RatioObjective,
    add_kl,
    build,
    fill,
)
