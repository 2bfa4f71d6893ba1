"""``flowgrpo.advantages`` is now ``flowgrpo.rl.advantages``."""

from flowgrpo import _alias

_alias(__name__)
