"""``flowgrpo.rollout`` is now ``flowgrpo.rl.rollout``."""

from flowgrpo import _alias

_alias(__name__)
