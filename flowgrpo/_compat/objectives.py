"""``flowgrpo.objectives`` is now ``flowgrpo.rl.objectives``."""

from flowgrpo import _alias

_alias(__name__)
