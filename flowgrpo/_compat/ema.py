"""``flowgrpo.ema`` is now ``flowgrpo.rl.ema``."""

from flowgrpo import _alias

_alias(__name__)
