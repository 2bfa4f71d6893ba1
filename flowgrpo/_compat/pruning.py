"""``flowgrpo.pruning`` is now ``flowgrpo.rl.pruning``."""

from flowgrpo import _alias

_alias(__name__)
