"""Policy losses: pure tensor functions ``(logp, logp_old, adv, ...) -> (loss, metrics)`` (registry
``LOSSES``). ``base`` holds the registry and clip/sapo/stable/guard; ``variants`` the others.
"""

from flowgrpo.rl.losses import variants  # noqa: F401  (registers its pieces)
from flowgrpo.rl.losses.base import (  # noqa: F401  (the public names)
    LOSSES,
    LossFn,
    clip_loss,
    get,
    guard_loss,
    sapo_loss,
    stable_loss,
)
