"""``flowgrpo.losses`` is now ``flowgrpo.rl.losses``."""

from flowgrpo import _alias

_alias(__name__)
