"""``flowgrpo.grpo`` is now ``flowgrpo.rl.replay``."""

from flowgrpo import _alias

_alias(__name__)
