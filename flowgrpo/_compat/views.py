"""``flowgrpo.views`` is now ``flowgrpo.rl.views``."""

from flowgrpo import _alias

_alias(__name__)
