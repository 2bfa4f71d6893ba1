"""``flowgrpo.rewards`` is now ``flowgrpo.training.reward_runner``."""

from flowgrpo import _alias

_alias(__name__)
